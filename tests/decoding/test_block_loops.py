"""MTP and DFlash-family round loops on the embedded target with the trained drafters."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
import structlog

from app.acceptance import Rule, Verdict
from app.decoding import exactness
from app.decoding.adaptive import (
    ABANDON_AFTER,
    WARMUP_ROUNDS,
    WINDOW_ROUNDS,
    ControlledWidth,
    Phase,
    WidthController,
)
from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.exactness import ProbeVerdict, probe_width
from app.decoding.generation import Generation
from app.decoding.loop import Drafting, SpeculativeLoop, TargetLoop
from app.decoding.plan import LoopPlan, plan_from_settings
from app.decoding.speculation import Speculation
from app.decoding.width import WidthPolicy
from app.drafters.block import block_proposer, load_block_drafter
from app.engine.reporter import Reporter
from app.engine.row import Job
from app.execution.model import load_model
from app.execution.runner import ModelRunner
from app.loading import EMBEDDED_TARGET
from app.loading.paths import REPO_ROOT
from app.profiles.schema import DrafterSettings, Settings
from app.sampling import RowRng, SamplerPipeline, SamplingParams
from app.sampling.state import RowState
from tests.support.server import clean_env, serve

MODELS = REPO_ROOT / "models"
GREEDY = SamplingParams(temperature=0.0)
CODE = "def merge_sorted(left, right):\n    result = []\n"
LONG = "".join(f"def helper_{i}(value):\n    return value * {i} + {i % 7}\n\n\n" for i in range(60))


def run(generation):
    generation.prefill()
    while not generation.finished:
        generation.step()
    return generation


def greedy_tokens(target, prompt: str, n: int) -> list[int]:
    request = RowRequest(target.tokenizer.encode(prompt), GREEDY, max_tokens=n, ignore_eos=True)
    return run(LoopBuilder(target, None, LoopPlan()).build(request)).emitted


@pytest.fixture(scope="module")
def greedy(embedded_target) -> dict[tuple[str, int], list[int]]:
    """The target's own greedy tokens for each (prompt, n) the exactness test decodes, once."""
    return {(prompt, n): greedy_tokens(embedded_target, prompt, n) for prompt, n in ((CODE, 64), (LONG, 40))}


@pytest.mark.parametrize(("drafter", "widths"), [("mtp", [4]), ("dflash", [8]), ("dspark", [8]), ("muse", [4, 8])])
def test_every_width_is_exact_greedy_decoding(embedded_target, greedy, drafter: str, widths: list[int]) -> None:
    """T = 0 block loops emit exactly the target's greedy tokens, long prompts included."""
    bound = load_block_drafter(MODELS / drafter, embedded_target)
    assert sorted({bound.declared_width, bound.max_width}) == widths
    for width in widths:
        assert probe_width(embedded_target.model, width).exact
        for prompt, n in greedy:
            tokens = embedded_target.tokenizer.encode(prompt)
            widths = WidthPolicy(ControlledWidth(WidthController(width, width)), n_max=width - 1)
            drafting = Drafting(block_proposer(bound), widths)
            speculation = Speculation(rule=Rule.ARGMAX_AGAINST_ARGMAX, draft_kind=bound.draft_kind)
            loop = SpeculativeLoop(ModelRunner(embedded_target.model), drafting, speculation)
            state = RowState(tokens=list(tokens), sampler=SamplerPipeline(GREEDY, embedded_target.vocab_size),
                             rng=RowRng(0))  # fmt: skip
            generation = run(Generation(loop=loop, state=state, tokenizer=embedded_target.tokenizer, max_tokens=n,
                                        context_limit=4096, ignore_eos=True))  # fmt: skip
            assert generation.emitted == greedy[prompt, n], (drafter, width, len(tokens))
            stats = generation.stats.acceptance
            assert stats.rounds > 0 and stats.accepted > 0


