"""Making block-loop rows: the lazily loaded drafter, its width controller, the exactness gate.

One `BlockLoops` per loaded target serves every request of an MTP or DFlash-family profile. The
drafter loads on first use (its load time is reported, and kept out of that request's timings);
a failed load fails that request only, and the next request tries again. The load and the first
probes are once-per-process costs, kept out of the timings of the request that paid them. Before a width is used
the exactness probe must have cleared it; a width that fails is never used, and when no width
the loop needs passes, the request is declined to classic decode. The tick's choice narrows rows
below the declared width only once every verify width under it has been cleared too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from app.acceptance import Rule
from app.decoding.adaptive import ControlledWidth, WidthController
from app.decoding.exactness import ProbeCache, ProbeVerdict
from app.decoding.loop import Drafting
from app.decoding.outcome import Note
from app.decoding.plan import LoopPlan
from app.decoding.width import WidthPolicy
from app.drafters.block import BlockDrafterModel, block_proposer, load_block_drafter
from app.execution.model import LoadedModel
from app.loading import ModelLoadError
from app.profiles.schema import ALLOW_INEXACT_ENV
from app.sampling import SamplingParams


class DrafterUnavailableError(Exception):
    """The drafter could not be loaded; the request that needed it fails, the server goes on."""


@dataclass
class Choice:
    """How one request drafts, and what choosing it cost and wants logged."""

    drafting: Drafting | None  # None: no drafter (none configured, n_max 0, or declined)
    notes: list[Note] = field(default_factory=list)
    setup_seconds: float = 0.0  # this request paid the drafter's first load or a first probe


@dataclass
class BlockLoops:
    target: LoadedModel
    plan: LoopPlan
    probes: ProbeCache = field(default_factory=ProbeCache)
    bound: BlockDrafterModel | None = None
    controller: WidthController | None = None
    narrowable: bool = False  # every verify width below the declared one was cleared: the load may narrow rows

    def _load(self) -> float:
        if self.bound is not None:
            return 0.0
        try:
            self.bound = load_block_drafter(self.plan.drafter_model, self.target)
        except (ModelLoadError, OSError, ValueError, RuntimeError) as exc:
            path = self.plan.drafter_model
            raise DrafterUnavailableError(f"the drafter at {path} could not be loaded: {exc}") from exc
        declared, ceiling = self.plan.block_widths
        self.controller = WidthController(declared, ceiling, enabled=self.plan.adaptive)
        return self.bound.load_seconds

    def _gate(self, notes: list[Note]) -> ProbeVerdict | None:
        """Probe every width the controller may use; the failing verdict that blocks the loop, if any."""
        controller = self.controller
        for width in controller.widths:
            fresh = (id(self.target.model), width) not in self.probes.verdicts
            verdict = self.probes.check(self.target.model, width)
            probe = Note("exactness_probe", {"width": width, "exact": verdict.exact, "position": verdict.position})
            if fresh:
                notes.append(probe)
            if verdict.exact:
                continue
            if self.plan.switches.allow_inexact:
                notes.append(Note("exactness_probe_overridden", {"width": width, "position": verdict.position,
                                                                 "env": ALLOW_INEXACT_ENV}, warning=True))  # fmt: skip
                continue
            if width != controller.declared:
                probe.warning = True  # the only line that says the ceiling failed
                controller.settle()  # keep the declared width; never widen to one that is not exact
                continue
            return verdict  # the request's block_loop_declined line is the warning
        self.narrowable = self.plan.under_load and self._cleared_below(notes)
        return None

    def _cleared_below(self, notes: list[Note]) -> bool:
        """Probe the verify widths below the declared one (a width of 1 is a single step); whether
        all were cleared (or the inexact override is on)."""
        for width in range(2, self.controller.declared):
            fresh = (id(self.target.model), width) not in self.probes.verdicts
            verdict = self.probes.check(self.target.model, width)
            failed = not verdict.exact and not self.plan.switches.allow_inexact
            if fresh:
                fields = {"width": width, "exact": verdict.exact, "position": verdict.position}
                notes.append(Note("exactness_probe", fields, warning=failed))  # the rows then keep their widths
            if failed:
                return False
        return True

    def _loaded(self) -> list[Note]:
        """Load the drafter if it is not yet; the `drafter_loaded` note when this call loaded it."""
        load_seconds = self._load()
        return [Note("drafter_loaded", {"path": str(self.bound.path), "seconds": round(load_seconds, 3)})] if (
            load_seconds
        ) else []  # fmt: skip

    def prepare(self) -> list[Note]:
        """Load the drafter and probe every width now rather than on the first request (a reload
        does this before its engine takes over); the probes' verdicts are kept for the requests."""
        notes = self._loaded()
        self._gate(notes)
        return notes

    def choose(self, sampling: SamplingParams, n_max: int, n_min: int = 0, load_free: bool = False) -> Choice:
        """A row of `sampling`: its drafting under the shared width controller, capped at `n_max`
        (row_n_max) and retracting below `n_min`; `load_free` as the width policy takes it."""
        started = time.perf_counter()
        notes = self._loaded()
        if self.plan.rule(sampling) is None:  # the plan declines this sampler class (DSpark samples nothing)
            reason = "the DSpark drafter is greedy-only; this request samples (temperature > 0, top_k != 1)"
            notes.append(Note("block_loop_declined", {"reason": reason}, warning=True))
            return Choice(None, notes, time.perf_counter() - started)
        failed = self._gate(notes)
        if failed is not None:
            reason = (f"exactness probe failed at width {failed.width}, position {failed.position} "
                      f"(max |difference| {failed.max_difference:.3g}); serving classic decode")  # fmt: skip
            notes.append(Note("block_loop_declined", {"reason": reason, "width": failed.width,
                                                      "position": failed.position}, warning=True))  # fmt: skip
            return Choice(None, notes, time.perf_counter() - started)
        # a row whose tokens read its drafts' q runs its passes with their solo bits (app/drafters/block_rows.py)
        rule = self.plan.rule(sampling)
        shares = rule.width_independent
        proposer = block_proposer(
            self.bound, lossless=self.plan.block_lossless, coupled=self.plan.couples(sampling), shares=shares
        )
        source = ControlledWidth(self.controller)
        narrowed = load_free and self.narrowable
        # an argmax rule's verify draws nothing; a sampling drafter's drafts are drawn all the same
        sampled = not sampling.is_greedy and (rule is not Rule.ARGMAX_AGAINST_ARGMAX or proposer.sampled)
        drafting = Drafting(proposer, WidthPolicy(source, n_max, n_min, narrowed, proposer.passes, sampled))
        return Choice(drafting, notes, time.perf_counter() - started)
