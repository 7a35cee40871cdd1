"""What an operator reads (docs/operations.md): one JSON log stream, /metrics through
prometheus_client, the per-request diagnostics and the response markers."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import msgspec
import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families

from app.engine.metrics import Metrics
from app.runtime.logging import configure_logging
from app.server.core import field_policy
from app.server.core.schemas import SamplingFields
from app.server.metrics import HttpMetrics, exposition
from tests.support import ROOT
from tests.support.server import RunningServer, clean_env, sse_frames, wait_healthy

RULE_HEADER = "x-mlxcel-acceptance-rule"
DIAGNOSED = {"prompt": "def fib(n):", "n_predict": 24, "temperature": 0.0, "speculative_diagnostics": True}


def wait_for_line(path: Path, event: str, process: subprocess.Popen, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in path.read_text().splitlines():
            if line.startswith("{") and json.loads(line)["event"] == event:
                return json.loads(line)
        assert process.poll() is None, path.read_text()
        time.sleep(0.1)
    raise AssertionError(f"no {event} line")


@pytest.mark.slow
def test_every_line_the_server_writes_is_json(tmp_path: Path) -> None:
    """From start to shutdown, stdout (the log) and stderr, with good and bad requests, a request
    uvicorn cannot parse, and the closed forms of MLXCEL_SPECULATIVE_ACCEPT_DIAG."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--port", "0"],
            env=clean_env(MLXCEL_SPECULATIVE_ACCEPT_DIAG="1"),
            stdout=stdout,
            stderr=stderr,
        )
    try:
        listening = wait_for_line(out, "listening", process)
        url = listening["url"]
        assert listening["port"] != 0 and url == f"http://127.0.0.1:{listening['port']}"
        wait_healthy(url, process)
        with httpx.Client(base_url=url, timeout=120) as client:
            good = client.post("/completion", json=DIAGNOSED | {"temperature": 0.7}, headers={"X-Request-ID": "job-42"})
            assert client.get("/no-such-route").status_code == 404
            assert client.post("/completion", content=b"{bad").status_code == 400
            assert client.post("/completion", json={"prompt": "x", "lora": [{"id": 0}]}).status_code == 400
        with socket.create_connection(("127.0.0.1", listening["port"])) as raw:
            raw.sendall(b"NOT HTTP \x00\x01\r\n\r\n")
            assert raw.recv(4096).startswith(b"HTTP/1.1 400")  # its warning was logged before this answer
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    lines = [line for path in (out, err) for line in path.read_text().splitlines()]
    events = [json.loads(line) for line in lines]  # every line, or this raises naming it

    assert good.headers["x-request-id"] == "job-42" and good.headers[RULE_HEADER] == "sampler-match"
    speculative = good.json()["timings"]["speculative"]
    assert speculative["closed_form_sum_min"] >= speculative["closed_form_sum_prod"] > 0
    named = {e["event"]: e for e in events}
    assert named["server_ready"]["port"] == listening["port"]
    assert named["acceptance_rule_active"]["batching"] == "rows"  # the embedded Qwen3 target, on the CPU
    assert named["acceptance_rule_active"]["exact"] is True and "exact" not in good.json()["timings"]
    assert {(e["role"], e["event"]) for e in events if e["event"].startswith("model_load")} == {
        (role, event) for role in ("target", "drafter") for event in ("model_loading", "model_loaded")
    }
    assert named["http_protocol_warning"]["message"] == "Invalid HTTP request received."
    access = [e for e in events if e["event"] == "http_request" and e["path"] != "/health"]
    assert [(e["route"], e["status"]) for e in access] == [
        ("/completion", 200),
        (None, 404),
        ("/completion", 400),
        ("/completion", 400),
    ]
    first = access[0]
    assert first["request_id"] == "job-42" and first["profile"] == "default"
    assert first["prompt_n"] > 0 and first["predicted_n"] > 0 and first["duration_ms"] > 0


def test_a_counter_past_ten_million_reads_back_exactly() -> None:
    metrics = Metrics(prompt_tokens_total=12_345_679, spec_decode_num_accepted_tokens_total=10**7 + 1)
    metrics.spec_accepted_lengths = [3, 0, 5]
    families = {f.name: f for f in text_string_to_metric_families(exposition(metrics, HttpMetrics()).decode())}
    assert families["llamacpp:prompt_tokens"].samples[0].value == 12_345_679
    assert families["llamacpp:spec_decode_num_accepted_tokens"].samples[0].value == 10**7 + 1
    lengths = {s.labels.get("le"): s.value for s in families["mlxcel_spec_decode_accepted_length"].samples}
    assert lengths == {"0": 3, "1": 3, "2": 8, "+Inf": 8, None: 10}  # None: _count is 8, _sum 10


