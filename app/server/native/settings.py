"""The settings a row runs with, as llama-server reports them: each /completion answer's
`generation_settings`, a busy slot's `params` and /props' defaults."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from app.decoding.builder import RowRequest
from app.sampling import SamplingParams

SAMPLER_KNOBS = tuple(f for f in SamplingParams.__struct_fields__ if f not in ("logit_bias", "dry_breakers", "infill"))
Report = TypeVar("Report", bound=msgspec.Struct)


class SamplerSettings(msgspec.Struct, kw_only=True):
    """The sampler's knobs (app.sampling.SamplingParams without its logit bias and tokenized breakers)."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repeat_penalty: float
    repeat_last_n: int
    presence_penalty: float
    frequency_penalty: float
    xtc_probability: float
    xtc_threshold: float
    dry_multiplier: float
    dry_base: float
    dry_allowed_length: int
    dry_penalty_last_n: int
    dry_sequence_breakers: list[str]
    top_n_sigma: float
    typical_p: float
    dynatemp_range: float
    dynatemp_exponent: float
    mirostat: int
    mirostat_tau: float
    mirostat_eta: float
    samplers: list[str]  # the chain that runs, in order (llama-server's names)


class LogitBiasEntry(msgspec.Struct, kw_only=True):
    """One token's bias as llama-server lists it; a ban (false, or ignore_eos on an
    end-of-generation token) is -inf, which JSON cannot spell: null, as llama-server writes it."""

    bias: float | None
    token: int


class SpeculativeLimits(msgspec.Struct, kw_only=True):
    """The speculative limits a row runs with, as llama-server names them: declared here once, for
    every report below that carries them (`with_limits`)."""

    speculative_n_max: int = msgspec.field(name="speculative.n_max")
    speculative_n_min: int = msgspec.field(name="speculative.n_min")
    speculative_p_min: float = msgspec.field(name="speculative.p_min")


def with_limits(before: str | None = None) -> Callable[[type[Report]], type[Report]]:
    """The report, its SpeculativeLimits' fields after its own (or before its field `before`):
    msgspec writes fields in the order they are declared, llama-server's reports have the limits
    there, and a Struct cannot inherit the fields of two Structs. A report's own fields have no
    defaults."""

    def rebuilt(report: type[Report]) -> type[Report]:
        (base,) = report.__bases__
        own = [field for field in msgspec.structs.fields(report) if field.name not in base.__struct_fields__]
        at = len(own) if before is None else [field.name for field in own].index(before)
        fields = own[:at] + list(msgspec.structs.fields(SpeculativeLimits)) + own[at:]
        assert all(field.required for field in fields), report
        declared = [(field.name, field.type, msgspec.field(name=field.encode_name)) for field in fields]
        made = msgspec.defstruct(report.__name__, declared, bases=(base,), kw_only=True, module=report.__module__)
        made.__doc__ = report.__doc__
        return made

    return rebuilt


@with_limits()
class GenerationSettings(SamplerSettings, kw_only=True):
    """What one request ran with: the seed actually used and the speculative limits."""

    logit_bias: list[LogitBiasEntry]
    model: str
    n_predict: int
    seed: int
    stop: list[str]
    ignore_eos: bool


@with_limits()
class SlotParams(SamplerSettings, kw_only=True):
    logit_bias: list[LogitBiasEntry]
    n_predict: int


class DefaultParams(SlotParams, kw_only=True):
    """What a request that sets nothing runs with, as llama-server's /props `params`."""

    seed: int  # -1: each request draws its own


@with_limits(before="params")
class DefaultGenerationSettings(SamplerSettings, kw_only=True):
    """The defaults at the top level (as this server has always listed them) and in `params`
    (as llama-server lists them)."""

    n_predict: int
    n_ctx: int | None  # null until the model is loaded
    params: DefaultParams


def logit_bias_entries(params: SamplingParams) -> list[LogitBiasEntry]:
    banned = float("-inf")
    return [LogitBiasEntry(bias=None if b == banned else b, token=t) for t, b in params.logit_bias.items()]


def sampler_knobs(source: msgspec.Struct) -> dict[str, Any]:
    """The sampler's knobs of a SamplingParams or the profile's sampling defaults."""
    return {name: getattr(source, name) for name in SAMPLER_KNOBS}


def generation_settings(request: RowRequest, model: str, n_max: int) -> GenerationSettings:
    """What a row ran with: its request as validated and `n_max`, its width cap as its builder
    resolved it (Finished.n_max)."""
    params = request.sampling
    return GenerationSettings(
        **sampler_knobs(params),
        logit_bias=logit_bias_entries(params),
        model=model,
        n_predict=request.max_tokens,
        seed=request.seed,
        stop=list(request.stop),
        ignore_eos=request.ignore_eos,
        speculative_n_max=n_max,
        speculative_n_min=request.n_min,
        speculative_p_min=request.p_min,
    )
