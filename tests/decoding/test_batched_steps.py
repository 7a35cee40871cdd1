"""Rows stepped together (one batched forward per model per tick) emit exactly what they emit alone."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import pytest

from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.generation import Generation, StopType
from app.decoding.loop import SpeculativeLoop, TargetLoop
from app.decoding.plan import LoopPlan, Switches, plan_from_settings
from app.drafters.block_rows import DFlashPass, MtpPass, row_stable
from app.execution import forward as forward_module
from app.execution.steps import TickResult, run_together
from app.loading.paths import REPO_ROOT
from app.profiles.schema import DrafterSettings, Settings
from app.sampling import SamplingParams
from app.sampling.distribution import STACKED_DRAWS
from app.sampling.draws import Sample
from tests.support.batched import Arrival, run_batched, run_rows

GREEDY = SamplingParams(temperature=0.0)
WARM = SamplingParams(temperature=0.7)
PENALISED = SamplingParams(temperature=0.7, repeat_penalty=1.3, repeat_last_n=16)
PROMPTS = [
    "def merge_sorted(left, right):\n    result = []\n",
    "class LRUCache:\n    def __init__(self, capacity):\n",
    "import json\n\n\ndef load_config(path):\n",
    "for item in items:\n",
]


@dataclass(frozen=True)
class Case:
    builder: str
    prompt: int
    sampling: SamplingParams
    max_tokens: int
    seed: int = 0
    stop: tuple[str, ...] = ()
    n_max: int | None = None
    p_min: float = 0.0


CASES = [
    Case("draft-model", 0, GREEDY, 40),
    Case("draft-model", 1, WARM, 56, seed=11),
    Case("draft-model", 2, WARM, 30, seed=12, n_max=0),  # opted out: a target-only row in the batch
    Case("draft-model", 3, GREEDY, 48, stop=("return", "- ''\n#")),  # stops at its second line
    Case("draft-model", 0, WARM, 40, seed=13, n_max=2, p_min=0.3),  # narrower, host-side drafting
    Case("target-only", 1, PENALISED, 36, seed=14),  # penalties: the unpipelined plain step
    Case("target-only", 2, GREEDY, 20),
    Case("prompt-lookup", 0, GREEDY, 48),
]


@pytest.fixture(scope="module")
def builders(embedded_target, embedded_drafter) -> dict[str, LoopBuilder]:
    return {
        "draft-model": LoopBuilder(embedded_target, embedded_drafter, LoopPlan(drafter_kind="draft-model")),
        "target-only": LoopBuilder(embedded_target, None, LoopPlan()),
        "prompt-lookup": LoopBuilder(embedded_target, None, LoopPlan(drafter_kind="prompt-lookup")),
    }


def build(builders: dict[str, LoopBuilder], case: Case, tokenizer) -> Generation:
    prompt = tokenizer.encode(PROMPTS[case.prompt])
    request = RowRequest(prompt, case.sampling, case.max_tokens, seed=case.seed, stop=case.stop,
                         ignore_eos=True, n_max=case.n_max, p_min=case.p_min)  # fmt: skip
    return builders[case.builder].build(request)


def alone(generation: Generation) -> Generation:
    for _ in generation:
        pass
    return generation


def test_mixed_rows_joining_and_leaving_emit_their_solo_output(builders, embedded_target) -> None:
    tokenizer = embedded_target.tokenizer
    solo = [alone(build(builders, case, tokenizer)) for case in CASES]
    batched = [build(builders, case, tokenizer) for case in CASES]
    cancelled = build(builders, Case("draft-model", 1, WARM, 400, seed=99), tokenizer)
    arrivals = [Arrival(g, joins=2 * i) for i, g in enumerate(batched)] + [Arrival(cancelled, joins=1, leaves=6)]
    assert run_batched(arrivals) >= 6
    assert not cancelled.finished and cancelled.emitted  # it left mid-stream
    kinds = {type(g.loop) for g in batched}
    assert kinds == {SpeculativeLoop, TargetLoop}
    assert any(g.stop_type is StopType.WORD for g in solo)
    for case, one, many in zip(CASES, solo, batched, strict=True):
        assert (many.emitted, many.text, many.stop_type) == (one.emitted, one.text, one.stop_type), case
        assert many.stats.acceptance == one.stats.acceptance, case
        if isinstance(one.loop, SpeculativeLoop) or one.stop_type is StopType.LIMIT:
            # a lone target-only row may queue one step past a stop string; otherwise the same keys
            assert many.state.rng.uniform() == one.state.rng.uniform(), case


def test_a_row_that_fails_ends_alone(builders, embedded_target) -> None:
    tokenizer = embedded_target.tokenizer
    rows = [build(builders, case, tokenizer) for case in CASES[:3]]
    for generation in rows:
        generation.prefill()
    steps = [generation.steps() for generation in rows]
    steps[1].send(None)  # the step is already under way: resuming it again raises in that row only
    result = run_together(steps)
    assert isinstance(result, TickResult) and len(result.outcomes) == 3 and result.seconds > 0
    outcomes = result.outcomes
    assert isinstance(outcomes[1], Exception)
    assert all(not isinstance(outcome, Exception) and outcome.tokens for outcome in (outcomes[0], outcomes[2]))


@pytest.fixture(scope="module")
def waiting_builders(builders, embedded_target, embedded_drafter) -> dict[str, LoopBuilder]:
    """The wait count's kinds: target-only, the draft model under each lossless rule, MTP."""
    mtp = Settings(drafter=DrafterSettings(kind="mtp", model=str(REPO_ROOT / "models" / "mtp")))
    stochastic = LoopPlan(drafter_kind="draft-model", switches=Switches(stochastic_accept=True))
    return {
        **builders,
        "mtp": LoopBuilder(embedded_target, None, plan_from_settings(mtp)),
        "draft-model-stochastic": LoopBuilder(embedded_target, embedded_drafter, stochastic),
    }


