"""Hot profile reload on one real server: POST /admin/reload and SIGHUP swap engines while
requests run, and a bad or restart-only profile change is refused with the old engine serving."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from app.engine.reload import restart_only_changes
from app.profiles.schema import Settings, TargetSettings
from tests.support.cli import write
from tests.support.server import API_KEY, RunningServer, serve

TARGET_ONLY = 'target = "@TARGET@"\n[drafter]\nkind = "none"\n'
DRAFT_MODEL = 'target = "@TARGET@"\n[drafter]\nkind = "draft-model"\nmodel = "@DRAFTER@"\n'
ADMIN = "[server]\nadmin_reload = true\n"
BODY = {"prompt": "def add(a, b):\n", "n_predict": 12, "temperature": 0, "ignore_eos": True}


class Traffic:
    """Clients sending completions back to back until stopped; every answer and its drafting kept."""

    def __init__(self, server: RunningServer, clients: int = 3) -> None:
        self.server, self.answers, self.failures = server, [], []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,)) for i in range(clients)]
        for thread in self._threads:
            thread.start()

    def _client(self, index: int) -> None:
        with self.server.client(headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            while not self._stop.is_set():
                try:
                    response = http.post("/completion", json=BODY | {"stream": index == 0})
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                    continue
                if response.status_code != 200:
                    self.failures.append(f"{response.status_code} {response.text}")
                else:
                    self.answers.append('"draft_n"' in response.text)

    def wait_for(self, answers: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.answers) + len(self.failures) < answers:
            assert time.monotonic() < deadline, "the clients stopped getting answers"
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)


def drafter_kind(http: httpx.Client) -> str:
    return http.get("/props").json()["mlxcel"]["drafter"]["kind"]


@pytest.mark.slow
def test_reload_swaps_under_load_refuses_bad_profiles_and_follows_sighup(tmp_path: Path) -> None:
    profile = write(tmp_path, "live", TARGET_ONLY + ADMIN)
    with serve(tmp_path, "--profile", str(profile), "--api-key", API_KEY) as server:
        keyed = server.client(headers={"Authorization": f"Bearer {API_KEY}"})
        assert server.client().post("/admin/reload").status_code == 401

        # target-only -> draft model while three clients keep requests in flight: none fails,
        # the requests before the swap ran undrafted and those after it drafted.
        write(tmp_path, "live", DRAFT_MODEL + ADMIN)
        traffic = Traffic(server, clients=3)
        traffic.wait_for(1)
        answer = keyed.post("/admin/reload")
        traffic.wait_for(len(traffic.answers) + 2 * 3)  # each client's second answer from now began after the swap
        traffic.stop()
        assert answer.status_code == 200, answer.text
        assert answer.json()["mlxcel"]["drafter"]["kind"] == "draft-model"
        assert traffic.failures == []
        assert False in traffic.answers and True in traffic.answers
        assert drafter_kind(keyed) == "draft-model" and len(keyed.get("/slots").json()) == 8
        assert "llamacpp:spec_decode_num_drafts_total" in keyed.get("/metrics").text

        # A bad profile and a restart-only change are refused with their one line; the draft model serves on.
        write(tmp_path, "live", DRAFT_MODEL.replace("draft-model", "eagle", 1) + ADMIN)
        refused = keyed.post("/admin/reload")
        assert refused.status_code == 409
        assert refused.json()["error"]["message"].startswith(f"reload refused: {profile}: drafter.kind: invalid enum")
        write(tmp_path, "live", DRAFT_MODEL + ADMIN + "max_body_bytes = 4096\n")
        refused = keyed.post("/admin/reload")
        assert refused.status_code == 409 and "server.max_body_bytes: 16777216 -> 4096" in refused.text
        assert drafter_kind(keyed) == "draft-model"
        assert '"draft_n"' in keyed.post("/completion", json=BODY).text

        # SIGHUP reloads whatever the profile says; this one also turns the route off, which it
        # must say it may (an access key: a warning names it).
        write(tmp_path, "live", TARGET_ONLY + "[server]\nreload_may_change_auth = true\n")
        server.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 60
        while drafter_kind(keyed) != "none":
            assert time.monotonic() < deadline, "SIGHUP did not reload"
            time.sleep(0.2)
        assert keyed.post("/admin/reload").status_code == 403
        assert keyed.post("/completion", json=BODY).status_code == 200

    events = [(e["event"], e.get("trigger")) for e in server.events() if e["event"].startswith("reload_")]
    assert events == [
        ("reload_requested", "http"),
        ("reload_succeeded", "http"),
        ("reload_requested", "http"),
        ("reload_refused", "http"),
        ("reload_requested", "http"),
        ("reload_refused", "http"),
        ("reload_requested", "SIGHUP"),
        ("reload_changed_access", "SIGHUP"),
        ("reload_succeeded", "SIGHUP"),
    ]
    assert len(server.events("engine_released")) == 2


def test_sharding_the_target_is_restart_only() -> None:
    """The follower ranks are started with the process: a reload cannot add or remove them."""
    before = Settings()
    after = Settings(target=TargetSettings(model=before.target.model, parallel="tensor", world_size=2))
    assert restart_only_changes(before, after) == ["target.parallel: 'none' -> 'tensor'", "target.world_size: 1 -> 2"]
