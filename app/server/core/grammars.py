"""A request's grammar, checked off the event loop: bounds here, the compile in the worker process.

Nothing a request sends reaches llguidance in the server process before the worker has compiled
it within its limits (app/sampling/grammar_worker.py); the HTTP layer only turns the verdict
into a 400 (refused) or a 503 (the worker's queue is full).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec

from app.profiles.schema import MAX_GRAMMAR_QUEUE, GrammarSettings
from app.sampling.grammar import Grammar, GrammarError
from app.sampling.grammar_bounds import check_gbnf, check_schema
from app.sampling.grammar_child import GrammarLimits
from app.sampling.grammar_worker import GrammarCompiler, GrammarUnavailableError, WorkerVocabulary
from app.server.engine_view import EngineView
from app.server.errors import ApiError

LIMIT_FIELDS = tuple(field.name for field in dataclasses.fields(GrammarLimits))


def limits(settings: GrammarSettings) -> GrammarLimits:
    """The profile's [grammar] table as the sampling layer's limits (max_tools stays in the HTTP layer)."""
    values = msgspec.structs.asdict(settings)
    return GrammarLimits(**{name: values[name] for name in LIMIT_FIELDS})


class Grammars:
    """The server's grammar compiler, for the serving engine's tokenizer and [grammar] limits.

    A reload that changes either gets a new compiler (and worker); the old one is closed.
    """

    def __init__(self) -> None:
        self._compiler: GrammarCompiler | None = None
        self._tokenizer: Any = None  # the one the compiler's worker was built from
        self._lock = threading.Lock()
        # Its own threads, not the loop's default executor (which renders chat templates and
        # tokenizes prompts): grammars waiting for the worker must not hold other requests up.
        # One thread per waiting request, so grammar.max_queue counts every one.
        self._threads = ThreadPoolExecutor(max_workers=MAX_GRAMMAR_QUEUE + 1, thread_name_prefix="grammar")

    async def compiled(self, engine: EngineView, tenant: str, kind: str, value: Any) -> Grammar:
        """The checked grammar of requests.requested_grammar's (kind, value) for `tenant`, whose
        verdicts the compiler caches apart from other tenants'; ApiError if refused."""
        grammar_limits = limits(engine.settings.grammar)
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._threads, self._compile, engine, grammar_limits, tenant, kind, value)
        except GrammarError as exc:
            raise ApiError(400, str(exc)) from exc
        except GrammarUnavailableError as exc:
            raise ApiError(503, str(exc), "unavailable_error") from exc

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            if self._compiler is not None:
                self._compiler.close()
            self._compiler = self._tokenizer = None

    def _compile(
        self, engine: EngineView, grammar_limits: GrammarLimits, tenant: str, kind: str, value: Any
    ) -> Grammar:
        """Blocking, so off the event loop: the bounds walk a schema of up to max_bytes, and the
        first compile also serializes the tokenizer."""
        kind, text, source = source_text(kind, value, grammar_limits)
        return self._compiler_for(engine, grammar_limits).compile(kind, text, source, tenant)

    def _compiler_for(self, engine: EngineView, grammar_limits: GrammarLimits) -> GrammarCompiler:
        tokenizer = engine.tokenizer
        with self._lock:
            current = self._compiler
            if current is None or self._tokenizer is not tokenizer or current.limits != grammar_limits:
                if current is not None:
                    current.close()
                vocabulary = WorkerVocabulary.of(tokenizer._tokenizer, engine.vocab_size, list(tokenizer.eos_token_ids))
                self._compiler, self._tokenizer = GrammarCompiler(vocabulary, grammar_limits), tokenizer
            return self._compiler


def source_text(kind: str, value: Any, grammar_limits: GrammarLimits) -> tuple[str, str, str]:
    """(kind, the text the worker compiles, the grammar's source), once within the cheap bounds."""
    try:
        if kind == "grammar":
            check_gbnf(value, grammar_limits)
            return "grammar", value, "grammar"
        if value is None:
            return "json_schema", '{"type": "object"}', "json_object"
        if not isinstance(value, dict):
            raise GrammarError("the JSON schema must be an object")
        text = json.dumps(value)
        check_schema(value, text, grammar_limits)
        return "json_schema", text, "json_schema"
    except GrammarError as exc:
        raise ApiError(400, str(exc)) from exc