@pytest.mark.parametrize("kind", ["target-only", "draft-model", "draft-model-stochastic", "mtp"])
@pytest.mark.parametrize("sampling", [GREEDY, WARM, PENALISED], ids=["greedy", "sampled", "penalised"])
def test_a_tick_waits_for_the_device_as_often_with_sixteen_rows_as_with_one(
    waiting_builders, monkeypatch, kind, sampling
) -> None:
    """What each row reads on the host after its forward is evaluated for every row at once
    (`Evaluate`), and a draft model's chain is queued per pass, not per row: on a GPU each wait and
    each queued graph is a launch, so a tick's count of them must not grow with its rows. Greedy,
    seeded T = 0.7, and penalties (the unpipelined plain step, drafts read for the history); the
    stochastic rule too. Host reads outside an `Evaluate` are ruled out by
    tests/project/test_host_reads.py, so counting `mx.eval` counts the waits."""
    waits = [(mx, "eval"), (mx, "async_eval")]
    one, sixteen = (calls_in_a_tick(waiting_builders[kind], sampling, rows, waits, monkeypatch) for rows in (1, 16))
    assert sixteen == one, (one, sixteen)
    assert calls_are_few(one, kind)


# (the MTP plan judges sampled rows by argmax-against-argmax: no pass to count)
@pytest.mark.parametrize("kind", ["target-only", "draft-model", "draft-model-stochastic"])
def test_a_tick_builds_as_many_sampler_passes_with_sixteen_rows_as_with_one(
    waiting_builders, kind, monkeypatch
) -> None:
    """Seeded T = 0.7 rows of one sampler share one pass of the chain per phase (app/sampling/draws.py:
    the target's p of every row, each draft step's q of every row), not one pass per row: on a GPU
    each pass is dozens of launches (top-k's partition, the ordering, softmax, top-p, the draw)."""
    passes = [(Sample, "drawn")]  # one pass of the chain, compiled (CUDA) or not: its trace runs once
    with pytest.MonkeyPatch.context() as switch:
        switch.setenv(STACKED_DRAWS, "1")  # stacked on Metal too, where they are served only switched on
        one, sixteen = (calls_in_a_tick(waiting_builders[kind], WARM, rows, passes, monkeypatch) for rows in (1, 16))
    assert sixteen == one, (one, sixteen)
    assert 0 < one <= (5 if kind.startswith("draft-model") else 1), one  # a draft model: its width of q passes and p


