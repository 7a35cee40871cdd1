"""Which rule a round loop runs: decided once per request, before any distribution is built."""

from __future__ import annotations

from enum import StrEnum


class Rule(StrEnum):
    """Stable identifiers: they appear in summaries, events, /props and timings consumers."""

    GREEDY_ARGMAX = "greedy-argmax"
    SAMPLER_MATCH = "sampler-match"
    STOCHASTIC = "stochastic"
    SAMPLER_MATCH_NO_Q = "sampler-match-no-proposal-distribution"
    ARGMAX_AGAINST_ARGMAX = "argmax-against-argmax"

    @property
    def lossless(self) -> bool:
        return self is not Rule.ARGMAX_AGAINST_ARGMAX

    @property
    def width_independent(self) -> bool:
        """A row's tokens are the same at every width, whatever was drafted: each emitted token
        is the target's argmax (the argmax rules) or the target stream's own draw at its position
        (sampler-match). The stochastic rule's accept test and residual read the drafts' q."""
        return self is not Rule.STOCHASTIC

    @property
    def identity(self) -> str:
        """What a seeded run under this rule equals (docs/acceptance-rules.md): "token", target-only's
        tokens (sampler-match, and greedy argmax, which is sampler-match); "distribution", a sample
        of the same distribution (the stochastic rule's residual depends on q); "greedy", the
        target's greedy stream (argmax-against-argmax)."""
        return IDENTITIES.get(self, "token")


IDENTITIES = {Rule.STOCHASTIC: "distribution", Rule.ARGMAX_AGAINST_ARGMAX: "greedy"}
DESCRIPTIONS = {
    Rule.GREEDY_ARGMAX: "greedy argmax (lossless)",
    Rule.SAMPLER_MATCH: "sampler-match (lossless)",
    Rule.STOCHASTIC: "stochastic (modified rejection sampling)",
    Rule.SAMPLER_MATCH_NO_Q: (
        "sampler-match (lossless): stochastic acceptance was requested but the drafter reports no proposal distribution"
    ),
    Rule.ARGMAX_AGAINST_ARGMAX: "argmax-against-argmax (exact at temperature 0, biased above it)",
}
ONE_HOT_NOTE = (
    "sampler-match (lossless): prompt-lookup proposals are one-hot, so sampler-match already "
    "accepts at the ceiling sum_x min(p, q) = p(d) and there is nothing to opt into"
)


def select_rule(greedy: bool, *, stochastic: bool, reports_distribution: bool, one_hot_proposals: bool = False) -> Rule:
    """The contract's table for the classic and prompt-lookup paths (the loop plan asks it once
    per sampler class at startup).

    Greedy samplers (temperature 0 or top_k 1) return the argmax rule first, so temperature-0
    output never depends on the opt-in and draws nothing.
    """
    if greedy:
        return Rule.GREEDY_ARGMAX
    if not stochastic or one_hot_proposals:
        return Rule.SAMPLER_MATCH
    if not reports_distribution:
        return Rule.SAMPLER_MATCH_NO_Q
    return Rule.STOCHASTIC


def describe(rule: Rule, *, one_hot_proposals: bool = False) -> str:
    if rule is Rule.SAMPLER_MATCH and one_hot_proposals:
        return ONE_HOT_NOTE
    return DESCRIPTIONS[rule]
