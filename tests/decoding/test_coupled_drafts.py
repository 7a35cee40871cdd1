"""Coupled drafts through the round loops: they read the target's stream and never consume it.

A coupled drafter draws each draft with the keys the target will draw that position with
(app/sampling/streams.py). Those keys are peeked: after every step the target stream stands
exactly where target-only decoding's would after the same tokens, the XTC coin's key and the
draw's per emitted position. A drafter that drew one key of it (or consumed a peek) would move it.
"""

from __future__ import annotations

import pytest

from app.acceptance import Rule
from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.plan import LoopPlan, plan_from_settings
from app.loading.paths import REPO_ROOT
from app.profiles.schema import LOSSLESS_BLOCK_RULE, DrafterSettings, Settings
from app.sampling import RowRng, SamplingParams

XTC = SamplingParams(temperature=0.7, xtc_probability=0.5, xtc_threshold=0.1)  # two keys a position
PROMPT = "def merge_sorted(left, right):\n"


def block(kind: str) -> LoopPlan:
    drafter = DrafterSettings(kind="mtp" if kind == "mtp" else "dflash", model=str(REPO_ROOT / "models" / kind),
                              block_rule=LOSSLESS_BLOCK_RULE)  # fmt: skip
    return plan_from_settings(Settings(drafter=drafter), environ={})


def key_after(seed: int, keys: int) -> list[int]:
    """The target stream's next key once target-only decoding has taken `keys` keys."""
    rng = RowRng(seed)
    for _ in range(keys):
        rng.next_key()
    return rng.peek(1)[0].tolist()


@pytest.mark.parametrize("kind", ["draft-model", "mtp", "dflash"])
def test_coupled_drafts_never_consume_the_target_stream(embedded_target, embedded_drafter, kind: str) -> None:
    if kind == "draft-model":
        builder = LoopBuilder(embedded_target, embedded_drafter, LoopPlan(drafter_kind="draft-model"))
    else:
        builder = LoopBuilder(embedded_target, None, block(kind))
    prompt = embedded_target.tokenizer.encode(PROMPT)
    generation = builder.build(RowRequest(prompt, XTC, max_tokens=48, seed=11, ignore_eos=True))
    assert generation.speculation.rule is Rule.SAMPLER_MATCH and generation.speculation.coupled
    generation.prefill()
    rng = generation.state.rng
    while not generation.finished:
        generation.step()
        assert rng.peek(1)[0].tolist() == key_after(11, 2 * len(generation.emitted)), len(generation.emitted)
    assert generation.stats.acceptance.accepted > 0  # the drafts were judged, and some agreed