def calls_in_a_tick(builder: LoopBuilder, sampling: SamplingParams, count: int, watched, monkeypatch) -> int:
    """The calls of `watched` (owner, name) in one tick of `count` seeded rows, past their first
    decode tick (where a target-only row queues the next)."""
    tokenizer = builder.target.tokenizer
    rows = [builder.build(RowRequest(tokenizer.encode(PROMPTS[i % len(PROMPTS)]), sampling, 64, seed=i,
                                     ignore_eos=True)) for i in range(count)]  # fmt: skip
    for generation in rows:
        generation.prefill()
    run_together([g.ticking() for g in rows])
    calls = []
    for owner, name in watched:
        real = getattr(owner, name)
        monkeypatch.setattr(
            owner, name, lambda *args, real=real, name=name, **kw: calls.append(name) or real(*args, **kw)
        )
    run_together([g.ticking() for g in rows])
    monkeypatch.undo()
    assert all(g.emitted for g in rows)
    return len(calls)


def calls_are_few(calls: int, kind: str) -> bool:
    """A tick's evaluations, waits and queued graphs together: a small constant (a draft model's
    width of drafting passes, each queued, plus the phases' waits)."""
    return calls <= (16 if kind.startswith("draft-model") else 8)


def test_block_drafter_rows_share_the_target_forward_and_emit_their_solo_output(
    builders, embedded_target, monkeypatch
) -> None:
    """MTP and DFlash rows verify in the same batched target forward as the other rows, each
    drafter reading its own row's hidden states, and draft in one drafter call per pass for all
    rows of a kind (app/drafters/block_rows.py): every row emits what it emits alone; where the
    shared call is row-stable (the CPU) with the same drafts too (the same acceptance, to the
    position). On the GPU a shared call may move an argmax row's drafts by rounding: its
    acceptance, never its tokens."""
    block = {
        kind: LoopBuilder(embedded_target, None, plan_from_settings(Settings(drafter=DrafterSettings(
            kind=kind, model=str(REPO_ROOT / "models" / kind)))))
        for kind in ("mtp", "dflash")
    }  # fmt: skip
    cases = [("mtp", 0, GREEDY, 40), ("dflash", 1, GREEDY, 40), ("mtp", 2, WARM, 32), ("target-only", 3, GREEDY, 24),
             ("dflash", 3, WARM, 36)]  # fmt: skip
    tokenizer = embedded_target.tokenizer

    def generation(kind: str, prompt: int, sampling: SamplingParams, n: int) -> Generation:
        request = RowRequest(tokenizer.encode(PROMPTS[prompt]), sampling, n, seed=5, ignore_eos=True)
        return (block.get(kind) or builders[kind]).build(request)

    solo = [alone(generation(*case)) for case in cases]
    shared: list[int] = []  # rows per batched target forward
    tick = forward_module._tick

    def counted(rows):
        shared.append(sum(row.hook is not None for row in rows))
        return tick(rows)

    passes: dict[str, list[int]] = {"mtp": [], "dflash": []}  # rows per drafter call
    for kind, kind_pass in (("mtp", MtpPass), ("dflash", DFlashPass)):
        calls = vars(kind_pass)["serve"]  # the staticmethod that runs one call for the rows

        def counted_calls(rows, calls=calls, kind=kind):
            passes[kind].append(len(rows))
            return calls(rows)

        monkeypatch.setattr(kind_pass, "serve", staticmethod(counted_calls))
    monkeypatch.setattr(forward_module, "_tick", counted)
    batched = run_rows([generation(*case) for case in cases])
    assert max(shared) == 4  # all four block rows' verify forwards in one pass
    assert max(passes["mtp"]) == 2 and max(passes["dflash"]) == 2  # and their drafting passes in one call each
    for case, one, many in zip(cases, solo, batched, strict=True):
        assert (many.emitted, many.text) == (one.emitted, one.text), case
        assert many.stats.acceptance == one.stats.acceptance or not row_stable(), case