def test_metrics_parse_with_prometheus_client(default_server: RunningServer) -> None:
    with default_server.client() as client:
        client.post("/completion", json={"prompt": "def f():", "n_predict": 4})
        client.get("/no-such-route")
        text = client.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "llamacpp:prompt_tokens",
        "llamacpp:spec_decode_num_drafts",
        "mlxcel_time_to_first_token_seconds",
        "mlxcel_request_duration_seconds",
        "mlxcel_queue_wait_seconds",
        "mlxcel_inter_token_latency_seconds",
        "mlxcel_spec_decode_accepted_length",
        "process_cpu_seconds",
    ):
        assert name in families, name
    requests = {(s.labels["route"], s.labels["status"]) for s in families["mlxcel_http_requests"].samples}
    assert {("/completion", "200"), ("unmatched", "404")} <= requests
    assert families["mlxcel_time_to_first_token_seconds"].type == "histogram"


def test_diagnostics_and_markers_on_each_route(default_server: RunningServer) -> None:
    """Native and OpenAI, streamed and not: the header names the rule the loop reported; the
    body (or the last frame) says whether the stream was biased and, when asked, carries
    `timings.speculative`, whose counters agree with the draft block."""
    with default_server.client() as client:
        plain = client.post("/completion", json={"prompt": "def f():", "n_predict": 8})
        native = client.post("/completion", json=DIAGNOSED)
        chat = client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "speculative_diagnostics": True},
        )
        with client.stream(
            "POST", "/v1/completions", json={**DIAGNOSED, "stream": True, "temperature": 0.7, "max_tokens": 8}
        ) as streamed:
            frames = sse_frames(streamed)
    assert "speculative" not in plain.json()["timings"] and plain.json()["speculative_biased"] is False
    for response in (plain, native, chat, streamed):
        assert response.headers[RULE_HEADER] in ("greedy-argmax", "sampler-match"), response.headers
    timings = native.json()["timings"]
    speculative = timings["speculative"]
    assert speculative["rule"] == native.headers[RULE_HEADER] == "greedy-argmax"
    assert speculative["identity"] == "token"  # greedy argmax is sampler-match with an argmax sampler
    assert (speculative["rounds"], speculative["proposed"], speculative["accepted"]) == (
        timings["draft_rounds"],
        timings["draft_n"],
        timings["draft_n_accepted"],
    )
    assert sum(speculative["accepted_lengths"]) == speculative["rounds"]
    assert sum(k * n for k, n in enumerate(speculative["accepted_lengths"])) == speculative["accepted"]
    assert sum(speculative["accepted_per_position"]) == speculative["accepted"]
    assert "closed_form_sum_min" not in speculative  # only under MLXCEL_SPECULATIVE_ACCEPT_DIAG
    assert chat.json()["timings"]["speculative"]["rule"] == chat.headers[RULE_HEADER] == "sampler-match"  # T 0.8
    assert chat.json()["timings"]["speculative"]["identity"] == "token"
    last = frames[-2]  # the finish chunk, before [DONE]
    assert last["speculative_biased"] is False
    assert last["timings"]["speculative"]["rule"] == streamed.headers[RULE_HEADER] == "sampler-match"


def test_target_only_responses_name_no_rule(target_only_server: RunningServer) -> None:
    response = target_only_server.client().post("/completion", json=DIAGNOSED)
    assert response.headers[RULE_HEADER] == "none"
    body = response.json()
    assert "speculative_biased" not in body and "speculative" not in body["timings"]


@pytest.mark.slow
@pytest.mark.xdist_group("mtp")  # with the other tests of the mtp profile's server (tests/conftest.py)
def test_a_block_drafter_marks_its_sampled_stream_biased(profile_server) -> None:
    """argmax-against-argmax at T > 0 follows the target's greedy path: the body says so."""
    response = profile_server("mtp").client().post("/completion", json=DIAGNOSED | {"temperature": 0.7})
    assert response.headers[RULE_HEADER] == "argmax-against-argmax"
    body = response.json()
    assert body["speculative_biased"] is True and body["timings"]["speculative"]["biased"] is True
    assert body["timings"]["speculative"]["identity"] == "greedy"


def test_own_fields_are_typed_and_documented() -> None:
    """The field policy's table of this server's own fields: each a typed wire field, in the docs."""
    wire = {field.encode_name for field in msgspec.structs.fields(SamplingFields)}
    honoured = (ROOT / "docs" / "server.md").read_text().split("Honoured:")[1].split("Accepted without effect")[0]
    for name in field_policy.OWN:
        assert name in wire and f"`{name}`" in honoured, name


def test_the_console_format_is_for_a_terminal_only() -> None:
    """`logging.format = "console"` renders for people on a terminal (a real pty here); on a pipe
    or a file the stream stays JSON."""
    leader, follower = os.openpty()
    pipe = io.StringIO()
    try:
        with os.fdopen(follower, "w") as terminal:
            for stream in (terminal, pipe):
                configure_logging("info", fmt="console", stream=stream)
                structlog.get_logger("test").info("hello", n=1)
        shown = os.read(leader, 4096).decode()
    finally:
        configure_logging(None)
        structlog.reset_defaults()
        os.close(leader)
    assert "hello" in shown and "{" not in shown
    assert json.loads(pipe.getvalue())["event"] == "hello"
