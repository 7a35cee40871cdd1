"""Sampling parameters, with llama-server's names and defaults."""

from __future__ import annotations

import msgspec

from app.sampling import chain
from app.sampling.dry import DEFAULT_BREAKERS, Breakers


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

    @property
    def is_greedy(self) -> bool:
        """Temperature 0 (or below) or top_k 1, that stage in the chain: the sampler is argmax and
        draws nothing. Under mirostat, whose chain is temperature then mirostat, temperature 0 only."""
        if self.mirostat:
            return self.temperature <= 0
        cold = self.temperature <= 0 and "temperature" in self.samplers
        return cold or (self.top_k == 1 and "top_k" in self.samplers)

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
        out = []
        if self.top_k < 0:
            out.append("top_k must be >= 0 (0 disables it)")
        if not 0.0 <= self.top_p <= 1.0:
            out.append("top_p must be within [0, 1]")
        if not 0.0 <= self.min_p <= 1.0:
            out.append("min_p must be within [0, 1]")
        if self.repeat_penalty <= 0:
            out.append("repeat_penalty must be > 0 (1.0 disables it)")
        if self.repeat_last_n < -1:
            out.append("repeat_last_n must be >= -1 (-1 means the whole context)")
        if not 0.0 <= self.xtc_probability <= 1.0:
            out.append("xtc_probability must be within [0, 1]")
        if not 0.0 <= self.xtc_threshold <= 1.0:
            out.append("xtc_threshold must be within [0, 1]")
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
