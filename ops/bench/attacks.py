"""Issue 34's attacks, each against a running server watched by a /health canary and a decoding canary.

    python -m ops.bench.attacks --url http://127.0.0.1:8080 --pid PID [--audit] [--only NAME ...]

Every attack is one client (or a few) trying to stall the others, exhaust the listener or grow
the server's memory. While it runs, one thread polls /health and another decodes a T = 0 canary
completion again and again; an attack's result is the slowest /health, the canary's median and
slowest runs against its idle time (the slower of its medians of three just before the first
attack of a run and just after the last), the server's RSS before and after, and what the attack
itself got. The bar (`Result.problems`): /health under 1 s, the
canary's median run within 3x idle (the median, as the machine's other work moves single runs
by more than that), RSS after within 10% of before. Sizes are the test's (tests/server/test_attacks.py, seconds each)
unless --audit asks for the audit's own (minutes on a small machine). Run against a server whose
profile matches the test's (its api_keys, short listener timeouts, small response and store
limits) to compare two builds; `--key` and `--key-b` name its tenants' keys, `--server-key` its
server key (the profile's `server.api_key`, with `server.admin_reload` on).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import socket
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ops.bench.canary import HealthCanary

CANARY = {"prompt": "def fibonacci(n):\n", "n_predict": 32, "temperature": 0}
AMBIGUOUS = "root ::= s\ns ::= s s | [a-z ]"  # each mask costs more as the output grows
SETTLE_S = 0.8  # after an attack: the server's memory settles before RSS is read


@dataclass(frozen=True)
class Sizes:
    nested_escapes: int = 16_000  # `\"` pairs after 70 `[` (the audit: 64 KB of them, 35 s)
    embedding_inputs: int = 2  # inputs of embedding_tokens each (the audit: 24 of 4,000, 495 s)
    embedding_tokens: int = 600
    abandoned_inputs: int = 6  # a second embeddings request whose client leaves after a second
    short_inputs: int = 2048  # one-token embedding inputs in one request (the audit: 2,048, minutes of the lane)
    over_budget_tokens: int = 150  # then short_inputs of this many: 5 forwards each, past max_embedding_tokens
    grammar_clients: int = 2  # clients of the ambiguous grammar, n = grammar_rows each (issue 45's audit: 8)
    grammar_rows: int = 8  # as many as server.max_rows: admitted in order, one client's rows held every row
    anchors: int = 1500  # `$ref: #aN` references (the audit: about 2,000, 215 s per 400)
    text_clients: int = 4  # concurrent /tokenize and count_tokens of text_bytes each (the audit: 6 of 4 MB)
    text_bytes: int = 512 << 10
    slow_sockets: int = 300  # sockets that send half a request line (the audit: 2,100 against 2,048 descriptors)
    slow_heads: int = 40  # sockets that never finish their head, and others their chunked body
    slow_bodies: int = 8
    endless_heads: int = 4  # sockets that send header bytes without end (the audit: 16, 2.7 GB)
    endless_s: float = 2.0
    stored: int = 12  # /v1/responses stored with stored_bytes of function_call arguments (the audit: 60 of 10 MB)
    stored_bytes: int = 1 << 20
    pieces_bytes: int = 512 << 10  # /tokenize with_pieces (the audit: 8 MB, a 95.5 MB answer)
    store_overflow: int = (
        9  # tenant B's stored responses, past the test profile's 8 per tenant (the old store: 256 shared)
    )
    upgrades: int = 160  # WebSocket handshakes left open, past the test server's 128 connections (the audit: 1,024)
    endless_trailers: int = 2  # chunked bodies ending in one trailer line without end (the audit: 2), endless_s each
    unread: int = 8  # connections that never read their answers (the audit: 24 of 31.7 MB)
    unread_bytes: int = 1_900_000  # each answer (/detokenize), under the test profile's max_response_bytes
    unread_pipelined: int = 3  # answers asked at once per connection: the kernel's socket buffers take the first
    stalled_streams: int = 3  # streams whose client stops reading (the audit: 16 of 8.5 MB)
    stream_probs: int = 1000  # their n_probs and tokens: 130 x 1001 entries (max_logprob_entries), 10.8 MB of frames
    stream_tokens: int = 130
    reloads: int = 20  # POST /admin/reload by the server key, one after another (the audit: 133)


AUDIT = Sizes(
    nested_escapes=32_000,
    embedding_inputs=24,
    embedding_tokens=4000,
    anchors=2000,
    text_clients=6,
    text_bytes=4 << 20,
    slow_sockets=2100,
    slow_heads=200,
    slow_bodies=16,
    endless_heads=16,
    endless_s=10.0,
    stored=60,
    stored_bytes=10 << 20,
    pieces_bytes=8 << 20,
    store_overflow=257,
    upgrades=1024,
    unread=24,
    unread_bytes=31_700_000,
    unread_pipelined=1,
    stalled_streams=16,
    reloads=133,
)


@dataclass
class Target:
    url: str
    pid: int
    key: str | None = None  # tenant A's API key (None: no keys)
    key_b: str | None = None  # tenant B's
    server_key: str | None = None  # server.api_key, the admin routes' key

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def client(self, key: str | None = None, timeout: float = 300) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else self.headers
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    @property
    def port(self) -> int:
        return httpx.URL(self.url).port or 80


@dataclass
class Result:
    name: str
    health_s: float  # the slowest /health while the attack ran (inf: one failed)
    canary_idle_s: float
    canary_median_s: float  # the canary completions while it ran: their median
    canary_worst_s: float  # and the slowest
    rss_before_mb: float
    rss_after_mb: float
    seconds: float
    outcome: dict[str, Any] = field(default_factory=dict)

    def problems(self) -> list[str]:
        """What the issue's bar says is wrong: /health 1 s or more, the canary past 3x, RSS past +10%."""
        out = []
        if self.health_s >= 1.0:
            out.append(f"{self.name}: /health took {self.health_s:.2f} s")
        if self.canary_median_s > 3 * self.canary_idle_s:
            out.append(
                f"{self.name}: the canary took {self.canary_median_s:.2f} s (median; the slowest "
                f"{self.canary_worst_s:.2f} s), idle {self.canary_idle_s:.2f} s"
            )
        if self.rss_after_mb > 1.1 * self.rss_before_mb:
            out.append(f"{self.name}: RSS {self.rss_before_mb:.0f} -> {self.rss_after_mb:.0f} MB")
        return out


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def canary_s(target: Target) -> float:
    with target.client() as http:
        started = time.perf_counter()
        answer = http.post("/completion", json=CANARY)
        assert answer.status_code == 200, answer.text[:200]
        return time.perf_counter() - started


