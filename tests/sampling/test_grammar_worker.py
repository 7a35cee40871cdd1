"""The grammar worker process on its own: its verdicts, its CPU budget, its queue and its cache."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from transformers import AutoTokenizer

from app.loading.paths import EMBEDDED_TARGET
from app.sampling.grammar import GrammarError
from app.sampling.grammar_child import GrammarLimits
from app.sampling.grammar_worker import GrammarCompiler, GrammarUnavailableError, WorkerVocabulary

TENANT = "key-0123456789ab"  # any tenant id: the verdicts cached below are its


def chain(rules: int, first: str = "a") -> str:
    """GBNF of `rules` rules of two alternatives each: its compile's CPU time grows with them."""
    lines = (f'r{i} ::= "{first}" r{i + 1} | "b" r{i + 1}' for i in range(rules))
    return "\n".join(["root ::= r0", *lines, f'r{rules} ::= "c"'])


SLOW = chain(3000)  # seconds of CPU
QUICK = chain(400, "q")  # about 0.2 s of CPU on this machine, against the fixture's 0.5 s budget
HOGS = 4


@pytest.fixture(scope="module")
def vocabulary() -> WorkerVocabulary:
    hf = AutoTokenizer.from_pretrained(EMBEDDED_TARGET)
    return WorkerVocabulary.of(hf, len(hf), [hf.eos_token_id])


@pytest.fixture(scope="module")
def compiler(vocabulary: WorkerVocabulary) -> Iterator[GrammarCompiler]:
    worker = GrammarCompiler(vocabulary, GrammarLimits(compile_timeout_s=0.5, max_queue=1))
    yield worker
    worker.close()


def test_a_grammar_compiles_in_the_worker_and_is_cached(compiler: GrammarCompiler) -> None:
    grammar = compiler.compile("json_schema", '{"type": "integer"}', "json_schema", TENANT)
    assert grammar.limits is compiler.limits
    assert compiler.compile("json_schema", '{"type": "integer"}', "json_object", TENANT).source == "json_object"
    with pytest.raises(GrammarError, match="invalid grammar"):
        compiler.compile("grammar", "root ::= missing", "grammar", TENANT)


def test_a_compile_past_the_time_limit_kills_the_worker_and_the_next_one_respawns(compiler: GrammarCompiler) -> None:
    with pytest.raises(GrammarError, match=r"more than 0\.5 s of CPU \(grammar\.compile_timeout_s\)"):
        compiler.compile("grammar", SLOW, "grammar", TENANT)
    assert compiler.compile("grammar", 'root ::= "yes"', "grammar", TENANT).source == "grammar"


@contextlib.contextmanager
def contended(pid: int) -> Iterator[None]:
    """Busy processes on the one core `pid` is pinned to: it gets about 1 / (HOGS + 1) of it."""
    core = min(os.sched_getaffinity(pid))
    os.sched_setaffinity(pid, {core})
    spin = f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(HOGS)]
    try:
        time.sleep(0.2)  # every hog spinning
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def test_the_budget_is_cpu_time_so_a_contended_compile_still_fits(compiler: GrammarCompiler) -> None:
    """A wall-clock limit refused this grammar on a loaded machine (its wall time here: about
    HOGS + 1 times its CPU time, over the budget); its CPU time is well within it."""
    compiler.compile("grammar", 'root ::= "warm"', "grammar", TENANT)  # the worker up
    assert compiler._child is not None
    with contended(compiler._child.pid):
        started = time.perf_counter()
        assert compiler.compile("grammar", QUICK, "grammar", TENANT).source == "grammar"
        wall_s = time.perf_counter() - started
    print(f"contended compile: {wall_s:.2f} s of wall time")


def test_a_stopped_worker_meets_the_wall_clock_backstop(vocabulary: WorkerVocabulary) -> None:
    """A child that spends no CPU (stopped, or starved) still cannot hold a request: past
    WALL_BACKSTOP times the budget it is killed, and the next compile gets a fresh one."""
    worker = GrammarCompiler(vocabulary, GrammarLimits(compile_timeout_s=0.1))
    try:
        worker.compile("grammar", 'root ::= "up"', "grammar", TENANT)
        assert worker._child is not None
        os.kill(worker._child.pid, signal.SIGSTOP)
        with pytest.raises(GrammarError, match=r"longer than 1 s \(10 x grammar\.compile_timeout_s\)"):
            worker.compile("grammar", 'root ::= "stopped"', "grammar", TENANT)
        assert worker.compile("grammar", 'root ::= "again"', "grammar", TENANT).source == "grammar"
    finally:
        worker.close()


def test_a_full_queue_is_refused_at_once(compiler: GrammarCompiler) -> None:
    errors: list[BaseException] = []

    def slow() -> None:
        try:
            compiler.compile("grammar", SLOW + "\n", "grammar", TENANT)  # not the cached verdict above
        except GrammarError as exc:
            errors.append(exc)

    first = threading.Thread(target=slow)
    first.start()
    while not compiler._waiting:  # until the first holds the worker
        time.sleep(0.001)
    with pytest.raises(GrammarUnavailableError, match=r"grammar\.max_queue"):
        compiler.compile("grammar", 'root ::= "other"', "grammar", TENANT)
    first.join()
    assert errors and "compile_timeout_s" in str(errors[0])