class PerturbWideSteps(nn.Module):
    """A target layer whose multi-row forwards after prefill are off by a hair: the block
    forward no longer matches single-token steps, which is what the probe must catch."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def __call__(self, x: mx.array, mask: object, cache: object) -> mx.array:
        offset = cache.offset
        out = self.inner(x, mask, cache)
        return out + 1e-3 if x.shape[1] > 1 and offset > 0 else out


@pytest.fixture
def perturbed_target():
    target = load_model(EMBEDDED_TARGET)
    target.model.model.layers[-1] = PerturbWideSteps(target.model.model.layers[-1])
    return target


def block_builder(target, drafter: str = "mtp") -> LoopBuilder:
    kind = "mtp" if drafter == "mtp" else "dflash"
    plan = plan_from_settings(Settings(drafter=DrafterSettings(kind=kind, model=str(MODELS / drafter))))
    return LoopBuilder(target, None, plan)


def test_a_failed_probe_declines_to_classic_decode(perturbed_target, embedded_target, monkeypatch) -> None:
    monkeypatch.delenv("MLXCEL_MTP_ALLOW_INEXACT", raising=False)
    request = RowRequest(perturbed_target.tokenizer.encode(CODE), GREEDY, max_tokens=40, ignore_eos=True)
    generation = block_builder(perturbed_target).build(request)
    assert type(generation.loop) is TargetLoop
    (declined,) = [n for n in generation.notes if n.event == "block_loop_declined"]
    assert declined.fields["width"] == 4 and declined.fields["position"] is not None
    assert f"width 4, position {declined.fields['position']}" in declined.fields["reason"]
    with structlog.testing.capture_logs() as logs:  # the contract: a decline is one warning line
        Reporter("mtp").noted(Job(request, "r1", "/completion", sink=lambda event: None), generation)
    assert [(e["event"], e["log_level"]) for e in logs if e["event"] != "drafter_loaded"] == [
        ("exactness_probe", "info"), ("block_loop_declined", "warning")]  # fmt: skip
    assert run(generation).emitted == greedy_tokens(embedded_target, CODE, 40)


def test_allow_inexact_overrides_the_probe_with_a_warning(perturbed_target, monkeypatch) -> None:
    monkeypatch.setenv("MLXCEL_MTP_ALLOW_INEXACT", "1")
    request = RowRequest(perturbed_target.tokenizer.encode(CODE), GREEDY, max_tokens=24, ignore_eos=True)
    generation = block_builder(perturbed_target).build(request)
    assert generation.speculation.draft_kind == "mtp"
    assert [n.event for n in generation.notes].count("exactness_probe_overridden") == 1
    assert run(generation).stats.acceptance.rounds > 0


def test_a_failing_ceiling_keeps_the_declared_width(embedded_target, monkeypatch) -> None:
    monkeypatch.delenv("MLXCEL_MTP_ALLOW_INEXACT", raising=False)
    builder = block_builder(embedded_target, "muse")
    key = (id(embedded_target.model), 8)
    builder.block._load()
    builder.block.probes.verdicts[key] = ProbeVerdict(8, False, 3, 1e-3)  # as if width 8 had failed
    generation = builder.build(RowRequest(embedded_target.tokenizer.encode(CODE), GREEDY, max_tokens=8))
    assert generation.speculation.draft_kind == "dflash"
    assert builder.block.controller.phase is Phase.SETTLED and builder.block.controller.width() == 4


def test_the_load_narrows_block_rows_only_below_widths_the_probe_cleared(embedded_target, monkeypatch) -> None:
    """The tick's choice may run a block row below its declared width (4 for the MTP head) only
    once verify widths 2 and 3 are cleared too; one that fails keeps the rows at their widths."""
    monkeypatch.delenv("MLXCEL_MTP_ALLOW_INEXACT", raising=False)
    request = RowRequest(embedded_target.tokenizer.encode(CODE), GREEDY, max_tokens=8)
    cleared = block_builder(embedded_target)
    generation = cleared.build(request)
    probed = sorted(n.fields["width"] for n in generation.notes if n.event == "exactness_probe")
    assert probed == [2, 3, 4] and generation.widths.load_free

    def failing_at_3(model: object, width: int) -> ProbeVerdict:
        return ProbeVerdict(3, False, 1, 1e-3) if width == 3 else probe_width(model, width)

    monkeypatch.setattr(exactness, "probe_width", failing_at_3)
    held = block_builder(embedded_target).build(request)
    assert held.speculation.draft_kind == "mtp" and not held.widths.load_free
    (warning,) = [n for n in held.notes if n.event == "exactness_probe" and n.warning]
    assert warning.fields["width"] == 3


def test_prepare_loads_and_probes_before_any_request(embedded_target) -> None:
    """What a reload's engine does before it takes over: the first request then pays nothing."""
    builder = block_builder(embedded_target)
    prepared = [note.event for note in builder.block.prepare()]
    assert prepared[0] == "drafter_loaded" and "exactness_probe" in prepared
    generation = builder.build(RowRequest(embedded_target.tokenizer.encode(CODE), GREEDY, max_tokens=4))
    assert generation.speculation.draft_kind == "mtp" and generation.notes == []