def idle_canary_s(target: Target) -> float:
    return statistics.median(canary_s(target) for _ in range(3))


class Canaries:
    """/health polled (ops/bench/canary.py) and the canary completion decoded back to back, from threads."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.health = HealthCanary(target.url)
        self.canaries: list[float] = []
        self._done = threading.Event()
        self._decoder = threading.Thread(target=self._decode)

    @property
    def health_s(self) -> float:
        return self.health.slowest

    def __enter__(self) -> Canaries:
        self.health.__enter__()
        self._decoder.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._decoder.join()
        self.health.__exit__()

    def _decode(self) -> None:
        while not self._done.is_set():
            try:
                self.canaries.append(canary_s(self.target))
            except (httpx.HTTPError, AssertionError):
                self.canaries.append(float("inf"))


def measured(
    target: Target,
    name: str,
    attack: Callable[[Target, Sizes], dict[str, Any]],
    sizes: Sizes,
    idle: float | None = None,
) -> Result:
    """`attack` under the canaries; `idle` is the canary's idle time (measured now when not given)."""
    idle = idle_canary_s(target) if idle is None else idle
    before = rss_mb(target.pid)
    started = time.perf_counter()
    with Canaries(target) as watch:
        outcome = attack(target, sizes)
    seconds = time.perf_counter() - started
    time.sleep(SETTLE_S)
    runs = watch.canaries or [float("inf")]
    median, worst = statistics.median(runs), max(runs)
    return Result(name, watch.health_s, idle, median, worst, before, rss_mb(target.pid), seconds, outcome)


