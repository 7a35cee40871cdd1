"""`mlxcel generate --profile P` for every shipped profile: the server's path from the profile to
the row, so for one request its text, events and summary line are a server's for that request."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from app.cli import main
from app.loading.paths import REPO_ROOT
from app.profiles.loader import profile_path, shipped_profiles
from app.runtime.logging import configure_logging
from tests.support.server import API_KEY, serve

PROMPT = "def quicksort(items):\n"
TOKENS = 24
BODY = {"prompt": PROMPT, "n_predict": TOKENS, "temperature": 0, "seed": 3}
# A lone row's widths are the tick's choice under load and the block loops' controller, both timed:
# with them off, the rounds are a function of the request alone, on the server as in the CLI.
FIXED_WIDTHS = {"MLXCEL_ADAPTIVE__UNDER_LOAD": "false", "MLXCEL_ADAPTIVE__ENABLED": "false"}
# The server runs every profile in turn from one file, reloaded: its name and path are the file's.
NAMED = {"profile", "profile_file"}
PROBED = "model_calls_tools"  # the server's load probes the model with tools; `mlxcel generate` never does
SUMMARY = re.compile(r"^\[Speculative acceptance\] rule=(\S+) rounds=(\d+) proposed=(\d+) positions_tested=(\d+) "
                     r"accepted=(\d+) ", re.MULTILINE)  # fmt: skip


def write_live(tmp_path: Path, profile: str) -> Path:
    """The shipped profile's text in the file the server serves, its model paths made absolute."""
    path = tmp_path / "live.toml"
    path.write_text(profile_path(profile).read_text().replace('"../models/', f'"{REPO_ROOT}/models/'))
    return path


def generated(profile: str, capsys: pytest.CaptureFixture[str]) -> tuple[str, list[dict]]:
    """The CLI's stdout and its events, run in this process."""
    args = ["--profile", profile, "-p", PROMPT, "-n", str(TOKENS), "--temp", "0", "--seed", "3", "--no-chat-template"]
    try:
        assert main(["generate", *args]) == 0
    finally:
        configure_logging(None)  # its handler writes to this capture
    captured = capsys.readouterr()
    return captured.out, [json.loads(line) for line in captured.err.splitlines() if line.startswith("{")]


def row_events(events: list[dict]) -> list[tuple[str, dict]]:
    """Each event as the server names it, with its keys but the request's (the CLI's row has
    none), the profile's name and the times."""
    named = {"speculative_decode_finished": "speculative_request"}
    apart = {"event", "request_id", "route", "timestamp", "seconds", *NAMED}
    return [(named.get(e["event"], e["event"]), {k: v for k, v in e.items() if k not in apart}) for e in events]


@pytest.mark.slow
def test_every_shipped_profile_generates_what_its_server_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in {**FIXED_WIDTHS, "MLXCEL_LOG": "info"}.items():
        monkeypatch.setenv(key, value)
    profiles = shipped_profiles()
    env = {**FIXED_WIDTHS, "MLXCEL_SERVER__ADMIN_RELOAD": "true"}
    live = write_live(tmp_path, profiles[0])
    with serve(tmp_path, "--profile", str(live), "--api-key", API_KEY, env=env) as server:
        http = server.client(headers={"Authorization": f"Bearer {API_KEY}"})
        for profile in profiles:
            seen = len(server.events()) if profile != profiles[0] else 0  # the events since it began serving this one
            if seen:  # a reload's engine loads a block drafter and probes before it serves
                write_live(tmp_path, profile)
                assert http.post("/admin/reload").status_code == 200
            response = http.post("/completion", json=BODY)
            server.wait_for_event("http_request", response.headers["x-request-id"])
            served = server.events()[seen:]
            out, events = generated(profile, capsys)

            assert out.startswith(response.json()["content"] + "\n"), profile
            (startup,) = [e for e in served if e["event"] == "acceptance_rule_active"]
            (cli_startup,) = [e for e in events if e["event"] == "acceptance_rule_active"]
            assert (cli_startup["profile"], cli_startup["host"], cli_startup["port"]) == (profile, None, None)
            assert cli_startup[PROBED] is None  # no probe row decoded before the one request
            same = set(startup) - {"host", "port", "timestamp", PROBED, *NAMED}
            assert {k: cli_startup[k] for k in same} == {k: startup[k] for k in same}, profile
            # the server's for the row: those naming a request (a reload's engine names none), but the access line
            row = [e for e in served if "request_id" in e and e["event"] != "http_request"]
            cli_row = [e for e in events if e["event"] not in ("drafter_kind_resolved", "acceptance_rule_active")]
            assert row_events(cli_row) == row_events(row), profile
            summary = SUMMARY.search(out)
            speculated = [e for e in events if e["event"] == "speculative_decode_finished"]
            if profile == "target-only":
                assert summary is None and speculated == []
                continue
            counts = [str(speculated[0][k]) for k in ("rule", "rounds", "proposed", "positions_tested", "accepted")]
            assert summary is not None and list(summary.groups()) == counts, profile
