"""The grammar worker process on its own: its verdicts, its time limit, its queue and its cache."""

from __future__ import annotations

import threading
import time

import pytest
from transformers import AutoTokenizer

from app.loading.paths import EMBEDDED_TARGET
from app.sampling.grammar import GrammarError
from app.sampling.grammar_child import GrammarLimits
from app.sampling.grammar_worker import GrammarCompiler, GrammarUnavailableError, WorkerVocabulary

TENANT = "key-0123456789ab"  # any tenant id: the verdicts cached below are its
SLOW = "\n".join(["root ::= r0", *(f'r{i} ::= "a" r{i + 1} | "b" r{i + 1}' for i in range(3000)), 'r3000 ::= "c"'])


@pytest.fixture(scope="module")
def compiler():
    hf = AutoTokenizer.from_pretrained(EMBEDDED_TARGET)
    vocabulary = WorkerVocabulary.of(hf, len(hf), [hf.eos_token_id])
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
    with pytest.raises(GrammarError, match=r"longer than 0\.5 s \(grammar\.compile_timeout_s\)"):
        compiler.compile("grammar", SLOW, "grammar", TENANT)
    assert compiler.compile("grammar", 'root ::= "yes"', "grammar", TENANT).source == "grammar"


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
