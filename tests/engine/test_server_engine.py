"""Scheduling, lifecycle and acceptance events of a real server."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import uvicorn

from app.engine.engine import Engine, EngineState
from app.profiles import resolve
from app.server.app import create_app
from tests.support.server import clean_env, free_port, sse_frames

PROMPTS = [
    "def rolling_mean(values, window):\n",
    "class Stack:\n    def __init__(self):\n",
    "import os\n\n\ndef walk(root):\n",
    "def parse(text):\n    tokens = []\n",
    "def area(radius):\n",
    "class Config:\n    def load(self, path):\n",
    "def retry(times):\n",
    "for item in items:\n",
]


def stream_content(url: str, request: dict) -> str:
    with (
        httpx.Client(base_url=url, timeout=120) as http,
        http.stream("POST", "/completion", json=request) as r,
    ):
        frames = sse_frames(r)
    return "".join(f["content"] for f in frames if not f["stop"])


def test_eight_concurrent_streams_each_get_their_solo_output(default_server) -> None:
    requests = [
        {
            "prompt": p,
            "n_predict": 40,
            "temperature": 0.8,
            "seed": 100 + i,
            "stream": True,
            "ignore_eos": True,
        }
        for i, p in enumerate(PROMPTS)
    ]
    solo = [stream_content(default_server.url, r) for r in requests]
    with ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(lambda r: stream_content(default_server.url, r), requests))
    assert together == solo
    assert len(set(solo)) == len(solo)


def busy_rows(http: httpx.Client) -> list[dict]:
    return [s for s in http.get("/slots").json() if s["is_processing"]]


def test_a_client_that_disconnects_frees_its_row(default_server) -> None:
    request = {"prompt": PROMPTS[0], "n_predict": 3000, "ignore_eos": True, "stream": True, "temperature": 0}
    with httpx.Client(base_url=default_server.url, timeout=60) as http:
        with http.stream("POST", "/completion", json=request) as response:
            rid = response.headers["x-request-id"]
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            assert any(s["id_task"] == rid for s in busy_rows(http))
        deadline = time.monotonic() + 10
        while any(s["id_task"] == rid for s in busy_rows(http)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(s["id_task"] == rid for s in busy_rows(http))
    cancelled = default_server.wait_for_event("request_cancelled", rid)
    assert cancelled["decided"] < 3000


def test_speculative_request_event_matches_the_response_timings(default_server) -> None:
    with default_server.client() as http:
        response = http.post("/completion", json={"prompt": PROMPTS[1], "n_predict": 48, "temperature": 0})
    timings = response.json()["timings"]
    event = default_server.wait_for_event("speculative_request", response.headers["x-request-id"])
    assert event["route"] == "/completion" and event["profile"] == "default"
    assert event["draft_kind"] == timings["draft_kind"] == "draft-model"
    assert event["rule"] == "greedy-argmax" and event["biased"] is False
    assert event["rounds"] == timings["draft_rounds"]
    assert event["proposed"] == timings["draft_n"]
    assert event["accepted"] == timings["draft_n_accepted"]
    assert event["predicted_n"] == timings["predicted_n"]
    assert event["mean_accepted_len"] == round(timings["draft_n_accepted"] / timings["draft_rounds"], 4)


def test_startup_event_names_the_loop(default_server) -> None:
    (event,) = default_server.events("acceptance_rule_active")
    assert event["profile"] == "default" and event["drafter_kind"] == "draft-model"
    assert event["rule"] == "sampler-match" and event["width"] == 4 and event["env_overrides"] == {}


class GatedEngine(Engine):
    """The real engine, whose model load waits for the test to open a gate."""

    gate = threading.Event()

    def _load(self) -> None:
        self.gate.wait(30)
        super()._load()


@pytest.mark.slow
def test_health_answers_503_while_models_load() -> None:
    settings = resolve("target-only").settings
    engine = GatedEngine(settings)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(engine), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                loading = httpx.get(f"{url}/health")
                break
            except httpx.TransportError:
                time.sleep(0.05)
        assert loading.status_code == 503
        assert loading.json() == {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
        assert httpx.post(f"{url}/completion", json={"prompt": "x"}).status_code == 503
        GatedEngine.gate.set()
        assert engine.wait_ready(30)
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.mark.slow
def test_a_load_failure_exits_non_zero_with_the_reason(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}))
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "app",
            "serve",
            "--profile",
            "target-only",
            "-m",
            str(broken),
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    )
    assert result.returncode != 0
    assert "cannot start" in result.stderr and str(broken) in result.stderr


def test_a_stop_while_models_load_returns_at_once_and_the_engine_never_serves() -> None:
    """A signalled start's shutdown stopped an engine still loading: the stop joined the load, past
    a minute on loaded cores (issue 45). It returns at once now; the engine never turns READY nor
    says it serves, and its thread ends once the load does."""

    class Held(Engine):
        gate = threading.Event()

        def _load(self) -> None:
            self.gate.wait(30)
            super()._load()

    ready: list[Engine] = []
    engine = Held(resolve("target-only").settings, on_ready=ready.append)
    engine.start()
    engine.stop()
    assert engine._thread.is_alive() and not Held.gate.is_set()  # the stop did not wait for the load
    assert engine.state is EngineState.STOPPED
    Held.gate.set()
    engine._thread.join(30)
    assert not engine._thread.is_alive()
    assert engine.state is EngineState.STOPPED and ready == []
