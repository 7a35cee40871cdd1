"""The grammar worker's own process: untrusted grammars are converted and compiled here.

llguidance's conversion and compile steps can overflow the native stack (a long `$ref` chain),
run for minutes (GBNF conversion grows about cubically with the rules) or allocate without
bound; in this process a crash, a timeout or the memory limit costs the worker, never the
server (app/sampling/grammar_worker.py respawns it). Besides checking a grammar, the worker
computes its first mask with the real tokenizer, so a grammar that fails at the first token or
admits nothing is refused before any row runs it.

Run as a script (`python grammar_child.py`): it imports only the standard library and llguidance,
so a respawn costs the tokenizer's build, not the server's imports. Frames on stdin and stdout
are a 4-byte big-endian length and UTF-8 JSON: first the setup (tokenizer, limits), answered
`{"ready": true}`; then `{"kind", "text"}` requests, answered `{"grammar": text}` or
`{"error": message}`.
"""

from __future__ import annotations

import json
import resource
import signal
import struct
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, BinaryIO

import llguidance
import llguidance.numpy

# Compact JSON (no free whitespace between tokens): a model that may emit any amount of
# whitespace inside an object can loop on it until max_tokens; llama-server's converter does
# the same (at most one space).
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False}
MAX_MESSAGE_CHARS = 240  # llguidance's messages can quote the grammar: never more than this reaches a client or log
HEADER = struct.Struct(">I")


@dataclass(frozen=True)
class GrammarLimits:
    """What an untrusted grammar may cost (the profile's [grammar] table, docs/structured-output.md).

    The first group is checked in pure Python before compiling (app/sampling/grammar_bounds.py);
    the worker enforces the time and memory limits; the llguidance fuel values bound every mask.
    """

    max_bytes: int = 256 * 1024
    max_rules: int = 1000
    max_ref_depth: int = 128
    max_definitions: int = 2000
    max_alternatives: int = 1000
    max_property_name: int = 1024
    check_timeout_s: float = 1.0
    compile_timeout_s: float = 2.0
    compile_memory_mb: int = 2048
    max_queue: int = 16
    cache_entries: int = 256
    mask_budget_ms: float = 100.0
    mask_mean_ms: float = 2.0
    matcher_budget_ms: float = 500.0
    max_items_in_row: int = 2000
    initial_lexer_fuel: int = 1_000_000
    step_lexer_fuel: int = 200_000
    step_max_items: int = 20_000
    max_lexer_states: int = 50_000
    max_grammar_size: int = 200_000

    def parser_limits(self) -> llguidance.LLParserLimits:
        """llguidance's own limits; verbose_errors off, since verbose errors quote the grammar."""
        return llguidance.LLParserLimits(
            max_items_in_row=self.max_items_in_row,
            initial_lexer_fuel=self.initial_lexer_fuel,
            step_lexer_fuel=self.step_lexer_fuel,
            step_max_items=self.step_max_items,
            max_lexer_states=self.max_lexer_states,
            max_grammar_size=self.max_grammar_size,
            verbose_errors=False,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class RefusedGrammarError(ValueError):
    """The grammar was checked and refused; the message (capped) says why."""


def short(message: str) -> str:
    """The first line of an llguidance message, capped (its later lines are parser state)."""
    first = message.strip().splitlines()[0] if message.strip() else "unknown error"
    return first if len(first) <= MAX_MESSAGE_CHARS else first[:MAX_MESSAGE_CHARS] + "..."


def converted(kind: str, text: str) -> str:
    """llguidance's grammar text for a GBNF grammar or a JSON schema (as JSON text)."""
    try:
        if kind == "grammar":
            return llguidance.grammar_from("gbnf", text)
        return llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS)
    except (ValueError, TypeError) as exc:
        raise RefusedGrammarError(f"invalid {label(kind)}: {short(str(exc))}") from exc


def label(kind: str) -> str:
    return "grammar" if kind == "grammar" else "JSON schema"


def checked(kind: str, text: str, tokenizer: llguidance.LLTokenizer, limits: GrammarLimits) -> str:
    """The grammar text, once it compiles within the limits and its first mask admits a token."""
    grammar = converted(kind, text)
    parser_limits = limits.parser_limits()
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer, limits=parser_limits)
    if is_error:
        raise RefusedGrammarError(f"invalid {label(kind)}: {short(messages[0] if messages else '')}")
    started = time.thread_time()
    matcher = llguidance.LLMatcher(tokenizer, grammar, limits=parser_limits)
    if matcher.is_error():
        raise RefusedGrammarError(f"invalid {label(kind)}: {short(matcher.get_error())}")
    first_mask(matcher, tokenizer, kind)
    # The engine thread builds a matcher and its first mask again for every row of the request.
    spent_ms = (time.thread_time() - started) * 1000
    if spent_ms > limits.matcher_budget_ms:
        raise RefusedGrammarError(
            f"{label(kind)}: a row's matcher took {spent_ms:.0f} ms of CPU to build, over the "
            f"{limits.matcher_budget_ms:g} ms budget (grammar.matcher_budget_ms)"
        )
    return grammar


def first_mask(matcher: llguidance.LLMatcher, tokenizer: llguidance.LLTokenizer, kind: str) -> None:
    """Refuse a grammar whose first mask overruns the engine's limits or allows no token at all.

    The tokens the grammar forces from the start are followed too: a grammar that forces an
    endless output (two required properties that refer to each other) fails only there.
    """
    bits = llguidance.numpy.allocate_token_bitmask(1, tokenizer.vocab_size)
    llguidance.numpy.fill_next_token_bitmask(matcher, bits, 0)
    if not matcher.is_error() and not bits.any():
        raise RefusedGrammarError(f"{label(kind)}: no output satisfies it (its first token admits nothing)")
    forced = [] if matcher.is_error() else matcher.compute_ff_tokens()
    if forced and matcher.consume_tokens(forced):
        llguidance.numpy.fill_next_token_bitmask(matcher, bits, 0)
    if matcher.is_error():
        raise RefusedGrammarError(f"{label(kind)}: fails at the first token: {short(matcher.get_error())}")


def read_frame(stream: BinaryIO) -> Any:
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None  # the server closed the pipe: it is gone or shutting down
    (size,) = HEADER.unpack(header)
    return json.loads(stream.read(size))


def write_frame(stream: BinaryIO, value: Any) -> None:
    body = json.dumps(value).encode()
    stream.write(HEADER.pack(len(body)) + body)
    stream.flush()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the server's to handle
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    setup = read_frame(requests)
    if setup is None:
        return
    limits = GrammarLimits(**setup["limits"])
    memory = limits.compile_memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    tokenizer = llguidance.LLTokenizer(setup["tokenizer"], n_vocab=setup["n_vocab"], eos_token=setup["eos"])
    write_frame(answers, {"ready": True})
    while (request := read_frame(requests)) is not None:
        try:
            answer = {"grammar": checked(request["kind"], request["text"], tokenizer, limits)}
        except RefusedGrammarError as exc:
            answer = {"error": str(exc)}
        except MemoryError:
            needed = f"compiling needs more than {limits.compile_memory_mb} MB (grammar.compile_memory_mb)"
            answer = {"error": f"{label(request['kind'])}: {needed}"}
        write_frame(answers, answer)


if __name__ == "__main__":
    main()
