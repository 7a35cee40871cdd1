"""Acceptance counters for one run, and the contract's stdout summary lines."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.acceptance.rules import Verdict


@dataclass
class AcceptanceStats:
    """Counters of one request (or CLI run).

    proposed counts every drafted position; positions_tested stops at each chain's first
    rejection; accepted counts drafts that were accepted and emitted. The mean accepted length
    per round including the bonus token is (accepted + rounds) / rounds.
    """

    rounds: int = 0
    proposed: int = 0
    positions_tested: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    accepted_lengths: list[int] = field(default_factory=list)  # [k]: rounds that accepted k drafts
    sum_min_total: float = 0.0
    sum_prod_total: float = 0.0
    coupled_total: float = 0.0
    diagnosed_positions: int = 0
    _last_accepted: int = 0

    def observe(self, proposed: int, verdict: Verdict) -> None:
        self.rounds += 1
        self.proposed += proposed
        self.positions_tested += verdict.tested
        self.accepted += verdict.accepted
        self._last_accepted = verdict.accepted
        if len(self.accepted_per_position) < proposed:
            self.accepted_per_position.extend([0] * (proposed - len(self.accepted_per_position)))
        for i in range(verdict.accepted):
            self.accepted_per_position[i] += 1
        self._count_length(verdict.accepted, 1)

    def _count_length(self, accepted: int, rounds: int) -> None:
        if len(self.accepted_lengths) <= accepted:
            self.accepted_lengths.extend([0] * (accepted + 1 - len(self.accepted_lengths)))
        self.accepted_lengths[accepted] += rounds

    def observe_closed_forms(self, sum_min: list[float], sum_prod: list[float], coupled: list[float]) -> None:
        """Add sum_x min(p, q), sum_x p q and the coupled agreement of the positions a round tested."""
        self.sum_min_total += sum(sum_min)
        self.sum_prod_total += sum(sum_prod)
        self.coupled_total += sum(coupled)
        self.diagnosed_positions += len(sum_min)

    def clamp_last_round(self, emitted: int) -> None:
        """A stop inside the last round emitted only `emitted` of its tokens: uncount the rest."""
        excess = self._last_accepted - min(self._last_accepted, emitted)
        for i in range(self._last_accepted - excess, self._last_accepted):
            self.accepted_per_position[i] -= 1
        self.accepted -= excess
        if excess:  # the round moves to the shorter length it kept
            self._count_length(self._last_accepted, -1)
            self._count_length(self._last_accepted - excess, 1)
        self._last_accepted -= excess

    @property
    def per_position_acceptance(self) -> float:
        return self.accepted / self.positions_tested if self.positions_tested else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accepted_len(self) -> float:
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def closed_form_sum_min(self) -> float:
        return self.sum_min_total / self.diagnosed_positions if self.diagnosed_positions else 0.0

    @property
    def closed_form_sum_prod(self) -> float:
        return self.sum_prod_total / self.diagnosed_positions if self.diagnosed_positions else 0.0

    @property
    def closed_form_coupled(self) -> float:
        return self.coupled_total / self.diagnosed_positions if self.diagnosed_positions else 0.0


def summary_line(rule: str, stats: AcceptanceStats, description: str) -> str:
    return (
        f"[Speculative acceptance] rule={rule} rounds={stats.rounds} proposed={stats.proposed} "
        f"positions_tested={stats.positions_tested} accepted={stats.accepted} "
        f"per_position_acceptance={stats.per_position_acceptance:.4f} "
        f"acceptance_rate={stats.acceptance_rate:.4f} mean_accepted_len={stats.mean_accepted_len:.4f} "
        f"({description})"
    )


def diagnostic_line(stats: AcceptanceStats) -> str:
    return (
        f"[Speculative acceptance diagnostic] closed_form_sum_min={stats.closed_form_sum_min:.4f} "
        f"closed_form_sum_prod={stats.closed_form_sum_prod:.4f} (the measured per-position acceptance sits "
        f"at closed_form_coupled={stats.closed_form_coupled:.4f} under the default sampler-match rule with "
        "coupled drafts, at sum_prod with speculative.coupled = false, and at sum_min under the opt-in "
        "acceptance-optimal rule; sum_min >= coupled and sum_min >= sum_prod always)"
    )
