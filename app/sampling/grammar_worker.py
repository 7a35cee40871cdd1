"""Untrusted grammars compiled in a worker process, within a time and a memory limit.

One persistent child (app/sampling/grammar_child.py) compiles one grammar at a time; callers
wait in a bounded queue in front of it. A compile whose child spends more than
`compile_timeout_s` of CPU gets the child killed (CPU, not wall time: on a loaded machine a
grammar that compiles in 0.6 s when quiet took over 2 s of wall time on every try); a wall-clock
backstop of WALL_BACKSTOP times that still ends a child that stopped or starves. One that
crashes it (a native stack overflow, the memory limit) leaves it dead; either way the caller
gets a `GrammarError` naming the limit and the next compile starts a fresh child. The compiler's
own verdicts (the grammar, or its refusal) are cached by the text's hash and the tenant that sent
it (bounded), so a tenant's repeated schema costs a dictionary lookup, and another tenant's same
schema is compiled again: a hit answered in a fraction of a compile's time, which told a tenant
whether another had sent a schema (0.105 s against 0.216 s, 12 of 12 pairs). A child that died
is no verdict on the grammar by itself (something outside may have killed it), so the compile is
tried once more on a fresh child: a grammar that kills that one too is refused for it, and that
refusal is cached (a repeated crashing grammar must not keep killing the worker); one whose
second try succeeds gets its grammar. A compile past either time limit is refused and never
cached: on a busy machine the same grammar may fit next time.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from app.events import grammar as events
from app.sampling import grammar_child
from app.sampling.grammar import Grammar, GrammarError
from app.sampling.grammar_child import HEADER, GrammarLimits, label

CHILD = Path(grammar_child.__file__)
STARTUP_TIMEOUT_S = 60.0  # the tokenizer's build (about a second; more on a loaded machine)
WALL_BACKSTOP = 10  # a compile's wall-clock limit, in multiples of its CPU budget
POLL_S = 0.05  # how often the child's CPU time is read while it compiles


class GrammarUnavailableError(Exception):
    """No compile now: more are waiting than grammar.max_queue allows, or the worker would not
    start (a 503: try again)."""


@dataclass(frozen=True)
class WorkerVocabulary:
    """The target's tokenizer as the worker rebuilds it: the fast tokenizer's JSON and its sizes."""

    tokenizer_json: str
    n_vocab: int
    eos: list[int]

    @classmethod
    def of(cls, hf_tokenizer: Any, n_vocab: int, eos: list[int]) -> WorkerVocabulary:
        """What llguidance.hf.from_tokenizer reads, without the padding and truncation settings."""
        backend = hf_tokenizer.backend_tokenizer
        spec = json.loads(backend.to_str())
        spec["padding"] = spec["truncation"] = None
        return cls(json.dumps(spec), n_vocab, eos)


class ChildGoneError(Exception):
    """The child died or was killed mid-compile; the message says which limit."""


@dataclass(frozen=True)
class Lost:
    """A compile that ended with the child gone: refused this once, never cached."""

    message: str
    died: bool  # by itself or by a signal from elsewhere; False: killed here, past the time limit


class GrammarCompiler:
    """The worker process for one tokenizer and one set of limits, its queue and its cache."""

    def __init__(self, vocabulary: WorkerVocabulary, limits: GrammarLimits) -> None:
        self.vocabulary = vocabulary
        self.limits = limits
        self._child: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()  # one compile at a time in the child
        self._waiting = 0
        self._waiting_lock = threading.Lock()
        self._cache: OrderedDict[str, Grammar | str] = OrderedDict()  # hash -> grammar, or the refusal

    def compile(self, kind: str, text: str, source: str, tenant: str) -> Grammar:
        """The checked grammar for `text` (GBNF, or a JSON schema as JSON text) for `tenant`; blocking.

        GrammarError: refused (the message names the limit); GrammarUnavailableError: no compile now.
        """
        key = hashlib.sha256(f"{tenant}\0{kind}\0{text}".encode()).hexdigest()
        verdict = self._cached(key)
        if verdict is None:
            verdict = self._queued(key, kind, text)
        if isinstance(verdict, Lost):
            raise GrammarError(verdict.message)
        if isinstance(verdict, str):
            raise GrammarError(verdict)
        return verdict if verdict.source == source else Grammar(verdict.text, source, verdict.limits)

    def close(self) -> None:
        with self._lock:
            self._stop_child()

    def _cached(self, key: str) -> Grammar | str | None:
        with self._waiting_lock:
            verdict = self._cache.get(key)
            if verdict is not None:
                self._cache.move_to_end(key)
            return verdict

    def _queued(self, key: str, kind: str, text: str) -> Grammar | str | Lost:
        with self._waiting_lock:
            if self._waiting >= self.limits.max_queue:
                raise GrammarUnavailableError(
                    f"grammar: {self._waiting} grammars are waiting to compile; this server queues "
                    f"{self.limits.max_queue} (grammar.max_queue); try again"
                )
            self._waiting += 1
        try:
            with self._lock:
                verdict = self._cached(key) or self._compiled(kind, text)
        finally:
            with self._waiting_lock:
                self._waiting -= 1
        if isinstance(verdict, Lost):
            return verdict
        with self._waiting_lock:
            self._cache[key] = verdict
            while len(self._cache) > self.limits.cache_entries:
                self._cache.popitem(last=False)
        return verdict

    def _compiled(self, kind: str, text: str) -> Grammar | str | Lost:
        """The child's verdict: the grammar, or the refusal's message; Lost when the child was
        killed past the time limit. A child that died gets a second try on a fresh one; dying twice
        is the grammar's verdict."""
        verdict = self._attempt(kind, text)
        if isinstance(verdict, Lost) and verdict.died:
            verdict = self._attempt(kind, text)
            if isinstance(verdict, Lost) and verdict.died:
                return verdict.message
        return verdict

    def _attempt(self, kind: str, text: str) -> Grammar | str | Lost:
        child = self._running_child()
        started = time.perf_counter()
        try:
            cpu_budget_s = self.limits.compile_timeout_s
            over_budget = _cpu_over(child, cpu_budget_s)
            _send(child, {"kind": kind, "text": text})
            backstop_s = WALL_BACKSTOP * cpu_budget_s
            overrun = f"compiling took longer than {backstop_s:g} s ({WALL_BACKSTOP} x grammar.compile_timeout_s)"
            answer = _receive(child, backstop_s, overrun, over_budget)
        except ChildGoneError as exc:
            reason = str(exc) or self._death(child)
            events.grammar_worker_lost(kind=kind, reason=reason, bytes=len(text))
            self._stop_child()
            return Lost(f"{label(kind)}: {reason}", died=not str(exc))
        events.grammar_compiled(kind=kind, ms=(time.perf_counter() - started) * 1000)
        if "error" in answer:
            return answer["error"]
        return Grammar(answer["grammar"], kind, self.limits)

    def _death(self, child: subprocess.Popen[bytes]) -> str:
        """Why the child died mid-compile, for the client (a signal: most likely a native stack overflow)."""
        try:
            code = child.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "the grammar compiler stopped answering"
        if code < 0 and -code in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGKILL):
            return (
                f"the grammar compiler crashed on it ({signal.Signals(-code).name}: too deeply nested, "
                f"or over grammar.compile_memory_mb = {self.limits.compile_memory_mb})"
            )
        return f"the grammar compiler exited with code {code}"

    def _running_child(self) -> subprocess.Popen[bytes]:
        if self._child is not None and self._child.poll() is None:
            return self._child
        child = subprocess.Popen(
            [sys.executable, str(CHILD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # llguidance's warnings there can quote the grammar
            bufsize=0,
        )
        vocabulary = self.vocabulary
        setup = {
            "tokenizer": vocabulary.tokenizer_json,
            "n_vocab": vocabulary.n_vocab,
            "eos": vocabulary.eos,
            "limits": self.limits.as_dict(),
        }
        try:
            _send(child, setup)
            _receive(child, STARTUP_TIMEOUT_S, f"it took longer than {STARTUP_TIMEOUT_S:g} s")
        except ChildGoneError as exc:
            child.kill()
            child.wait()
            raise GrammarUnavailableError(f"grammar: the grammar compiler did not start ({exc})") from exc
        events.grammar_worker_started(pid=child.pid)
        self._child = child
        return child

    def _stop_child(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        if child.stdin is not None:
            child.stdin.close()  # the child's read loop ends on EOF
        try:
            child.wait(timeout=1)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _send(child: subprocess.Popen[bytes], value: Any) -> None:
    body = json.dumps(value).encode()
    try:
        assert child.stdin is not None
        child.stdin.write(HEADER.pack(len(body)) + body)
    except (BrokenPipeError, OSError) as exc:
        raise ChildGoneError("") from exc


def _cpu_over(child: subprocess.Popen[bytes], budget_s: float) -> Callable[[], str | None]:
    """From now on: why the child has spent more than `budget_s` of CPU (all its threads, user and
    system), or None while it has not."""
    process = psutil.Process(child.pid)
    started = _cpu_s(process)

    def over() -> str | None:
        spent = _cpu_s(process) - started
        return (
            f"compiling took more than {budget_s:g} s of CPU (grammar.compile_timeout_s)" if spent > budget_s else None
        )

    return over


def _cpu_s(process: psutil.Process) -> float:
    try:
        times = process.cpu_times()
    except psutil.Error:  # gone: its pipe says so
        return 0.0
    return times.user + times.system


def _receive(
    child: subprocess.Popen[bytes], timeout_s: float, overrun: str, over_budget: Callable[[], str | None] = lambda: None
) -> dict[str, Any]:
    """The child's next answer within `timeout_s` of wall time, and before `over_budget` names an
    overrun; past either the child is killed (`overrun`, or what `over_budget` said, says why)."""
    deadline = time.monotonic() + timeout_s
    (size,) = HEADER.unpack(_read(child, HEADER.size, deadline, overrun, over_budget))
    return json.loads(_read(child, size, deadline, overrun, over_budget))


def _read(
    child: subprocess.Popen[bytes], size: int, deadline: float, overrun: str, over_budget: Callable[[], str | None]
) -> bytes:
    assert child.stdout is not None
    fd = child.stdout.fileno()
    chunks, got = [], 0
    while got < size:
        remaining = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], min(max(remaining, 0), POLL_S))
        if not ready:
            why = overrun if remaining <= 0 else over_budget()
            if why is None:
                continue
            child.kill()
            child.wait()
            raise ChildGoneError(why)
        chunk = os.read(fd, size - got)
        if not chunk:
            raise ChildGoneError("")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
