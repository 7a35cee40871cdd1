"""Structured outputs: a grammar compiled once per request, and one matcher per row over it.

The engine is llguidance (docs/structured-output.md says why, with the measurement). A `Grammar`
is the engine's grammar text for a JSON schema, "any JSON object", or a GBNF grammar, already
checked (a request's in the worker process, app/sampling/grammar_worker.py), so a bad schema or
grammar is a `GrammarError` before any row exists. A `Constraint` is a row's matcher: it follows
the row's decided tokens, gives the next-token mask (within llguidance's fuel and a CPU-time
budget, or a `GrammarError` that ends that row alone), walks a proposal (cutting it at its first
violation, with one mask per verify row) and rolls back what it walked, and names the token the
grammar forces where it allows exactly one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import llguidance
import llguidance.hf
import llguidance.numpy
import mlx.core as mx
import numpy as np

from app.sampling.grammar_child import GrammarLimits, RefusedGrammarError, converted, label, short


class GrammarError(ValueError):
    """The schema or grammar cannot be compiled, or a row's mask overran its budget; the message
    says why (a 400: the grammar is the client's)."""


@dataclass(frozen=True)
class Grammar:
    """A checked grammar in llguidance's format; `source` names what it came from, `limits` what
    it was checked under (each row's matcher runs under the same).

    A request's grammar is checked in the worker process (app/sampling/grammar_worker.py); the
    constructors below compile in this process and are for the server's own, trusted grammars
    (tests, benchmarks).
    """

    text: str
    source: str  # json_object | json_schema | grammar
    limits: GrammarLimits = field(default_factory=GrammarLimits)

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's response_format json_object)."""
        return cls.json_schema({"type": "object"}, source="json_object")

    @classmethod
    def json_schema(cls, schema: object, source: str = "json_schema") -> Grammar:
        if not isinstance(schema, dict):
            raise GrammarError("the JSON schema must be an object")
        return cls._checked("json_schema", json.dumps(schema), source)

    @classmethod
    def gbnf(cls, text: str) -> Grammar:
        """A llama.cpp GBNF grammar (rule `root` is the start)."""
        return cls._checked("grammar", text, "grammar")

    @classmethod
    def _checked(cls, kind: str, text: str, source: str) -> Grammar:
        try:
            grammar = converted(kind, text)
        except RefusedGrammarError as exc:
            raise GrammarError(str(exc)) from exc
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
        if is_error:
            raise GrammarError(f"invalid {label(kind)}: {short(messages[0])}")
        return cls(text=grammar, source=source)


class GrammarVocabulary:
    """The target's tokenizer as the engine sees it; built once per model, shared by every row."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, eos_token_ids: list[int]) -> None:
        self.vocab_size = vocab_size
        self.eos = frozenset(eos_token_ids)
        self.tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size, eos_token=eos_token_ids)

    def constraint(self, grammar: Grammar) -> Constraint:
        matcher = llguidance.LLMatcher(self.tokenizer, grammar.text, limits=grammar.limits.parser_limits())
        limits = grammar.limits
        return Constraint(matcher, self.vocab_size, self.eos, limits.mask_budget_ms, limits.mask_mean_ms)


class Constraint:
    """One row's matcher. It follows the row's decided tokens; walks are rolled back after.

    EOS is never fed to the matcher: the mask allows it only where the grammar accepts, and the
    row stops at it, so it is tracked here as the end (`ended`).

    Two CPU budgets bound its masks: each one's (`mask_budget_ms`), and the row's whole: its masks
    may average `mask_mean_ms` each, with one mask's budget of slack. An ambiguous grammar whose
    every mask stays under the first still grows without bound; the second ends such a row after
    tens of tokens (and costs an ordinary grammar, whose masks take microseconds, nothing).
    """

    def __init__(
        self,
        matcher: llguidance.LLMatcher,
        vocab_size: int,
        eos_token_ids: frozenset[int],
        mask_budget_ms: float = GrammarLimits.mask_budget_ms,
        mask_mean_ms: float = GrammarLimits.mask_mean_ms,
    ) -> None:
        if matcher.is_error():
            raise GrammarError(f"invalid grammar: {short(matcher.get_error())}")
        self.matcher = matcher
        self.mask_budget_ns = int(mask_budget_ms * 1e6)
        self.mask_mean_ns = int(mask_mean_ms * 1e6)
        self.spent_ns = 0  # CPU time of every mask so far
        self.masks = 0
        self.vocab_size = vocab_size
        self.eos = eos_token_ids
        self.ended = False
        self._bits = llguidance.numpy.allocate_token_bitmask(1, vocab_size)

    def allowed(self) -> np.ndarray:
        """Bool `[V]`: the tokens the grammar allows next (EOS only where it accepts).

        Past the end every token is allowed: such a row is never emitted (the row stops at its
        EOS), and an all-forbidden row would make the sampler's row NaN.
        """
        if self.ended:
            return np.ones(self.vocab_size, dtype=bool)
        # CPU time of this thread, not wall time: a busy machine must not fail a cheap grammar
        started = time.thread_time_ns()
        llguidance.numpy.fill_next_token_bitmask(self.matcher, self._bits, 0)
        spent = time.thread_time_ns() - started
        if self.matcher.is_error():  # out of llguidance's fuel (the row's output made it too ambiguous)
            raise GrammarError(f"grammar: computing the next token's mask failed: {short(self.matcher.get_error())}")
        self.spent_ns += spent
        self.masks += 1
        if spent > self.mask_budget_ns:
            raise GrammarError(
                f"grammar: one token's mask took {spent / 1e6:.0f} ms of CPU, over the "
                f"{self.mask_budget_ns / 1e6:.0f} ms budget (grammar.mask_budget_ms)"
            )
        if self.spent_ns > self.mask_budget_ns + self.mask_mean_ns * self.masks:
            raise GrammarError(
                f"grammar: this row's {self.masks} masks took {self.spent_ns / 1e6:.0f} ms of CPU, over "
                f"{self.mask_mean_ns / 1e6:g} ms each (grammar.mask_mean_ms) plus one mask's budget"
            )
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")
        return bits[: self.vocab_size].astype(bool)

    @property
    def spent_s(self) -> float:
        """CPU seconds of this row's masks so far (the scheduler weighs a row's next tick by them)."""
        return self.spent_ns / 1e9

    def consume(self, tokens: list[int]) -> None:
        """Follow decided tokens (the masks made them valid); none follows an EOS."""
        for token in tokens:
            if self.ended or token in self.eos:
                self.ended = True
                return
            if not self.matcher.consume_token(token):
                raise GrammarError(f"grammar: a decided token broke the grammar: {short(self.matcher.get_error())}")

    def drafted(self, token: int) -> bool:
        """Follow one draft provisionally (undo with `rollback`); False at an EOS, which ends
        the chain and is not followed."""
        if token in self.eos:
            return False
        self.matcher.consume_token(token)
        return True

    def rollback(self, drafts: int) -> None:
        self.matcher.rollback(drafts)

    def walk(self, drafts: list[int]) -> tuple[int, mx.array]:
        """How many drafts the grammar allows in a row, and the mask of each verify row `[n+1, V]`.

        Row i is the mask after the first i drafts. The chain is cut at its first violation, and
        after an EOS (nothing past it is emitted). The walk is rolled back.
        """
        rows, consumed = [], 0
        for draft in drafts:
            rows.append(self.allowed())
            if not rows[-1][draft]:
                break
            if draft in self.eos:
                rows.append(np.ones(self.vocab_size, dtype=bool))
                break
            self.matcher.consume_token(draft)
            consumed += 1
        else:
            rows.append(self.allowed())
        self.matcher.rollback(consumed)
        return len(rows) - 1, mx.array(np.stack(rows))

    def forced(self, limit: int) -> list[int]:
        """Up to `limit` tokens the grammar forces in a row (each the one token its mask allows).

        Each has probability 1 under the masked distribution whatever the sampler, so emitting
        it without a target forward is exact (jump-forward). The walk is rolled back.
        """
        tokens: list[int] = []
        consumed = 0
        while len(tokens) < limit and not self.ended:
            only = np.flatnonzero(self.allowed())
            if len(only) != 1:
                break
            tokens.append(int(only[0]))
            if tokens[-1] in self.eos:
                break
            self.matcher.consume_token(tokens[-1])
            consumed += 1
        self.matcher.rollback(consumed)
        return tokens


def masked(logits: mx.array, masks: mx.array) -> mx.array:
    """Logits `[R, V]` with the tokens each row's mask `[R, V]` forbids at -inf."""
    return mx.where(masks, logits, -mx.inf)
