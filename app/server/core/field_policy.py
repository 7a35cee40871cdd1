"""Request fields llama-server or the OpenAI API define that this server does not honour.

A field that would change the answer if it were ignored is refused unless neutral; a field with
no effect here is accepted as a documented no-op and is not listed (`backend_sampling`:
docs/server.md's table says which). Each field below is declared on
the wire types (schemas.py builds them from these tables) as `Any`, so every JSON value reaches
`refuse_unhonoured` instead of a type error. A neutral value, one that asks for nothing (absent,
null, `mirostat: 0`, `typical_p: 1`), passes; any other answers 400 naming the field and why.
A field that only tunes a stage whose switch is listed here (`mirostat_tau`, `dry_base`,
`dynatemp_exponent`, ...) asks for nothing while its switch is off, and the switch answers 400
otherwise, so it is not listed. Fields neither API defines are ignored, as llama-server ignores
them, but for this server's own (OWN), which it honours. docs/server.md lists every field's state.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec import UNSET

from app.profiles.schema import Settings
from app.server.core import adapters
from app.server.errors import ApiError

Neutral = Callable[[Any], bool]


@dataclass(frozen=True)
class Unhonoured:
    neutral: Neutral  # whether a value asks for nothing (absent and null always do)
    reason: str  # why anything else is refused, and what to send instead


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return "number" if _number(value) else type(value).__name__


def equal(*values: Any) -> Neutral:
    """One of `values`, of the same kind: `mirostat: false` is not `mirostat: 0`."""
    return lambda v: any(v == n and _kind(v) == _kind(n) for n in values)


def at_most(limit: float) -> Neutral:
    return lambda v: _number(v) and v <= limit


def empty(v: Any) -> bool:
    return v in ("", [], {})


def nothing(_: Any) -> bool:
    return False


PIPELINE = (
    "is not in this server's sampler pipeline (llama-server's chain and mirostat), which every acceptance "
    "rule replays exactly"
)
NO_CONTEXT_SHIFT = "there is no context shift here: a row stops at its token limit and discards nothing"
TEXT_ONLY = "this server runs text-only checkpoints"
TEMPLATE_ONLY = "thinking is parsed only as reasoning_format says (app/server/reasoning.py), never budgeted or steered"

# llama-server's own fields (params_from_json_cmpl), read on every completion route, as llama-server reads them
LLAMA_SERVER: dict[str, Unhonoured] = {
    "adaptive_target": Unhonoured(at_most(0), f"adaptive-p {PIPELINE}; send -1"),
    "min_keep": Unhonoured(at_most(1), "the filters here keep at least one candidate, never more; send 0"),
    "n_keep": Unhonoured(equal(0, -1), f"{NO_CONTEXT_SHIFT}; send 0"),
    "n_discard": Unhonoured(equal(0), f"{NO_CONTEXT_SHIFT}; send 0"),
    "n_cmpl": Unhonoured(equal(1), "several completions per prompt: send n on /v1/completions or chat"),
    "n_cache_reuse": Unhonoured(
        equal(0), "the prompt cache reuses whole prompt prefixes only, never chunks moved by KV shifting; send 0"
    ),
    "image_data": Unhonoured(empty, f"older llama-server builds' image input: {TEXT_ONLY}"),
    # neutral where it asks for the loaded scales (`refuse_unhonoured` asks app/server/core/adapters.py)
    "lora": Unhonoured(empty, "no adapter is loaded (target.adapter_path)"),
    "reasoning_budget_tokens": Unhonoured(at_most(-1), f"{TEMPLATE_ONLY}, so it has no budget; send -1"),
    "thinking_forced_open": Unhonoured(equal(False), f"{TEMPLATE_ONLY}; send false"),
    "chat_format": Unhonoured(equal(0), f"{TEMPLATE_ONLY}; send 0 (content only)"),
    "chat_parser": Unhonoured(empty, TEMPLATE_ONLY),
    "speculative.type": Unhonoured(
        nothing, "the drafter is the profile's (drafter.kind); speculative.n_max: 0 turns it off for a request"
    ),
    "speculative.ngram_size_n": Unhonoured(nothing, "prompt-lookup n-gram sizes are profile settings"),
    "speculative.ngram_size_m": Unhonoured(nothing, "prompt-lookup n-gram sizes are profile settings"),
    "speculative.ngram_m_hits": Unhonoured(nothing, "prompt-lookup n-gram settings are profile settings"),
}
# The native route: llama-server reads `n` there as n_cmpl
NATIVE: dict[str, Unhonoured] = {
    "n": Unhonoured(equal(1), "the native route answers one completion per prompt; send n on /v1/completions"),
}
# OpenAI chat fields, and llama-server's chat-only ones (oaicompat_chat_params_parse)
CHAT: dict[str, Unhonoured] = {
    "functions": Unhonoured(empty, "the legacy function-calling spelling; send tools"),
    "function_call": Unhonoured(equal("none", "auto"), "the legacy function-calling spelling; send tool_choice"),
    "audio": Unhonoured(nothing, f"no audio output: {TEXT_ONLY}"),
    "modalities": Unhonoured(equal(["text"]), f'{TEXT_ONLY}; send ["text"]'),
    "prediction": Unhonoured(nothing, "predicted outputs are not supported (drafters propose tokens themselves)"),
    "web_search_options": Unhonoured(nothing, "there is no web search here"),
    "verbosity": Unhonoured(nothing, "no verbosity control"),
    "service_tier": Unhonoured(equal("auto", "default"), 'one service tier; send "auto" or "default"'),
    "store": Unhonoured(equal(False), "completions are not stored; send false"),
}
# OpenAI legacy completion fields
OPENAI_COMPLETION: dict[str, Unhonoured] = {
    "best_of": Unhonoured(
        equal(1), "choices are not ranked server-side; send n for several choices (best_of must be 1 or n)"
    ),
}
EVERY_FIELD = LLAMA_SERVER | NATIVE | CHAT | OPENAI_COMPLETION
# This server's own request fields, which neither API defines: honoured on every completion route
# (typed on schemas.SamplingFields, so a wrong type answers 400), never refused, never ignored.
OWN: dict[str, str] = {
    "speculative_diagnostics": "true: the request's speculative detail in timings.speculative (docs/operations.md)",
}


def wire_fields(table: dict[str, Unhonoured]) -> list[tuple[str, Any, Any]]:
    """msgspec.defstruct fields declaring `table`'s fields: any JSON value, absent by default."""
    return [(name.replace(".", "_"), Any, msgspec.field(default=UNSET, name=name)) for name in table]


@functools.cache
def _declared(cls: type[msgspec.Struct]) -> tuple[tuple[str, str], ...]:
    """(attribute, wire name) of the fields `cls` declares from these tables (as wire_fields
    declares them: a route that honours a name, as the OpenAI routes honour `n`, types it)."""
    fields = msgspec.structs.fields(cls)
    return tuple((f.name, f.encode_name) for f in fields if f.encode_name in EVERY_FIELD and f.type is Any)


def refuse_unhonoured(request: msgspec.Struct, settings: Settings) -> None:
    """400 for the first declared field set to a value that asks for something this server does not do."""
    for attribute, name in _declared(type(request)):
        value = getattr(request, attribute)
        if value is UNSET or value is None:
            continue
        if name == "lora":  # the profile's adapter, fused at load: its own scales ask for nothing
            problem = adapters.problem(value, settings)
            if problem is not None:
                raise ApiError(400, f"lora: not supported: {problem}")
            continue
        if EVERY_FIELD[name].neutral(value):
            continue
        if name == "best_of" and value == getattr(request, "n", 1):
            continue  # OpenAI: best_of = n returns every choice it generated, which n alone does
        raise ApiError(400, f"{name}: not supported: {EVERY_FIELD[name].reason}")
