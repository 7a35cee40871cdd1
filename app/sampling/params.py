"""Sampling parameters, with llama-server's names and defaults, and the domain of each."""

from __future__ import annotations

import math
from typing import Any

import msgspec

from app.sampling import chain
from app.sampling.dry import DEFAULT_BREAKERS, Breakers

FLOAT32_MAX = 3.4028234663852886e38
# A logit moves by at most this much per adjustment (a bias, a presence penalty, a frequency
# penalty per occurrence): with a repeat penalty within [1e-6, 1e6] and the temperature floored at
# 1e-6 (SamplerPipeline._temperature), a million occurrences keep every logit finite in float32.
LOGIT_SHIFT = 1e15


class Domain(msgspec.Struct, frozen=True):
    """The values a float parameter may take (both ends included), and what it means outside."""

    low: float
    high: float
    meaning: str = ""


ANY = Domain(-FLOAT32_MAX, FLOAT32_MAX)
PROBABILITY = Domain(0.0, 1.0)
SHIFT = Domain(-LOGIT_SHIFT, LOGIT_SHIFT)
# Every float parameter, in one table: the sampler computes in float32, so a value finite in 64
# bits but not in 32 (1e39) turned a row's logits NaN (garbage at T > 0, an empty answer at T = 0).
FLOAT_DOMAINS: dict[str, Domain] = {
    "temperature": Domain(-FLOAT32_MAX, FLOAT32_MAX, "0 or below is greedy"),
    "top_p": PROBABILITY,
    "min_p": PROBABILITY,
    "repeat_penalty": Domain(1e-6, 1e6, "1.0 disables it"),
    "presence_penalty": SHIFT,
    "frequency_penalty": SHIFT,
    "xtc_probability": PROBABILITY,
    "xtc_threshold": PROBABILITY,
    "dry_multiplier": Domain(0.0, FLOAT32_MAX, "0 disables it"),
    "dry_base": ANY,
    "top_n_sigma": ANY,
    "typical_p": ANY,
    "dynatemp_range": ANY,
    "dynatemp_exponent": Domain(0.0, FLOAT32_MAX),
    "mirostat_tau": Domain(0.0, FLOAT32_MAX),
    "mirostat_eta": Domain(0.0, FLOAT32_MAX),
}
LOGIT_BIAS = SHIFT  # or false (-inf in llama-server's spelling): the token is banned


def out_of_domain(name: str, value: float, domain: Domain) -> str | None:
    """Why `value` cannot be `name` (None: it can)."""
    if domain.low <= value <= domain.high:
        return None
    meaning = f"; {domain.meaning}" if domain.meaning else ""
    return f"{name} must be within [{domain.low:g}, {domain.high:g}]{meaning}, got {value:g}"


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """What shapes the target's next-token distribution `p` (and the drafter's `q`)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_BREAKERS
    dry_breakers: Breakers = {}  # the breakers as token sequences (app/sampling/dry.py::sequence_breakers)
    top_n_sigma: float = -1.0
    typical_p: float = 1.0
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    logit_bias: dict[int, float] = {}
    samplers: tuple[str, ...] = chain.DEFAULT  # the stages that run, in order (app/sampling/chain.py)
    infill: Any = None  # the infill stage's tables (app/sampling/infill.py InfillVocabulary), set where it runs

    @property
    def is_greedy(self) -> bool:
        """Temperature 0 (or below) or top_k 1, that stage in the chain (before any infill stage):
        the sampler is argmax and draws nothing. Under mirostat, whose chain is temperature then
        mirostat, temperature 0 only."""
        if self.mirostat:
            return self.temperature <= 0
        deciding = [
            at
            for at, stage in enumerate(self.samplers)
            if (stage == "temperature" and self.temperature <= 0) or (stage == "top_k" and self.top_k == 1)
        ]
        # the infill stage may move the mass (to an end token, to a merged prefix): argmax is the
        # sampler only where a greedy stage ran before it
        return bool(deciding) and ("infill" not in self.samplers or deciding[0] < self.samplers.index("infill"))

    @property
    def has_penalties(self) -> bool:
        active = self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        return active and self.repeat_last_n != 0 and not self.mirostat and "penalties" in self.samplers

    @property
    def has_dry(self) -> bool:
        active = self.dry_multiplier != 0.0 and self.dry_base >= 1.0 and self.dry_penalty_last_n != 0
        return active and not self.mirostat and "dry" in self.samplers

    @property
    def uses_coin(self) -> bool:
        """Whether XTC can apply, so each sampled position also takes a coin."""
        on = self.xtc_probability > 0.0 and self.xtc_threshold <= 0.5
        return on and not self.mirostat and "xtc" in self.samplers

    @property
    def context_length(self) -> int:
        """The longest history window a stage reads (-1: all of it; mirostat reads the last token)."""
        lengths = [self.repeat_last_n if self.has_penalties else 0, self.dry_penalty_last_n if self.has_dry else 0]
        lengths.append(1 if self.mirostat and not self.is_greedy else 0)
        return -1 if -1 in lengths else max(lengths)

    def problems(self, vocab_size: int | None = None) -> list[str]:
        """Human-readable reasons these parameters are invalid (empty when valid)."""
        out = [
            problem
            for name, domain in FLOAT_DOMAINS.items()
            if (problem := out_of_domain(name, getattr(self, name), domain)) is not None
        ]
        biases = [(t, b) for t, b in self.logit_bias.items() if not math.isinf(b) or b > 0]
        out.extend(
            f"logit_bias for token {token}: {problem}"
            for token, bias in biases
            if (problem := out_of_domain("a bias", bias, LOGIT_BIAS)) is not None
        )
        if self.top_k < 0:
            out.append("top_k must be >= 0 (0 disables it)")
        if self.repeat_last_n < -1:
            out.append("repeat_last_n must be >= -1 (-1 means the whole context)")
        if self.mirostat not in (0, 1, 2):
            out.append("mirostat must be 0 (off), 1 or 2")
        if self.dry_allowed_length < 0:
            out.append("dry_allowed_length must be >= 0")
        if self.dry_penalty_last_n < -1:
            out.append("dry_penalty_last_n must be >= -1 (-1 means the whole context, 0 turns DRY off)")
        if vocab_size is not None:
            bad = [t for t in self.logit_bias if not 0 <= t < vocab_size]
            if bad:
                out.append(f"logit_bias names token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")
        return out
