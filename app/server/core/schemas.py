"""Wire types every completion route's request stands on: a body's finite numbers, the sampling
fields every completion route accepts (llama-server's names), prompts, OpenAI's response_format.
Each API's own request extends SamplingFields in its package (native/, openai/, chat/).

Unknown fields are ignored, as llama-server ignores them; fields either API defines that this
server does not honour are declared from app/server/core/field_policy.py's tables and refused there.
A field left out takes the profile's sampling default. `n_predict`, `max_tokens` and
`max_completion_tokens` are one setting.
Every number must be finite: Litestar converts bodies leniently (strict=False), which turns the
strings "nan" and "inf" into floats, so `WireStruct` checks every float once decoding is done.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import msgspec
from msgspec import UNSET, inspect

from app.server.core import field_policy

# {"id or text": bias} or [[id or text, bias], ...]; a bias is a number, or false to ban
LogitBias = dict[str, float | bool] | list[tuple[int | str, float | bool]]


class PromptObject(msgspec.Struct, kw_only=True):
    """llama-server's `{"prompt_string": ..., "multimodal_data": [...]}` prompt element."""

    prompt_string: str | list[int | str]
    multimodal_data: Any = UNSET  # any value, to answer it with a clear 400 (no multimodal models here)


# One prompt: a string, token ids, or a mix; or a list of prompts (app/server/core/prompts.py decides which)
PromptInput = str | list[int | str | list[int | str] | PromptObject] | PromptObject


class WireStruct(msgspec.Struct, kw_only=True):
    """A request body: decoding fails with 400 when any float in it is NaN or infinite."""

    def __post_init__(self) -> None:
        for name, wire_name in _float_fields(type(self)):
            if not _all_finite(getattr(self, name)):
                raise ValueError(f"{wire_name}: numbers must be finite (NaN and infinity are refused)")


@functools.cache
def _float_fields(cls: type[msgspec.Struct]) -> tuple[tuple[str, str], ...]:
    """(attribute, wire name) of the fields whose type can hold a float, worked out once per class."""
    return tuple((f.name, f.encode_name) for f in inspect.type_info(cls).fields if _holds_float(f.type))


def _holds_float(kind: inspect.Type) -> bool:
    if isinstance(kind, inspect.FloatType):
        return True
    if isinstance(kind, inspect.UnionType):
        return any(_holds_float(k) for k in kind.types)
    if isinstance(kind, inspect.TupleType):
        return any(_holds_float(k) for k in kind.item_types)
    if isinstance(kind, inspect.ListType | inspect.VarTupleType):
        return _holds_float(kind.item_type)
    if isinstance(kind, inspect.DictType):
        return _holds_float(kind.value_type)
    return False


def _all_finite(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_all_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_all_finite(v) for v in value)
    return True


def with_unhonoured(name: str, table: dict[str, field_policy.Unhonoured], base: type[WireStruct]) -> Any:
    """`base` plus `table`'s fields (any JSON value, absent by default), for field_policy to check."""
    return msgspec.defstruct(name, field_policy.wire_fields(table), bases=(base,), kw_only=True)


class SamplingFields(with_unhonoured("LlamaServerFields", field_policy.LLAMA_SERVER, WireStruct), kw_only=True):
    """Fields every completion route accepts (llama-server names)."""

    n_predict: int | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stream: bool = False
    stop: str | list[str] | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: list[str] | None = None
    top_n_sigma: float | None = None
    typical_p: float | None = None
    dynatemp_range: float | None = None
    dynatemp_exponent: float | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    seed: int | None = None
    ignore_eos: bool = False
    n_indent: int = 0  # llama-server's: a new line indented by fewer columns ends the text (app/decoding/generation.py)
    t_max_predict_ms: int = 0  # llama-server's (an int64 there): after this many ms, the next new line ends the text
    logit_bias: LogitBias | None = None
    # llama-server's sampler chain: stage names or letters (app/sampling/chain.py); any other value
    # keeps the default chain, as llama-server keeps it
    samplers: Any = None
    n_probs: int = 0  # llama-server: the top candidates per token (completion_probabilities)
    post_sampling_probs: bool = False  # llama-server: probabilities after the sampler chain
    cache_prompt: bool = True
    timings_per_token: bool = False
    return_progress: bool = False  # llama-server: prompt_progress frames while a stream's prompt prefills
    return_tokens: bool = False
    speculative_diagnostics: bool = False  # this server's own: timings.speculative (docs/server.md)
    json_schema: dict[str, Any] | None = None  # constrain the output to this JSON schema
    grammar: str | None = None  # or to this GBNF grammar (root rule `root`)
    speculative_n_max: int | None = msgspec.field(default=None, name="speculative.n_max")
    speculative_n_min: int | None = msgspec.field(default=None, name="speculative.n_min")
    speculative_p_min: float | None = msgspec.field(default=None, name="speculative.p_min")

    def asked_logprobs(self) -> tuple[int, bool]:
        """(candidates per token, whether any log-probabilities are asked) in the route's spelling:
        llama-server's `n_probs` here; the OpenAI routes' requests read their own `logprobs`."""
        return self.n_probs, self.n_probs > 0


class JsonSchemaFormat(WireStruct, kw_only=True):
    """OpenAI's response_format.json_schema; the schema is always enforced, `strict` or not."""

    name: str | None = None
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseFormat(WireStruct, kw_only=True):
    """OpenAI's response_format: text, json_object (llama-server: optional `schema`), json_schema."""

    type: str
    json_schema: JsonSchemaFormat | None = None
    schema: dict[str, Any] | None = None


class ContentPart(WireStruct, kw_only=True):
    type: str
    text: str | None = None