# --- the adaptive width controller, on a scripted clock ---------------------------------------


def feed(controller: WidthController, rounds: int, rates: dict[int, float]) -> None:
    """Rounds that emit 4 tokens each, taking 4 / rate ms at whatever width is current."""
    for _ in range(rounds):
        width = controller.width()
        controller.observe(width, 4, 4 / rates[width] / 1000.0)


def test_warms_up_at_the_declared_width_then_widens_when_it_pays() -> None:
    controller = WidthController(declared=4, ceiling=8)
    assert controller.widths == [4, 8]
    feed(controller, WARMUP_ROUNDS - 1, {4: 1.0, 8: 1.5})
    assert controller.phase is Phase.WARMUP and controller.width() == 4
    feed(controller, 1, {4: 1.0, 8: 1.5})
    assert controller.phase is Phase.TRIAL and controller.width() == 8
    feed(controller, 1, {4: 1.0, 8: 1.5})
    assert controller.width() == 4  # the trial alternates the two widths
    feed(controller, 2 * WINDOW_ROUNDS - 1, {4: 1.0, 8: 1.5})
    assert controller.phase is Phase.COOLDOWN and controller.width() == 8 and controller.widths == [4, 8]


def test_a_dethroned_width_rechallenges_and_wins_back() -> None:
    controller = WidthController(declared=4, ceiling=8)
    feed(controller, WARMUP_ROUNDS + 2 * WINDOW_ROUNDS, {4: 1.0, 8: 1.5})  # easy text: 8 pays
    assert controller.held == 8 and controller.cooldown_windows == 4
    feed(controller, 4 * WINDOW_ROUNDS, {4: 1.0, 8: 0.8})
    assert controller.phase is Phase.TRIAL and controller.width() == 4  # the declared width re-challenges
    feed(controller, 2 * WINDOW_ROUNDS, {4: 1.0, 8: 0.8})
    assert controller.held == 4 and controller.phase is Phase.COOLDOWN


def test_stays_when_the_wider_width_does_not_pay_by_two_percent() -> None:
    controller = WidthController(declared=4, ceiling=8)
    feed(controller, WARMUP_ROUNDS + 2 * WINDOW_ROUNDS, {4: 1.0, 8: 1.01})
    assert controller.phase is Phase.COOLDOWN and controller.width() == 4 and controller.losses == 1


def test_a_trial_compares_the_widths_on_the_same_text() -> None:
    """Acceptance that rises as the text gets easier must not read as the wider width paying."""
    controller = WidthController(declared=4, ceiling=8)
    for i in range(WARMUP_ROUNDS + 2 * WINDOW_ROUNDS):
        width = controller.width()
        easy = i >= WARMUP_ROUNDS + WINDOW_ROUNDS // 2  # the text turns easy halfway through the trial
        tokens = (4 if easy else 1) * (1.05 if width == 8 else 1.0)  # width 8: 5 % more tokens a round ...
        controller.observe(width, tokens, (1.25 if width == 8 else 1.0) / 1000.0)  # ... for 25 % more time
    assert controller.phase is Phase.COOLDOWN and controller.width() == 4


def test_rounds_are_charged_to_the_width_their_row_asked_for() -> None:
    controller = WidthController(declared=4, ceiling=8)
    feed(controller, WARMUP_ROUNDS, {4: 1.0, 8: 1.0})
    first, second = ControlledWidth(controller), ControlledWidth(controller)
    assert first.proposals() == 7 and second.proposals() == 7  # one tick: both rows at the ceiling
    round_ = Verdict(accepted=3, tokens=[1, 2, 3, 4], tested=3)
    first.observe(round_.tokens, 7, round_, 0.001)
    second.observe(round_.tokens, 7, round_, 0.001)
    assert (controller.challenger.rounds, controller.window.rounds) == (2, 0)


def test_abandons_a_losing_trial_early() -> None:
    controller = WidthController(declared=4, ceiling=8)
    feed(controller, WARMUP_ROUNDS + 2 * ABANDON_AFTER - 1, {4: 1.0, 8: 0.5})
    assert controller.phase is Phase.TRIAL
    feed(controller, 1, {4: 1.0, 8: 0.5})
    assert controller.phase is Phase.COOLDOWN and controller.trials == 1


