"""Soak: many clients mixing streams, disconnects, cancellations and bad requests for minutes.

Checks what issues 10 and 24 ask of a server under mixed load (structured outputs and
log-probabilities in the mix):
- zero hangs (every request answers or fails within HANG_S) and zero 5xx;
- every T = 0 output equal to the same request's solo run (collected first, one at a time);
- the server's RSS (VmRSS) growing less than 5% from the end of warm-up to the end;
- /metrics moving by exactly the prompt and predicted tokens of the requests that finished
  (cancelled rows count nothing), with no row left processing or queued afterwards.

    python -m ops.bench.soak [--minutes 3] [--clients 16] [--profile target-only]

tests/server/test_soak.py runs a 30-second version on the shared target-only server.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ops.bench.hostile import corpus, envelope_problem
from ops.bench.spawn import spawned_server

HANG_S = 120.0  # a request not answered (or failed) by then is a hang
ABANDON_S = 0.5  # the abandoning client's read timeout
SHORT = 24  # tokens of the checked T = 0 requests
LONG = 256  # tokens of the requests clients walk away from: they cannot finish first
WARMUP_SHARE = 1 / 3  # RSS is measured from this share of the run on (caches and queues filled)
PROMPTS = (
    "def fibonacci(n):\n",
    "class Stack:\n    def __init__(self):\n",
    "import os\n\n\ndef list_files(path):\n",
    "def is_prime(n):\n",
)
# Structured outputs in the mix: a JSON schema and a GBNF grammar, both decoded at T = 0 and
# checked against their solo runs like the plain requests.
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "size": {"type": "integer"}},
    "required": ["name", "size"],
}
GRAMMAR = 'root ::= "def " name "(" name "):" \nname ::= [a-z_]{1,10}'
TOP_LOGPROBS = 5
# The corpus's refused requests (not the 16 MiB body, not the seeds: those answer 200).
BAD = [c for c in corpus() if c.status in (400, 404, 405)]


@dataclass
class Tally:
    """What the clients saw, merged under a lock."""

    sent: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    hangs: int = 0
    server_errors: int = 0
    mismatches: int = 0
    prompt_n: int = 0
    predicted_n: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def finished(self, timings: dict) -> None:
        with self.lock:
            self.prompt_n += timings["prompt_n"]
            self.predicted_n += timings["predicted_n"]

    def problem(self, kind: str, text: str) -> None:
        with self.lock:
            self.problems.append(f"{kind}: {text}")
            if kind == "hang":
                self.hangs += 1
            elif kind == "5xx":
                self.server_errors += 1
            elif kind == "mismatch":
                self.mismatches += 1


def completion_body(prompt: str, stream: bool, n: int = SHORT) -> dict:
    return {"prompt": prompt, "n_predict": n, "temperature": 0, "stream": stream, "ignore_eos": n == LONG}


def chat_body(prompt: str, stream: bool) -> dict:
    messages = [{"role": "user", "content": prompt}]
    return {"messages": messages, "max_tokens": SHORT, "temperature": 0, "stream": stream}


def constrained_body(prompt: str, kind: str) -> dict:
    body = completion_body(prompt, False)
    return body | ({"json_schema": SCHEMA} if kind == "schema" else {"grammar": GRAMMAR})


def logprob_body(prompt: str) -> dict:
    return chat_body(prompt, False) | {"logprobs": True, "top_logprobs": TOP_LOGPROBS}


def frames(response: httpx.Response) -> Iterator[dict | str]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line.removeprefix("data: ")
            yield payload if payload == "[DONE]" else json.loads(payload)


def streamed_text(chunks: list) -> tuple[str, dict]:
    """The text of a native or OpenAI stream and the timings of its last frame."""
    text, timings = "", {}
    for chunk in chunks:
        if not isinstance(chunk, dict):
            continue
        if "error" in chunk:
            raise ValueError(f"error frame: {chunk['error']}")
        if "choices" in chunk:
            delta = chunk["choices"][0].get("delta") or {}
            text += delta.get("content") or chunk["choices"][0].get("text") or ""
        elif not chunk.get("stop"):
            text += chunk.get("content", "")
        timings = chunk.get("timings", timings)
    return text, timings


class Client:
    """One soak client: a loop of randomly chosen actions until the deadline."""

    def __init__(self, url: str, solo: dict[tuple[str, str], str], tally: Tally, seed: int) -> None:
        self.url, self.solo, self.tally = url, solo, tally
        self.rng = random.Random(seed)
        self.http = httpx.Client(base_url=url, timeout=HANG_S)
        self.actions: list[Callable[[], None]] = [
            self.complete,
            self.complete_streamed,
            self.chat,
            self.chat_streamed,
            self.constrained,
            self.with_logprobs,
            self.disconnect_mid_stream,
            self.abandon,
            self.cancel,
            self.bad_request,
        ]

    def run(self, deadline: float) -> None:
        with self.http:
            while time.monotonic() < deadline:
                action = self.rng.choice(self.actions)
                self.tally.sent[action.__name__] += 1
                try:
                    action()
                except httpx.TimeoutException as exc:
                    self.tally.problem("hang", f"{action.__name__}: {exc!r}")
                except (httpx.HTTPError, OSError, ValueError, KeyError) as exc:
                    self.tally.problem("error", f"{action.__name__}: {exc!r}")

    def check(self, kind: str, response: httpx.Response) -> bool:
        if response.status_code >= 500:
            self.tally.problem("5xx", f"{kind}: {response.status_code} {response.text[:200]}")
            return False
        if response.status_code != 200:
            self.tally.problem("error", f"{kind}: {response.status_code} {response.text[:200]}")
            return False
        return True

    def compare(self, kind: str, prompt: str, text: str, timings: dict) -> None:
        self.tally.finished(timings)
        if text != self.solo[kind, prompt]:
            self.tally.problem("mismatch", f"{kind} {prompt!r}: {text!r} != solo {self.solo[kind, prompt]!r}")

    def complete(self) -> None:
        prompt = self.rng.choice(PROMPTS)
        response = self.http.post("/completion", json=completion_body(prompt, False))
        if self.check("completion", response):
            body = response.json()
            self.compare("completion", prompt, body["content"], body["timings"])

    def chat(self) -> None:
        prompt = self.rng.choice(PROMPTS)
        response = self.http.post("/v1/chat/completions", json=chat_body(prompt, False))
        if self.check("chat", response):
            body = response.json()
            self.compare("chat", prompt, body["choices"][0]["message"]["content"], body["timings"])

    def constrained(self) -> None:
        """A completion under a JSON schema or a GBNF grammar (a matcher per row, masks per token)."""
        prompt, kind = self.rng.choice(PROMPTS), self.rng.choice(("schema", "grammar"))
        response = self.http.post("/completion", json=constrained_body(prompt, kind))
        if self.check(kind, response):
            body = response.json()
            self.compare(kind, prompt, body["content"], body["timings"])

    def with_logprobs(self) -> None:
        """A chat asking for log-probabilities: one entry per token with its top candidates."""
        prompt = self.rng.choice(PROMPTS)
        response = self.http.post("/v1/chat/completions", json=logprob_body(prompt))
        if self.check("logprobs", response):
            body = response.json()
            entries = body["choices"][0]["logprobs"]["content"]
            if len(entries) != body["usage"]["completion_tokens"] or any(
                len(e["top_logprobs"]) != TOP_LOGPROBS for e in entries
            ):
                self.tally.problem("error", f"logprobs: {len(entries)} entries for {body['usage']}")
            self.compare("chat", prompt, body["choices"][0]["message"]["content"], body["timings"])

    def streamed(self, kind: str, path: str, body: dict, prompt: str) -> None:
        with self.http.stream("POST", path, json=body) as response:
            if not self.check(kind, response):
                return
            text, timings = streamed_text(list(frames(response)))
        self.compare(kind, prompt, text, timings)

    def complete_streamed(self) -> None:
        prompt = self.rng.choice(PROMPTS)
        self.streamed("completion", "/completion", completion_body(prompt, True), prompt)

    def chat_streamed(self) -> None:
        prompt = self.rng.choice(PROMPTS)
        self.streamed("chat", "/v1/chat/completions", chat_body(prompt, True), prompt)

    def disconnect_mid_stream(self) -> None:
        """Read two frames of a long stream, then close the connection."""
        body = completion_body(self.rng.choice(PROMPTS), True, LONG)
        with (
            httpx.Client(base_url=self.url, timeout=HANG_S) as http,
            http.stream("POST", "/completion", json=body) as r,
        ):
            if self.check("disconnect", r):
                for i, _ in enumerate(frames(r)):
                    if i == 1:
                        break

    def abandon(self) -> None:
        """A long non-streaming request whose client stops waiting (its row must be cancelled)."""
        body = completion_body(self.rng.choice(PROMPTS), False, LONG)
        try:
            response = httpx.post(f"{self.url}/completion", json=body, timeout=ABANDON_S)
        except httpx.TimeoutException:
            return
        self.tally.problem("error", f"abandon: answered {response.status_code} within {ABANDON_S} s")

    def cancel(self) -> None:
        """Send a long non-streaming request and hang up at once, before any answer."""
        payload = json.dumps(completion_body(self.rng.choice(PROMPTS), False, LONG)).encode()
        host, port = self.url.removeprefix("http://").split(":")
        head = f"POST /completion HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        head += f"Content-Length: {len(payload)}\r\n\r\n"
        with socket.create_connection((host, int(port)), timeout=HANG_S) as sock:
            sock.sendall(head.encode() + payload)

    def bad_request(self) -> None:
        case = self.rng.choice(BAD)
        response = case.send(self.http)
        if response.status_code >= 500:
            self.tally.problem("5xx", f"bad {case.name}: {response.status_code} {response.text[:200]}")
        elif response.status_code != case.status or envelope_problem(response):
            self.tally.problem("error", f"bad {case.name}: {response.status_code} {response.text[:200]}")


def solo_outputs(url: str) -> dict[tuple[str, str], str]:
    """Each checked request alone, one at a time: the outputs the soak must reproduce."""
    solo = {}
    with httpx.Client(base_url=url, timeout=HANG_S) as http:
        for prompt in PROMPTS:
            body = http.post("/completion", json=completion_body(prompt, False)).raise_for_status().json()
            solo["completion", prompt] = body["content"]
            body = http.post("/v1/chat/completions", json=chat_body(prompt, False)).raise_for_status().json()
            solo["chat", prompt] = body["choices"][0]["message"]["content"]
            for kind in ("schema", "grammar"):
                body = http.post("/completion", json=constrained_body(prompt, kind)).raise_for_status().json()
                solo[kind, prompt] = body["content"]
    return solo


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def scrape(url: str) -> dict[str, float]:
    values = {}
    for line in httpx.get(f"{url}/metrics", timeout=HANG_S).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name.removeprefix("llamacpp:")] = float(value)
    return values


def settled(url: str, timeout: float = 60.0) -> dict[str, float]:
    """/metrics once no row is processing or queued (cancelled rows retire on their next tick)."""
    deadline = time.monotonic() + timeout
    while True:
        values = scrape(url)
        idle = values["requests_processing"] == 0 and values["requests_deferred"] == 0
        if idle or time.monotonic() > deadline:
            return values
        time.sleep(0.2)


@dataclass
class Report:
    seconds: float
    clients: int
    tally: Tally
    rss_warm_kib: int
    rss_end_kib: int
    metrics_prompt_n: int
    metrics_predicted_n: int
    rows_left: int

    @property
    def rss_growth(self) -> float:
        return (self.rss_end_kib - self.rss_warm_kib) / self.rss_warm_kib

    def failures(self) -> list[str]:
        t = self.tally
        found = list(t.problems)
        if self.rss_growth >= 0.05:
            found.append(f"RSS grew {self.rss_growth:.1%} after warm-up")
        if (self.metrics_prompt_n, self.metrics_predicted_n) != (t.prompt_n, t.predicted_n):
            found.append(
                f"/metrics moved by prompt {self.metrics_prompt_n}, predicted {self.metrics_predicted_n}; "
                f"finished requests had prompt {t.prompt_n}, predicted {t.predicted_n}"
            )
        if self.rows_left:
            found.append(f"{self.rows_left} rows still processing or queued after the soak")
        return found

    def table(self) -> str:
        t = self.tally
        rows = [f"| {name} | {count} |" for name, count in sorted(t.sent.items())]
        figures = [
            ("requests sent", str(sum(t.sent.values()))),
            ("hangs", str(t.hangs)),
            ("5xx", str(t.server_errors)),
            ("T = 0 mismatches", str(t.mismatches)),
            ("other problems", str(len(t.problems) - t.hangs - t.server_errors - t.mismatches)),
            ("RSS after warm-up -> end", f"{self.rss_warm_kib / 1024:.0f} -> {self.rss_end_kib / 1024:.0f} MiB"),
            ("RSS growth", f"{self.rss_growth:+.2%}"),
            ("/metrics prompt tokens (sent)", f"{self.metrics_prompt_n} ({t.prompt_n})"),
            ("/metrics predicted tokens (sent)", f"{self.metrics_predicted_n} ({t.predicted_n})"),
            ("rows left", str(self.rows_left)),
        ]
        lines = [f"soak: {self.clients} clients, {self.seconds:.0f} s", "", "| action | sent |", "|---|---|", *rows]
        lines += ["", "| figure | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in figures)]
        return "\n".join(lines)


def run_soak(url: str, pid: int, seconds: float, clients: int, seed: int = 0) -> Report:
    solo = solo_outputs(url)
    before = settled(url)
    tally = Tally()
    started = time.monotonic()
    deadline = started + seconds
    workers = [Client(url, solo, tally, seed + i) for i in range(clients)]
    threads = [threading.Thread(target=w.run, args=(deadline,), daemon=True) for w in workers]
    for thread in threads:
        thread.start()
    time.sleep(seconds * WARMUP_SHARE)
    rss_warm = rss_kib(pid)
    for thread in threads:
        thread.join(timeout=seconds + 2 * HANG_S)
        if thread.is_alive():
            tally.problem("hang", "a client thread did not finish")
    after = settled(url)
    return Report(
        seconds=time.monotonic() - started,
        clients=clients,
        tally=tally,
        rss_warm_kib=rss_warm,
        rss_end_kib=rss_kib(pid),
        metrics_prompt_n=int(after["prompt_tokens_total"] - before["prompt_tokens_total"]),
        metrics_predicted_n=int(after["tokens_predicted_total"] - before["tokens_predicted_total"]),
        rows_left=int(after["requests_processing"] + after["requests_deferred"]),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--profile", default="target-only")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    log = Path(tempfile.mkdtemp(prefix="mlxcel-soak-")) / "server.log"
    with spawned_server(args.profile, str(log)) as (url, process):
        report = run_soak(url, process.pid, args.minutes * 60, args.clients, args.seed)
    print(report.table())
    failures = report.failures()
    for failure in failures[:50]:
        print(f"FAIL {failure}")
    print(f"server log: {log}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
