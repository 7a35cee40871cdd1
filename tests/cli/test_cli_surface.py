"""The command line an operator meets: --version, help on every flag, a closed pipe, the masked
API key, what `-m DIR` serves (a named profile's drafter, or none), where a listen error came
from, and bench writing only on request."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from app import __version__
from app.cli import build_parser, main
from app.loading import EMBEDDED_DRAFTER, EMBEDDED_TARGET
from app.profiles import ProfileError, add_profile_flags, resolve, settings_from_args
from tests.support.cli import mlxcel, write
from tests.support.server import clean_env


def test_version() -> None:
    result = mlxcel("--version")
    assert (result.returncode, result.stdout.strip()) == (0, f"mlxcel {__version__}")


def every_parser(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += every_parser(sub)
    return found


def test_every_flag_and_argument_has_help() -> None:
    missing = [
        f"{parser.prog} {action.dest}"
        for parser in every_parser(build_parser())
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction) and not action.help
    ]
    assert missing == []


def test_a_reader_that_leaves_early_gets_no_traceback() -> None:
    """`mlxcel profiles show | head -1`: the pipe is closed before mlxcel writes."""
    read, written = os.pipe()
    os.close(read)
    process = subprocess.run(
        [sys.executable, "-m", "app", "profiles", "show", "default"],
        stdout=written,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    os.close(written)
    assert process.stderr == "" and process.returncode == 141


def test_profiles_show_masks_the_api_key(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("MLXCEL_SERVER__API_KEY", "s3cret-key")
    monkeypatch.setenv("MLXCEL_SERVER__API_KEYS", '["other-key", "third-key"]')
    assert main(["profiles", "show", "target-only"]) == 0
    shown = capsys.readouterr().out
    assert "s3cret-key" not in shown and "other-key" not in shown and "third-key" not in shown
    assert "server.api_key" in shown and '"********"    # env' in shown
    assert '["********","********"]    # env' in shown


def serve_args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False)  # as serve's own
    add_profile_flags(parser)
    return parser.parse_args(list(flags))


def test_a_model_flag_alone_serves_no_drafter(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """With no profile named, the default profile's drafter belongs to its own target: `-m DIR`
    names another, so the drafter is not kept (and `--draft-kind none` warns about no path it
    never gave)."""
    monkeypatch.delenv("MLXCEL_PROFILE", raising=False)
    target = str(EMBEDDED_TARGET)
    named = ("--profile", "default")
    for flags in (("-m", target), ("-m", target, "--draft-kind", "none"), (*named, "--draft-kind", "none")):
        drafter = settings_from_args(serve_args(*flags)).drafter
        assert (drafter.kind, drafter.model) == ("none", None), flags
    drafter = settings_from_args(serve_args("-m", target, "--draft-model", str(EMBEDDED_DRAFTER))).drafter
    assert (drafter.kind, drafter.model) == ("draft-model", str(EMBEDDED_DRAFTER))
    assert "warning" not in capsys.readouterr().err


def test_a_named_profile_keeps_its_drafter_on_another_target(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--profile default -m DIR` (or MLXCEL_PROFILE) asked for the profile's drafter too (issue 46:
    dropping it made the bench's drafting arms measure target-only); a drafter flag still wins."""
    monkeypatch.delenv("MLXCEL_PROFILE", raising=False)
    target = str(EMBEDDED_TARGET)
    drafter = settings_from_args(serve_args("--profile", "default", "-m", target)).drafter
    assert (drafter.kind, drafter.model) == ("draft-model", str(EMBEDDED_DRAFTER))
    monkeypatch.setenv("MLXCEL_PROFILE", "mtp")
    drafter = settings_from_args(serve_args("-m", target)).drafter
    assert (drafter.kind, Path(drafter.model).name) == ("mtp", "mtp")
    drafter = settings_from_args(serve_args("-m", target, "--draft-kind", "none")).drafter
    assert (drafter.kind, drafter.model) == ("none", None)


def test_admin_reload_needs_the_server_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tenants' keys alone do not turn the route on: none of them may call it."""
    for tenants in ("", 'api_keys = ["t"]\n'):
        profile = write(tmp_path, "p", f'target = "@TARGET@"\n[server]\nadmin_reload = true\n{tenants}')
        with pytest.raises(ProfileError, match=rf"^{profile}: server.admin_reload: needs server.api_key \("):
            resolve(str(profile))
    monkeypatch.setenv("MLXCEL_SERVER__API_KEY", "k")
    assert resolve(str(profile)).settings.server.admin_reload


def test_a_port_in_use_is_reported_against_the_variable_that_set_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = mlxcel("serve", "--profile", "target-only", env={"MLXCEL_SERVER__PORT": str(port)})
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: environment: MLXCEL_SERVER__PORT: port {port} on 127.0.0.1 is already")


def test_bench_writes_docs_only_when_told() -> None:
    bench = next(p for p in every_parser(build_parser()) if p.prog.endswith(" bench"))
    assert bench.parse_args([]).write is False and bench.parse_args(["--write"]).write is True
