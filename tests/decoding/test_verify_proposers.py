"""One proposer protocol and one verify step: every drafter kind, classic or block, goes through both."""

from __future__ import annotations

import inspect

import pytest

from app.decoding import loop as loop_module
from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.loop import SpeculativeLoop
from app.decoding.plan import LoopPlan, plan_from_settings
from app.decoding.verify import VerifyRow, verifying
from app.drafters.base import Proposer
from app.drafters.kinds import DrafterKind
from app.execution.steps import run_together
from app.execution.target_taps import FeatureHook
from app.loading.paths import REPO_ROOT
from app.profiles.schema import DrafterSettings, Settings
from app.sampling import SamplingParams

MODELS = REPO_ROOT / "models"
GREEDY = SamplingParams(temperature=0.0)
PROMPT = "def merge_sorted(left, right):\n    result = []\n    while left and right:\n"
BLOCK = {"mtp": DrafterKind.MTP, "dflash": DrafterKind.DFLASH, "dspark": DrafterKind.DFLASH, "muse": DrafterKind.DFLASH}
DRAFTERS = ["draft-model", "prompt-lookup", *BLOCK]


def builder_for(name: str, target, drafter) -> LoopBuilder:
    if name in BLOCK:
        settings = Settings(drafter=DrafterSettings(kind=BLOCK[name], model=str(MODELS / name)))
        return LoopBuilder(target, None, plan_from_settings(settings))
    plan = LoopPlan(drafter_kind=name, num_draft_tokens=4)
    return LoopBuilder(target, drafter if name == "draft-model" else None, plan)


def speculative_row(name: str, target, drafter, max_tokens: int = 24):
    prompt = target.tokenizer.encode(PROMPT + PROMPT)  # repeated, so prompt lookup finds matches
    request = RowRequest(prompt, GREEDY, max_tokens=max_tokens, ignore_eos=True)
    generation = builder_for(name, target, drafter).build(request)
    assert isinstance(generation.loop, SpeculativeLoop), name
    return generation


def test_every_drafter_kind_is_covered() -> None:
    assert {DrafterKind.DRAFT_MODEL, DrafterKind.PROMPT_LOOKUP, *BLOCK.values()} == set(DrafterKind) - {
        DrafterKind.NONE
    }


@pytest.mark.parametrize("name", DRAFTERS)
def test_every_drafter_satisfies_the_proposer_protocol(name: str, embedded_target, embedded_drafter) -> None:
    proposer = speculative_row(name, embedded_target, embedded_drafter).loop.proposer
    assert proposer.kind is (BLOCK[name] if name in BLOCK else DrafterKind(name))
    assert isinstance(proposer.reports_distribution, bool) and isinstance(proposer.one_hot_proposals, bool)
    assert isinstance(proposer.draws_within_grammar, bool)
    assert (proposer.hook is not None) == (name in BLOCK)  # block drafters read the target's hidden states
    assert proposer.hook is None or isinstance(proposer.hook, FeatureHook)
    for method in ("prefill", "propose", "proposing", "settle"):
        wanted = list(inspect.signature(getattr(Proposer, method)).parameters)[1:]
        assert list(inspect.signature(getattr(proposer, method)).parameters) == wanted, (name, method)


@pytest.mark.parametrize("name", DRAFTERS)
def test_classic_and_block_rounds_run_the_one_verify_step(
    name: str, embedded_target, embedded_drafter, monkeypatch: pytest.MonkeyPatch
) -> None:
    verified: list[int] = []

    def recording(row):
        verified.append(row.proposal.k)
        return verifying(row)

    monkeypatch.setattr(loop_module, "verifying", recording)
    generation = speculative_row(name, embedded_target, embedded_drafter)
    generation.prefill()
    while not generation.finished:
        generation.step()
    stats = generation.stats.acceptance
    assert stats.rounds > 0 and stats.rounds == sum(1 for k in verified if k > 0)
    assert stats.proposed == sum(verified)


def test_one_verify_call_takes_many_rows(embedded_target, embedded_drafter) -> None:
    """Rows in, one verdict per row out: a classic row and a block row in the same call."""
    generations = [speculative_row(name, embedded_target, embedded_drafter) for name in ("draft-model", "mtp")]
    rows = []
    for generation in generations:
        generation.prefill()
        loop, state = generation.loop, generation.state
        rows.append(VerifyRow(state, loop.target, loop.proposer, loop.proposer.propose(state, 3), loop.speculation))
    before = [len(row.state.tokens) for row in rows]
    verified = run_together([verifying(row) for row in rows]).outcomes  # as the engine's tick verifies its rows
    assert len(verified) == len(rows)
    for row, result, length in zip(rows, verified, before, strict=True):
        assert row.state.tokens[length:] == result.verdict.tokens
        assert row.target.length == len(row.state.tokens) - 1  # the cache holds all decided tokens but the last
        assert 0 <= result.verdict.accepted <= row.proposal.k