def attacked(target: Target, names: list[str], sizes: Sizes) -> list[Result]:
    """The attacks one after another, each measured against the canary's idle time: the slower of
    its medians before the first and after the last, since the machine's other work moves it."""
    before = idle_canary_s(target)
    results = [measured(target, name, ATTACKS[name], sizes, before) for name in names]
    idle = max(before, idle_canary_s(target))
    return [dataclasses.replace(result, canary_idle_s=idle) for result in results]


def timed(call: Callable[[], httpx.Response]) -> tuple[int, float]:
    started = time.perf_counter()
    answer = call()
    return answer.status_code, round(time.perf_counter() - started, 2)


def together(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run the calls on threads at once; their results in order."""
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


# --- 1. event loop and engine stalls ---------------------------------------------------------------


def nested_strings(target: Target, sizes: Sizes) -> dict[str, Any]:
    """A body of 70 `[` then `\\"` pairs with no closing quote: the old nesting check's regex was quadratic on it."""
    body = b'{"prompt": "x", "n_predict": 1, "x": ' + b"[" * 70 + b'"' + b'\\"' * sizes.nested_escapes
    with target.client() as http:
        status, seconds = timed(lambda: http.post("/completion", content=body, headers=JSON))
    return {"status": status, "seconds": seconds}


JSON = {"content-type": "application/json"}


def long_embeddings(target: Target, sizes: Sizes) -> dict[str, Any]:
    """Long embedding inputs, and a client that leaves after a second (its work must stop)."""
    inputs = [[5] * sizes.embedding_tokens] * sizes.embedding_inputs
    abandoned = [[7] * sizes.embedding_tokens] * sizes.abandoned_inputs

    def leave() -> str:
        try:
            with target.client(timeout=1.0) as http:
                http.post("/v1/embeddings", json={"input": abandoned})
        except httpx.TimeoutException:
            return "left"
        return "answered"

    def embed() -> tuple[int, float]:
        with target.client() as http:
            return timed(lambda: http.post("/v1/embeddings", json={"input": inputs}))

    left, (status, seconds) = together([leave, embed])
    time.sleep(1.0)  # the canaries go on: an abandoned embedding still computing slows them
    return {"status": status, "seconds": seconds, "abandoned": left}


def short_embeddings(target: Target, sizes: Sizes) -> dict[str, Any]:
    """Many one-token embedding inputs: each took a forward of its own, about a 32-token chunk's
    time (now 32 share one); then as many inputs of over_budget_tokens, whose forwards the server
    refuses to start (the default server.max_embedding_tokens, 300,000 positions, against 327,680)."""
    short = {"input": [[5]] * sizes.short_inputs, "encoding_format": "base64"}  # as the OpenAI SDK asks
    many = {"input": [[5] * sizes.over_budget_tokens] * sizes.short_inputs, "encoding_format": "base64"}
    with target.client() as http:
        status, seconds = timed(lambda: http.post("/v1/embeddings", json=short))
        refused, refused_s = timed(lambda: http.post("/v1/embeddings", json=many))
    return {"status": status, "seconds": seconds, "over_budget": refused, "over_budget_seconds": refused_s}


def ambiguous_grammar(target: Target, sizes: Sizes) -> dict[str, Any]:
    """Rows of an ambiguous grammar, whose every mask stays under the per-mask budget for long."""
    body = {"prompt": "x", "max_tokens": 200, "n": sizes.grammar_rows, "grammar": AMBIGUOUS, "temperature": 1.0}

    def one(seed: int) -> tuple[int, float, str]:
        with target.client() as http:
            started = time.perf_counter()
            answer = http.post("/v1/completions", json=body | {"seed": seed})
            return answer.status_code, round(time.perf_counter() - started, 2), answer.text[:160]

    results = together([lambda s=seed: one(s) for seed in range(sizes.grammar_clients)])
    return {"statuses": [r[0] for r in results], "seconds": [r[1] for r in results], "first": results[0][2]}


def anchor_refs(target: Target, sizes: Sizes) -> dict[str, Any]:
    """A schema of many `$ref: #aN` anchor references: the old bounds check walked the schema once per reference."""
    schema = {
        "type": "object",
        "properties": {f"p{i}": {"$ref": f"#a{i}"} for i in range(sizes.anchors)},
        "$defs": {f"d{i}": {"type": "string", "description": "x" * 40} for i in range(sizes.anchors)},
    }
    with target.client() as http:
        status, seconds = timed(lambda: http.post("/completion", json={"prompt": "x", "n_predict": 2,
                                                                        "json_schema": schema}))  # fmt: skip
    return {"status": status, "seconds": seconds}


def big_texts(target: Target, sizes: Sizes) -> dict[str, Any]:
    """Concurrent megabytes of text to /tokenize and /v1/messages/count_tokens."""
    text = ("hello world, this is a test of tokenization " * (sizes.text_bytes // 40 + 1))[: sizes.text_bytes]
    counted = {"model": "x", "messages": [{"role": "user", "content": text}]}

    def post(path: str, body: dict[str, Any]) -> tuple[int, float]:
        with target.client() as http:
            return timed(lambda: http.post(path, json=body))

    half = sizes.text_clients // 2
    calls = [lambda: post("/tokenize", {"content": text})] * (sizes.text_clients - half)
    calls += [lambda: post("/v1/messages/count_tokens", counted)] * half
    results = together(calls)
    return {"statuses": [r[0] for r in results], "seconds": [r[1] for r in results]}


# --- 2. the listener (no key needed) -----------------------------------------------------------------


def connect(target: Target) -> socket.socket:
    return socket.create_connection(("127.0.0.1", target.port), timeout=10)


def closed(sock: socket.socket) -> bool:
    """Whether the server closed `sock` (an answer before the close counts as closed)."""
    sock.setblocking(False)
    try:
        while data := sock.recv(65536):
            del data
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def slow_sockets(target: Target, sizes: Sizes) -> dict[str, Any]:
    """Sockets that send half a request line and wait: more of them than the server has descriptors."""
    opened: list[socket.socket] = []
    refused = 0
    try:
        for _ in range(sizes.slow_sockets):
            try:
                sock = connect(target)
                sock.sendall(b"GET /health HTTP/1.1\r\n")
                opened.append(sock)
            except OSError:
                refused += 1
        time.sleep(1.0)  # /health and the canary, with every socket open
        return {"opened": len(opened), "refused": refused, "closed_by_server": sum(map(closed, opened))}
    finally:
        for sock in opened:
            sock.close()


def slow_heads_and_bodies(target: Target, sizes: Sizes, wait_s: float = 2.5) -> dict[str, Any]:
    """Heads that never end and chunked bodies that never end: the server must time them out."""
    heads = [connect(target) for _ in range(sizes.slow_heads)]
    bodies = [connect(target) for _ in range(sizes.slow_bodies)]
    start = b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    try:
        for sock in heads:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for sock in bodies:
            sock.sendall(start + b"Authorization: Bearer " + (target.key or "").encode() + b"\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n")  # fmt: skip
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            for sock in bodies:
                with contextlib.suppress(OSError):
                    sock.sendall(b"1\r\n \r\n")  # a byte of whitespace now and then: never the end
            time.sleep(0.25)
        return {"heads_closed": sum(map(closed, heads)), "bodies_closed": sum(map(closed, bodies))}
    finally:
        for sock in heads + bodies:
            sock.close()


def flooded(target: Target, start: bytes, seconds: float) -> tuple[int, int]:
    """`start`, then bytes of one line without end for `seconds` or until the server stops taking
    them: the bytes sent and the status it answered (0: none)."""
    sent = 0
    with connect(target) as sock:
        sock.sendall(start)
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                sock.sendall(b"a" * 65536)
                sent += 65536
        except OSError:
            pass
        return sent, status_of(sock)


def status_of(sock: socket.socket) -> int:
    """The status of the answer waiting on `sock` (0: none, or the connection reset)."""
    try:
        sock.settimeout(1.0)
        return int(sock.recv(64).split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def endless_heads(target: Target, sizes: Sizes) -> dict[str, Any]:
    """Sockets sending header bytes without end (one endless line each)."""
    start = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Endless: "
    sent = together([lambda: flooded(target, start, sizes.endless_s)[0]] * sizes.endless_heads)
    return {"sent_mb": [round(s / (1 << 20), 1) for s in sent]}


def endless_trailers(target: Target, sizes: Sizes) -> dict[str, Any]:
    """Chunked bodies whose last chunk is followed by one trailer line without end: httptools joins
    the unfinished line with `bytes +=`, quadratic, unless the server stops taking it."""
    start = (
        b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + (target.key or "").encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\n{}\r\n0\r\nX-Endless: "
    )
    results = together([lambda: flooded(target, start, sizes.endless_s)] * sizes.endless_trailers)
    return {"sent_mb": [round(sent / (1 << 20), 1) for sent, _ in results], "statuses": [s for _, s in results]}


def upgrades(target: Target, sizes: Sizes) -> dict[str, Any]:
    """WebSocket handshakes (no key needed), left open: more of them than the server holds connections."""
    handshake = (
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    opened: list[socket.socket] = []
    try:
        for _ in range(sizes.upgrades):
            with contextlib.suppress(OSError):
                sock = connect(target)
                sock.sendall(handshake)
                opened.append(sock)
        time.sleep(1.0)  # /health and the canary, with every socket left open
        statuses = [status_of(sock) for sock in opened[:8]]
        return {"opened": len(opened), "first_statuses": statuses, "closed_by_server": sum(map(closed, opened)),
                "fresh_health": fresh_health(target)}  # fmt: skip
    finally:
        for sock in opened:
            sock.close()


def fresh_health(target: Target) -> int:
    """/health's status on a new connection (the canary's poller keeps its own open)."""
    try:
        return httpx.get(f"{target.url}/health", timeout=5).status_code
    except httpx.HTTPError:
        return 0


def held_open(target: Target, socks: list[socket.socket]) -> int:
    """How many of the connections of `socks` the server still holds: its end ESTABLISHED (a socket
    the process closed, aborted or not, is the kernel's alone: FIN_WAIT or gone)."""
    ports = {sock.getsockname()[1] for sock in socks}
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, remote, state = line.split()[1:4]
            count += (
                state == "01"
                and int(local.rsplit(":")[1], 16) == target.port
                and (int(remote.rsplit(":")[1], 16) in ports)
            )
    return count


def unreading(target: Target, request: bytes, count: int) -> list[socket.socket]:
    """`count` connections that send `request` and never read (a small receive window, as a slow
    reader's), so that what the server answers stays in its buffers."""
    opened = []
    for _ in range(count):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", target.port))
        sock.sendall(request)
        opened.append(sock)
    return opened


def held(target: Target, opened: list[socket.socket], wait_s: float) -> dict[str, Any]:
    """With the clients' sockets open and unread: polled until the server holds none of them, or
    `wait_s`; then how many it still held and after how long."""
    started = time.monotonic()
    try:
        while (holding := held_open(target, opened)) and time.monotonic() - started < wait_s:
            time.sleep(0.25)
        return {"opened": len(opened), "held": holding, "seconds": round(time.monotonic() - started, 1),
                "fresh_health": fresh_health(target)}  # fmt: skip
    finally:
        for sock in opened:
            sock.close()


def post_request(target: Target, path: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return (
        b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + (target.key or "").encode() + b"\r\n"
        b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data
    )


def unread_answers(target: Target, sizes: Sizes) -> dict[str, Any]:
    """Large /detokenize answers (within max_response_bytes) that their clients never read."""
    with target.client() as http:
        dashes = http.post("/tokenize", json={"content": "-" * 32}).json()["tokens"]
    tokens = dashes * (sizes.unread_bytes // 32)
    request = post_request(target, "/detokenize", {"tokens": tokens}) * sizes.unread_pipelined
    return held(target, unreading(target, request, sizes.unread), HELD_WAIT_S)


def stalled_streams(target: Target, sizes: Sizes) -> dict[str, Any]:
    """Streams of large log-probability frames whose clients stop reading."""
    body = {"prompt": "x", "n_predict": sizes.stream_tokens, "n_probs": sizes.stream_probs, "stream": True,
            "temperature": 1.0, "ignore_eos": True}  # fmt: skip
    request = post_request(target, "/completion", body)
    return held(target, unreading(target, request, sizes.stalled_streams), HELD_WAIT_S)


HELD_WAIT_S = 8.0  # well past the test profile's write_timeout_s (1 s) after the kernel's buffers fill


def huge_heads(target: Target, sizes: Sizes) -> dict[str, Any]:
    """A 1 MB header and 20,000 headers."""
    one_mb = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
    many = (
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(b"X-%d: a\r\n" % i for i in range(20_000)) + b"\r\n"
    )
    statuses = []
    for request in (one_mb, many):
        with connect(target) as sock:
            try:
                sock.sendall(request)
                statuses.append(int(sock.recv(64).split()[1]))
            except (OSError, IndexError, ValueError):
                statuses.append(0)  # closed without an answer
    return {"statuses": statuses}


# --- 3. memory held by stored or returned data -------------------------------------------------------


def stored_responses(target: Target, sizes: Sizes) -> dict[str, Any]:
    """Stored responses whose input holds a large function_call's arguments (the template does not render them)."""
    arguments = json.dumps({"blob": "x" * sizes.stored_bytes})
    body = {
        "model": "x",
        "max_output_tokens": 1,
        "input": [
            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": arguments},
            {"type": "function_call_output", "call_id": "call_1", "output": "ok"},
            {"role": "user", "content": "hi"},
        ],
    }
    with target.client() as http:
        answers = [http.post("/v1/responses", json=body) for _ in range(sizes.stored)]
        first = answers[0].json().get("id") if answers[0].status_code == 200 else None
        again = http.post("/v1/responses", json={"model": "x", "input": "hi", "max_output_tokens": 1,
                                                  "previous_response_id": first})  # fmt: skip
    return {"statuses": sorted({a.status_code for a in answers}), "first_still_stored": again.status_code == 200}


def tokenize_pieces(target: Target, sizes: Sizes) -> dict[str, Any]:
    text = ("lorem ipsum dolor sit amet " * (sizes.pieces_bytes // 27 + 1))[: sizes.pieces_bytes]
    with target.client() as http:
        answer = http.post("/tokenize", json={"content": text, "with_pieces": True})
    return {"status": answer.status_code, "bytes": len(answer.content)}


# --- auth and what tenants can see (issue 45) --------------------------------------------------


def threads(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def reloads(target: Target, sizes: Sizes) -> dict[str, Any]:
    """Each tenant's key tries POST /admin/reload; then the server key reloads again and again (each
    reload left a thread and ~7 MB behind)."""
    tenants = []
    for key in (target.key, target.key_b):
        with target.client(key) as http:
            tenants.append(http.post("/admin/reload").status_code)
    before = threads(target.pid)
    with target.client(target.server_key) as http:
        statuses = [http.post("/admin/reload").status_code for _ in range(sizes.reloads)]
    time.sleep(SETTLE_S)  # the last replaced engine is released
    return {"tenants": tenants, "statuses": sorted(set(statuses)), "threads": [before, threads(target.pid)]}


def grammar_schema(marker: str) -> dict[str, Any]:
    """A schema of many typed properties, named after `marker`: a compile takes tenths of a second."""
    kinds = [{"type": "string", "maxLength": 12}, {"type": "integer", "minimum": 0}, {"enum": ["a", "b", "c"]}]
    properties = {f"{marker}_{i}": kinds[i % 3] for i in range(60)}
    return {"type": "object", "properties": properties, "required": sorted(properties)}


def tenant_grammars(target: Target, sizes: Sizes) -> dict[str, Any]:
    """Tenant A sends a new schema twice, then tenant B the same: B's must cost a compile like any
    new schema, not A's cache hit (the shared cache answered a right guess in half the time)."""
    body = {"prompt": "x", "n_predict": 1, "json_schema": grammar_schema(f"p{time.time_ns()}")}
    seconds = {}
    for name, key in (("a_first", target.key), ("a_again", target.key), ("b_same", target.key_b)):
        with target.client(key) as http:
            status, seconds[name] = timed(lambda: http.post("/completion", json=body))
        assert status == 200, status
    return seconds


# --- 4. 5xx and wrong answers -----------------------------------------------------------------------

THINK_TOOL = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
TWO_CALLS = 'root ::= "[{\\"name\\": \\"f\\", \\"arguments\\": {}}, {\\"name\\": \\"g\\", \\"arguments\\": {}}]"'
TOOLS_F_G = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in "fg"]
BAD_TOOLS = [
    [{"type": "function", "name": 5}],
    [{"type": "function", "name": "f", "parameters": [1, 2]}],
    [{"type": "function"}],
]
FLOATS = [
    {"frequency_penalty": 1e39},
    {"presence_penalty": -1e39},
    {"logit_bias": {"5": 1e39}},
    {"repeat_penalty": 1e-300},
    {"dry_multiplier": 1.0, "dry_base": 1e40},
]


def grammar_worker(pid: int) -> int | None:
    """The server's grammar worker process, if one runs."""
    for proc in Path("/proc").iterdir():
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) if proc.name.isdigit() else 0
            if parent == pid and b"grammar_child" in (proc / "cmdline").read_bytes():
                return int(proc.name)
        except (OSError, ValueError, IndexError):
            continue
    return None


def killed_compile(target: Target, http: httpx.Client) -> bool:
    """A valid grammar whose compile is killed (the worker stopped, sent it, then SIGKILLed) is
    answered on a retry: the killed compile was no verdict on the grammar."""
    http.post("/completion", json={"prompt": "x", "n_predict": 1, "grammar": 'root ::= "a"'})  # the worker runs
    worker = grammar_worker(target.pid)
    if worker is None:
        return False
    body = {"prompt": "x", "n_predict": 1, "grammar": f'root ::= "b{time.time_ns()}"'}
    os.kill(worker, signal.SIGSTOP)
    killed = threading.Thread(target=lambda: http.post("/completion", json=body))
    killed.start()
    time.sleep(0.3)  # the request waits in the stopped worker's pipe
    os.kill(worker, signal.SIGKILL)
    killed.join()
    return http.post("/completion", json=body).status_code == 200


def tenants_keep_their_responses(target: Target, overflow: int) -> bool:
    """Tenant B's stored responses (more than a tenant's store holds) evict none of tenant A's."""
    body = {"model": "x", "input": "hi", "max_output_tokens": 1}
    with target.client(target.key) as a, target.client(target.key_b) as b:
        kept = a.post("/v1/responses", json=body).json()["id"]
        for _ in range(overflow):
            b.post("/v1/responses", json=body)
        return a.post("/v1/responses", json=body | {"previous_response_id": kept}).status_code == 200


def streamed_text(http: httpx.Client, body: dict[str, Any]) -> str:
    text = ""
    with http.stream("POST", "/v1/chat/completions", json=body | {"stream": True}) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    text += choice["delta"].get("content") or ""
    return text


def wrong_answers(target: Target, sizes: Sizes) -> dict[str, Any]:
    """Each check True when the server answers right."""
    checks: dict[str, Any] = {}
    with target.client() as http:
        for i, tools in enumerate(BAD_TOOLS):
            answer = http.post(
                "/v1/responses", json={"model": "x", "input": "hi", "max_output_tokens": 1, "tools": tools}
            )
            checks[f"responses_bad_tools_{i}"] = answer.status_code == 400
        call = {"type": "function_call", "call_id": 7, "name": "f", "arguments": "{}"}
        answer = http.post("/v1/responses", json={"model": "x", "input": [call], "max_output_tokens": 1})
        checks["responses_numeric_call_id"] = answer.status_code == 400
        for fields in FLOATS:
            answer = http.post("/completion", json={"prompt": "x", "n_predict": 4, "temperature": 1.0} | fields)
            checks[f"float_{next(iter(fields.values())) if len(fields) == 1 else 'dry_base'}"] = (
                answer.status_code == 400
            )
        checks["killed_compile_not_cached"] = killed_compile(target, http)
        think = {"messages": [{"role": "user", "content": "hi"}], "tools": THINK_TOOL, "max_tokens": 8,
                 "temperature": 0, "grammar": 'root ::= "<th"'}  # fmt: skip
        whole = http.post("/v1/chat/completions", json=think).json()["choices"][0]["message"]["content"]
        checks["stream_keeps_partial_tag"] = whole == "<th" and streamed_text(http, think) == whole
        two = {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS_F_G, "max_tokens": 40,
               "temperature": 0, "grammar": TWO_CALLS}  # fmt: skip
        calls = [
            len(http.post("/v1/chat/completions", json=two | extra).json()["choices"][0]["message"]["tool_calls"])
            for extra in ({}, {"parallel_tool_calls": False})
        ]
        checks["parallel_tool_calls_default_true_and_false_one"] = calls == [2, 1]
        page = http.get("/")
        checks["page_headers"] = all(
            name in page.headers for name in ("content-security-policy", "x-frame-options", "x-content-type-options")
        )
        simple = http.get("/v1/models", headers={"Origin": "http://elsewhere.example", "Cookie": "a=b"})
        checks["cors_simple_is_wildcard"] = simple.headers.get("access-control-allow-origin") == "*"
    if target.key_b:
        checks["tenants_keep_their_responses"] = tenants_keep_their_responses(target, sizes.store_overflow)
    return checks


ATTACKS: dict[str, Callable[[Target, Sizes], dict[str, Any]]] = {
    "nested_strings": nested_strings,
    "long_embeddings": long_embeddings,
    "short_embeddings": short_embeddings,
    "ambiguous_grammar": ambiguous_grammar,
    "anchor_refs": anchor_refs,
    "big_texts": big_texts,
    "slow_sockets": slow_sockets,
    "slow_heads_and_bodies": slow_heads_and_bodies,
    "endless_heads": endless_heads,
    "endless_trailers": endless_trailers,
    "upgrades": upgrades,
    "huge_heads": huge_heads,
    "stored_responses": stored_responses,
    "tokenize_pieces": tokenize_pieces,
    "unread_answers": unread_answers,
    "stalled_streams": stalled_streams,
    "wrong_answers": wrong_answers,
    "reloads": reloads,
    "tenant_grammars": tenant_grammars,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--key")
    parser.add_argument("--key-b")
    parser.add_argument("--server-key")
    parser.add_argument("--audit", action="store_true", help="the audit's sizes (minutes)")
    parser.add_argument("--only", nargs="*", choices=sorted(ATTACKS), default=list(ATTACKS))
    parser.add_argument("--set", nargs="*", default=[], metavar="SIZE=N", help="one size changed (Sizes' fields)")
    args = parser.parse_args()
    target = Target(args.url, args.pid, args.key, args.key_b, args.server_key)
    sizes = AUDIT if args.audit else Sizes()
    for change in args.set:
        name, value = change.split("=")
        sizes = dataclasses.replace(sizes, **{name: type(getattr(sizes, name))(value)})
    for name in args.only:
        (result,) = attacked(target, [name], sizes)
        print(json.dumps(asdict(result) | {"problems": result.problems()}, default=str), flush=True)


if __name__ == "__main__":
    main()