def test_backs_off_before_rechallenging() -> None:
    controller = WidthController(declared=4, ceiling=8)
    feed(controller, WARMUP_ROUNDS + 2 * ABANDON_AFTER, {4: 1.0, 8: 0.5})
    assert controller.cooldown_windows == 4
    feed(controller, 4 * WINDOW_ROUNDS, {4: 1.0, 8: 0.5})
    assert controller.phase is Phase.TRIAL  # re-challenged after 4 windows
    feed(controller, 2 * ABANDON_AFTER, {4: 1.0, 8: 0.5})
    assert controller.losses == 2 and controller.cooldown_windows == 16  # x4 per consecutive loss
    controller.losses = 10
    controller._lose()
    assert controller.cooldown_windows == 64


def test_disabled_or_equal_widths_never_adapt() -> None:
    assert WidthController(4, 8, enabled=False).widths == [4]
    assert WidthController(4, 4).phase is Phase.SETTLED


# --- over HTTP -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(profile_server) -> dict[str, str]:
    with profile_server("target-only").client() as http:
        return {p: http.post("/completion", json={"prompt": p, "n_predict": 48, "temperature": 0}).json()["content"]
                for p in (CODE, LONG)}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["mtp", "dflash", "dspark", "muse"])
def test_server_output_at_t0_is_target_greedy(profile_server, reference, profile: str) -> None:
    server = profile_server(profile)
    with server.client() as http:
        for prompt, expected in reference.items():
            body = http.post("/completion", json={"prompt": prompt, "n_predict": 48, "temperature": 0}).json()
            assert body["content"] == expected
            assert body["timings"]["draft_kind"] == ("mtp" if profile == "mtp" else "dflash")
        probed = [e["width"] for e in server.events("exactness_probe")]
        declared = 4 if profile in ("mtp", "muse") else 8
        ceiling = 8 if profile == "muse" else declared  # and every verify width below the declared one
        assert sorted(probed) == sorted({*range(2, declared), declared, ceiling})
        first_round = server.events("speculative_request")[0]["timestamp"]
        assert all(e["timestamp"] <= first_round for e in server.events("exactness_probe"))
        if profile == "dspark":
            response = http.post("/completion", json={"prompt": CODE, "n_predict": 16, "temperature": 0.7})
            assert "draft_kind" not in response.json()["timings"]
            rid = response.headers["x-request-id"]
            server.wait_for_event("block_loop_declined", rid)  # the log line may land after the answer
            declined = [e for e in server.events("block_loop_declined") if e["request_id"] == rid]
            assert len(declined) == 1 and declined[0]["level"] == "warning"
        if profile == "muse":
            response = http.post("/completion", json={"prompt": CODE, "n_predict": 24, "temperature": 0.7, "seed": 3})
            event = server.wait_for_event("speculative_request", response.headers["x-request-id"])
            assert event["rule"] == Rule.ARGMAX_AGAINST_ARGMAX and event["biased"] is True


@pytest.mark.slow
def test_a_drafter_that_fails_to_load_fails_only_its_requests(tmp_path: Path) -> None:
    broken = tmp_path / "broken-mtp"
    shutil.copytree(MODELS / "mtp", broken)
    (broken / "model.safetensors").write_bytes(b"corrupt")
    profile = tmp_path / "broken.toml"
    profile.write_text(f'target = "{EMBEDDED_TARGET}"\n[drafter]\nkind = "mtp"\nmodel = "{broken}"\n')
    with serve(tmp_path, "--profile", str(profile)) as server, server.client() as http:
        for _ in range(2):
            failed = http.post("/completion", json={"prompt": CODE, "n_predict": 4})
            assert failed.status_code == 503 and "could not be loaded" in failed.json()["error"]["message"]
        assert http.get("/health").status_code == 200
        assert (
            http.post("/completion", json={"prompt": CODE, "n_predict": 4, "speculative.n_max": 0}).status_code == 200
        )


@pytest.mark.slow
def test_drafter_kind_is_detected_and_an_impossible_explicit_kind_refused(tmp_path: Path) -> None:
    with serve(tmp_path, "--profile", "target-only", "--draft-model", str(MODELS / "mtp")) as server:
        (event,) = server.events("acceptance_rule_active")
        assert event["drafter_kind"] == "mtp"
    result = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--profile", "target-only", "--draft-kind", "dflash", "--draft-model",
         str(MODELS / "mtp")], capture_output=True, text=True, env=clean_env(), timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and 'set drafter.kind = "mtp"' in result.stderr
