"""The per-request `timings` object: llama-server's nine base keys plus the draft block."""

from __future__ import annotations

import msgspec

from app.acceptance import AcceptanceStats


class SpeculativeDiagnostics(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One request's speculative detail, in its `timings.speculative` when it asks
    (`speculative_diagnostics: true`): the rule its loop ran and what its verify rounds did.

    The counters are AcceptanceStats' (app/acceptance/stats.py); the closed forms appear only
    while MLXCEL_SPECULATIVE_ACCEPT_DIAG is on, the switch that makes the loop compute them.
    Sampler-match's acceptance sits at closed_form_coupled with coupled drafts and at
    closed_form_sum_prod without; the stochastic rule's at closed_form_sum_min.
    """

    rule: str
    identity: str  # what a seeded run equals: "token" (target-only's tokens), "distribution", "greedy"
    biased: bool  # the stream followed the target's argmax although the request sampled
    coupled: bool  # the drafts drew with the target's keys of their positions (speculative.coupled)
    rounds: int
    proposed: int
    positions_tested: int
    accepted: int
    per_position_acceptance: float  # accepted / positions_tested
    accepted_per_position: list[int]  # [i]: drafts accepted at draft position i
    accepted_lengths: list[int]  # [k]: rounds that accepted k drafts
    closed_form_sum_min: float | None = None
    closed_form_sum_prod: float | None = None
    closed_form_coupled: float | None = None  # where per_position_acceptance sits with coupled drafts


class Timings(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Base keys in llama-server's order; the draft block only when a drafter ran a verify round.

    prompt_ms covers queue wait plus target prefill; predicted_ms runs from the end of prefill
    through the last verify round. Rates divide by prompt_n and by predicted_n - 1 (the first
    token's time is in prompt_ms); a zero divisor gives 0. As llama-server counts them, cache_n
    is the prompt tokens restored from the prompt cache and prompt_n the ones prefilled.
    """

    cache_n: int
    prompt_n: int
    prompt_ms: float
    prompt_per_token_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_token_ms: float
    predicted_per_second: float
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    draft_rounds: int | None = None
    draft_kind: str | None = None
    speculative: SpeculativeDiagnostics | None = None  # only for a request that asked
    # false where the server runs MLX's own kernels (`execution.exact = false`): this row's
    # tokens may depend on the rows it shared ticks with; absent on an exact server
    exact: bool | None = None

    def partial(self) -> Timings:
        """So far, as a per-token frame carries them: the base keys (and `exact` where false) and the
        draft block once the row drafted (as llama-server's), not the request's speculative diagnostics."""
        return msgspec.structs.replace(self, speculative=None)


def _rate(n: int, ms: float) -> tuple[float, float]:
    """(ms per token, tokens per second), 0 for a zero divisor."""
    if n <= 0 or ms <= 0:
        return 0.0, 0.0
    return ms / n, 1000.0 * n / ms


def make_timings(
    cache_n: int,
    prompt_n: int,
    prompt_ms: float,
    predicted_n: int,
    predicted_ms: float,
    stats: AcceptanceStats | None = None,
    draft_kind: str | None = None,
    exact: bool = True,
) -> Timings:
    prompt_rate = _rate(prompt_n, prompt_ms)
    predicted_rate = _rate(predicted_n - 1, predicted_ms)
    timings = Timings(
        cache_n=cache_n,
        prompt_n=prompt_n,
        prompt_ms=prompt_ms,
        prompt_per_token_ms=prompt_rate[0],
        prompt_per_second=prompt_rate[1],
        predicted_n=predicted_n,
        predicted_ms=predicted_ms,
        predicted_per_token_ms=predicted_rate[0],
        predicted_per_second=predicted_rate[1],
        exact=None if exact else False,
    )
    if stats is None or stats.rounds == 0:
        return timings
    return msgspec.structs.replace(
        timings,
        draft_n=stats.proposed,
        draft_n_accepted=stats.accepted,
        draft_rounds=stats.rounds,
        draft_kind=draft_kind,
    )
