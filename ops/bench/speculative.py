"""Offline speculative decoding, side by side in one process on the embedded pair (or the grown one).

Arms run interleaved prompt by prompt (the machine is shared and noisy), each for the same
number of tokens with EOS ignored, timed wall-clock including prefill. mlx-lm's loops run on the
same loaded model objects, so the comparison isolates the round loop.

    python -m ops.bench.speculative [--tokens 128] [--repeats 2] [--k 4] [--sets all|block|coupling]
        [--temperatures 0.7,1.0,0.3] [--target grown-1.2b] [--write]

`--sets block` runs only the block drafters (T = 0 under the profiles' rule, and T = 0.7 under
the lossless rules, sampler-match and stochastic), each set against target-only in the same run.
`--sets coupling` runs issue 39's arms at each of `--temperatures`: the classic draft model and
MTP (`lossless`) under sampler-match with coupled drafts (`speculative.coupled`, the default),
with uncoupled ones, and under the stochastic rule, against target-only, then its goals.

`--target grown-1.2b` runs every set on issue 46's embedded target grown to 1.2 B (the same
function, ops/models/grown.py), built into a temporary folder first, with the block drafters grown
to read it; the classic draft model is the embedded one (it pairs by vocabulary). Its sections
are written apart from the embedded pair's (`speculative-grown-1.2b-gpu`, ...).
"""

from __future__ import annotations

# isort: off
from ops.bench.common import (
    WRITE_HELP,
    REPO_ROOT,
    Arm,
    arguments,
    machine,
    progress,
    stage,
    table,
    timed,
    section_name,
    write_section,
)  # first: sets up MLX's BLAS

# isort: on
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.sample_utils import make_sampler

from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.plan import LoopPlan, Switches, plan_from_settings
from app.execution.device import backend
from app.execution.model import LoadedModel, load_model
from app.loading import EMBEDDED_DRAFTER, EMBEDDED_TARGET
from app.profiles.schema import STOCHASTIC_ACCEPT_ENV, DrafterSettings, Settings, SpeculativeSettings
from app.sampling import SamplingParams
from ops.bench.prompts import COPY_HEAVY, HELD_OUT_CODE, PROSE
from ops.models.grown import GROWN_1_2B, build_grown_1_2b

Run = Callable[[], tuple[list[int], object | None]]

GREEDY = SamplingParams(temperature=0.0)
BLOCK_HEADER = ["drafter", "verify width", "tokens/s", "vs target-only", "mean accepted len", "per-position acceptance"]
WARM = SamplingParams(temperature=0.7)


@dataclass(frozen=True)
class Pair:
    """The target the loops run on, the folder of its block drafters (mtp/, dflash/, ...), and its
    `--target` name (None: the embedded pair)."""

    target: LoadedModel
    drafters: Path
    name: str | None = None

    def section(self, base: str) -> str:
        """This run's section of docs/benchmarks.md: the embedded pair's `base` (`-gpu` on a GPU),
        or the built target's."""
        return section_name(base, self.name) if self.name else base + ("-gpu" if backend().gpu else "")

    @property
    def described(self) -> str:
        return f"Target `{self.name}` (ops/models/grown.py), its block drafters grown with it. " if self.name else ""


def ours(builder: LoopBuilder, prompt: list[int], sampling: SamplingParams, n: int, seed: int) -> Run:
    def run() -> tuple[list[int], object]:
        generation = builder.build(RowRequest(prompt, sampling, max_tokens=n, seed=seed, ignore_eos=True))
        generation.prefill()
        while not generation.finished:
            generation.step()
        return generation.emitted, generation.stats.acceptance

    return run


def mlx_lm(
    target: LoadedModel,
    drafter: LoadedModel | None,
    prompt: list[int],
    temp: float,
    n: int,
    k: int,
    seed: int,
) -> Run:
    def run() -> tuple[list[int], None]:
        mx.random.seed(seed)
        sampler = make_sampler(temp=temp, top_p=WARM.top_p, min_p=WARM.min_p, top_k=WARM.top_k)
        if drafter is None:
            steps = generate_step(mx.array(prompt), target.model, max_tokens=n, sampler=sampler)
        else:
            inputs = mx.array(prompt)
            steps = speculative_generate_step(
                inputs, target.model, drafter.model, num_draft_tokens=k, max_tokens=n, sampler=sampler
            )
        return [int(token) for token, *_ in steps], None

    return run


def run_set(arms: dict[str, object], prompts: list[list[int]], repeats: int) -> dict[str, Arm]:
    """`arms` maps a name to a factory(prompt, seed) -> run; each prompt runs every arm in turn."""
    results = {name: Arm(name) for name in arms}
    names = list(arms)
    stage(f"warming up {', '.join(names)}")
    for name in names:  # untimed: the GPU compiles its kernels on first use
        arms[name](prompts[0][:8], 0)()
    with progress(repeats * len(prompts) * len(names), ", ".join(names)) as bar:
        for r in range(repeats):
            for i, prompt in enumerate(prompts):
                order = names[(i + r) % len(names) :] + names[: (i + r) % len(names)]
                for name in order:
                    timed(results[name], arms[name](prompt, 1000 * r + i))
                    bar.update()
    return results


def rows_for(results: dict[str, Arm], baseline: str, mlx_name: str | None, label: str) -> list[list[str]]:
    base = results[baseline].tokens_per_second
    ref = results[mlx_name].tokens_per_second if mlx_name else None
    rows = []
    for arm in results.values():
        speculative = arm.rounds > 0
        rows.append(
            [
                arm.name,
                label,
                f"{arm.tokens_per_second:.1f}",
                f"{arm.tokens_per_second / base:.2f}x",
                f"{arm.tokens_per_second / ref:.2f}x" if ref else "",
                f"{arm.mean_accepted_len:.2f}" if speculative else "",
                f"{arm.per_position_acceptance:.3f}" if speculative else "",
            ]
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = arguments("speculative", __doc__)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument(
        "--sets",
        choices=("all", "block", "coupling"),
        default="all",
        help="block: the block drafters only; coupling: coupled against uncoupled and stochastic drafts",
    )
    parser.add_argument(
        "--temperatures",
        type=lambda text: [float(t) for t in text.split(",")],
        default=COUPLING_TEMPERATURES,
        help="--sets coupling: one row set per temperature",
    )
    parser.add_argument(
        "--target", choices=(GROWN_1_2B,), help="the embedded target grown to 1.2 B (built first); default: embedded"
    )
    parser.add_argument("--write", action="store_true", help=WRITE_HELP)
    args = parser.parse_args(argv)
    n, k = args.tokens, args.k

    with tempfile.TemporaryDirectory() as scratch:
        if args.target == GROWN_1_2B:
            stage(f"building and loading {GROWN_1_2B}")
            grown = build_grown_1_2b(Path(scratch) / GROWN_1_2B)
            pair = Pair(load_model(grown.target), grown.root, GROWN_1_2B)
        else:
            stage("loading the embedded pair")
            pair = Pair(load_model(EMBEDDED_TARGET), REPO_ROOT / "models")
        if args.sets == "coupling":
            run_coupling_sets(pair, n, k, args.repeats, args.temperatures, args.write)
            return
        if args.sets == "all":
            run_classic_sets(pair, n, k, args.repeats, args.write)
        run_block_sets(pair, n, args.repeats, args.write)


def run_classic_sets(pair: Pair, n: int, k: int, repeats: int, write: bool) -> None:
    """The classic draft model, mlx-lm's loops and prompt lookup, each set against target-only."""
    target = pair.target
    drafter = load_model(EMBEDDED_DRAFTER, role="drafter")
    encode = target.tokenizer.encode
    plain = LoopBuilder(target, None, LoopPlan())
    classic, uncoupled, stochastic = (classic_builder(target, drafter, k, rule) for rule in CLASSIC_RULES)
    lookup_cli = LoopBuilder(target, None, LoopPlan(drafter_kind="prompt-lookup", num_draft_tokens=7))
    lookup_server = LoopBuilder(
        target, None, LoopPlan(drafter_kind="prompt-lookup", num_draft_tokens=7, governor_policy="break-even")
    )

    code = [encode(p) for p in HELD_OUT_CODE]
    greedy = run_set(
        {
            "target-only": lambda p, s: ours(plain, p, GREEDY, n, s),
            f"classic k={k}": lambda p, s: ours(classic, p, GREEDY, n, s),
            f"mlx-lm speculative k={k}": lambda p, s: mlx_lm(target, drafter, p, 0.0, n, k, s),
            "mlx-lm target-only": lambda p, s: mlx_lm(target, None, p, 0.0, n, k, s),
        },
        code,
        repeats,
    )
    warm = run_set(
        {
            "target-only": lambda p, s: ours(plain, p, WARM, n, s),
            f"classic k={k} sampler-match": lambda p, s: ours(classic, p, WARM, n, s),
            f"classic k={k} sampler-match uncoupled": lambda p, s: ours(uncoupled, p, WARM, n, s),
            f"classic k={k} stochastic": lambda p, s: ours(stochastic, p, WARM, n, s),
            f"mlx-lm speculative k={k}": lambda p, s: mlx_lm(target, drafter, p, 0.7, n, k, s),
        },
        code,
        repeats,
    )
    lookup_arms = {
        "target-only": lambda p, s: ours(plain, p, GREEDY, n, s),
        "prompt lookup (CLI gated governor)": lambda p, s: ours(lookup_cli, p, GREEDY, n, s),
        "prompt lookup (server break-even governor)": lambda p, s: ours(lookup_server, p, GREEDY, n, s),
    }
    copy = run_set(lookup_arms, [encode(p) for p in COPY_HEAVY], repeats)
    prose = run_set(lookup_arms, [encode(p) for p in PROSE], repeats)
    # Ours against our target-only (the contract); mlx-lm's against its own target-only. On the GPU
    # the two pairs differ from each other: ours run the row-invariant kernels, mlx-lm MLX's.
    identical = greedy["target-only"].outputs == greedy[f"classic k={k}"].outputs
    mlx_identical = greedy["mlx-lm target-only"].outputs == greedy[f"mlx-lm speculative k={k}"].outputs
    header = [
        "arm",
        "prompts, T",
        "tokens/s",
        "vs target-only",
        "vs mlx-lm speculative",
        "mean accepted len",
        "per-position acceptance",
    ]
    rows = (
        rows_for(greedy, "target-only", f"mlx-lm speculative k={k}", "held-out code, T=0")
        + rows_for(warm, "target-only", f"mlx-lm speculative k={k}", "held-out code, T=0.7")
        + rows_for(copy, "target-only", None, "copy-heavy edits, T=0")
        + rows_for(prose, "target-only", None, "prose, T=0")
    )
    body = "\n".join(
        [
            "## Offline round loops (`ops/bench/speculative.py`)",
            "",
            f"{machine()}. {pair.described}{len(HELD_OUT_CODE)} held-out code prompts, {len(COPY_HEAVY)} "
            f"copy-heavy and {len(PROSE)} prose prompts; {n} tokens each, EOS ignored, {repeats} interleaved repeats; "
            "wall time includes prefill. mlx-lm arms run on the same loaded models. Mean accepted "
            "length is accepted drafts per round (add 1 for tokens per target forward).",
            "",
            table(header, rows),
            "",
            f"T=0 classic output identical to target-only: {'yes' if identical else 'NO'}; "
            f"mlx-lm speculative identical to mlx-lm target-only: {'yes' if mlx_identical else 'NO'}.",
        ]
    )
    print(body)
    if write:
        write_section(pair.section("speculative"), body)


CLASSIC_RULES = ("sampler-match", "sampler-match uncoupled", "stochastic")  # the arms of each lossless set
COUPLING_TEMPERATURES = [0.7, 1.0, 0.3]
ACCEPTANCE_GOAL, SPEED_GOAL = 0.9, 0.95  # issue 39: coupled sampler-match against the stochastic rule


def classic_builder(target: LoadedModel, drafter: LoadedModel, k: int, rule: str) -> LoopBuilder:
    """The draft model's loop under one of CLASSIC_RULES."""
    switches = Switches(stochastic_accept=rule == "stochastic")
    plan = LoopPlan(drafter_kind="draft-model", num_draft_tokens=k, switches=switches, coupled=rule == "sampler-match")
    return LoopBuilder(target, drafter, plan)


def block_builder(
    pair: Pair, name: str, block_rule: str, stochastic: bool = False, coupled: bool = True
) -> LoopBuilder:
    """A block drafter's loop as its profile builds it, under `block_rule` (and the stochastic
    switch; `coupled`: speculative.coupled)."""
    kind = "mtp" if name == "mtp" else "dflash"
    settings = Settings(
        drafter=DrafterSettings(kind=kind, model=str(pair.drafters / name), block_rule=block_rule),
        speculative=SpeculativeSettings(coupled=coupled),
    )
    environ = {STOCHASTIC_ACCEPT_ENV: "1" if stochastic else "0"}
    return LoopBuilder(pair.target, None, plan_from_settings(settings, environ=environ))


def lossless_block_builder(pair: Pair, name: str, rule: str) -> LoopBuilder:
    """A block drafter under `drafter.block_rule = "lossless"` and one of CLASSIC_RULES."""
    return block_builder(pair, name, "lossless", stochastic=rule == "stochastic", coupled=rule == "sampler-match")


def heading(title: str, sets: str) -> str:
    return f"## {title} (`ops/bench/speculative.py --sets {sets}`)" + (", GPU" if backend().gpu else "")


def held_out(pair: Pair, n: int, repeats: int) -> str:
    """The opening of a held-out-code section: the machine, the target and the runs."""
    return (
        f"{machine()}. {pair.described}{len(HELD_OUT_CODE)} held-out code prompts, {n} tokens each, EOS ignored, "
        f"{repeats} interleaved repeats, seeded; wall time includes prefill. "
    )


def block_rows(results: dict[str, Arm], builders: dict[str, LoopBuilder]) -> list[list[str]]:
    base = results["target-only"].tokens_per_second
    rows = []
    for name, arm in results.items():
        builder = builders.get(name)
        controller = builder.block.controller if builder else None
        width = f"{controller.held} ({controller.phase})" if controller else ""
        rows.append(
            [
                name,
                width,
                f"{arm.tokens_per_second:.1f}",
                f"{arm.tokens_per_second / base:.2f}x",
                f"{arm.mean_accepted_len:.2f}" if arm.rounds else "",
                f"{arm.per_position_acceptance:.3f}" if arm.rounds else "",
            ]
        )
    return rows


def run_block_sets(pair: Pair, n: int, repeats: int, write: bool) -> None:
    """Block drafters at T = 0 (the profiles' rule) and at T = 0.7 under the lossless rules."""
    target = pair.target
    code = [target.tokenizer.encode(p) for p in HELD_OUT_CODE]
    plain = LoopBuilder(target, None, LoopPlan())
    names = ("mtp", "dflash", "dspark", "muse")
    cold_builders = {name: block_builder(pair, name, "argmax-against-argmax") for name in names}
    cold = run_set(
        {"target-only": lambda p, s: ours(plain, p, GREEDY, n, s)}
        | {name: (lambda p, s, b=b: ours(b, p, GREEDY, n, s)) for name, b in cold_builders.items()},
        code,
        repeats,
    )
    warm_builders = {
        f"{name} {rule}": lossless_block_builder(pair, name, rule) for name in names for rule in CLASSIC_RULES
    }
    warm = run_set(
        {"target-only": lambda p, s: ours(plain, p, WARM, n, s)}
        | {name: (lambda p, s, b=b: ours(b, p, WARM, n, s)) for name, b in warm_builders.items()},
        code,
        repeats,
    )
    identical = all(cold[name].outputs == cold["target-only"].outputs for name in cold_builders)
    body = "\n".join(
        [
            heading("Block drafters", "block"),
            "",
            held_out(pair, n, repeats) + "Each drafter's width controller is shared by all its requests, as in the "
            "server; the width is where it stands after the run (settled, or still measuring).",
            "",
            "### T=0 (`argmax-against-argmax`, exact here)",
            "",
            table(BLOCK_HEADER, block_rows(cold, cold_builders)),
            "",
            f"T=0 block-loop outputs identical to target-only: {'yes' if identical else 'NO'}.",
            "",
            '### T=0.7, `drafter.block_rule = "lossless"` (sampler-match with coupled drafts, and with '
            f"`speculative.coupled = false`; stochastic with `{STOCHASTIC_ACCEPT_ENV}=1`)",
            "",
            table(BLOCK_HEADER, block_rows(warm, warm_builders)),
        ]
    )
    print(body)
    if write:
        write_section(pair.section("speculative-block"), body)


def coupling_rows(results: dict[str, Arm], temperature: float) -> list[list[str]]:
    base = results["target-only"].tokens_per_second
    return [
        [
            arm.name,
            f"{temperature:g}",
            f"{arm.tokens_per_second:.1f}",
            f"{arm.tokens_per_second / base:.2f}x",
            f"{arm.mean_accepted_len:.2f}" if arm.rounds else "",
            f"{arm.per_position_acceptance:.3f}" if arm.rounds else "",
        ]
        for arm in results.values()
    ]


def coupling_goals(results: dict[str, Arm], temperature: float, drafter: str) -> str:
    """Issue 39's goals for one drafter at one temperature: coupled sampler-match's per-position
    acceptance and speed-up against the stochastic rule's."""
    base = results["target-only"].tokens_per_second
    coupled, stochastic = results[f"{drafter} sampler-match"], results[f"{drafter} stochastic"]
    acceptance = coupled.per_position_acceptance / stochastic.per_position_acceptance
    speed = coupled.tokens_per_second / stochastic.tokens_per_second
    return (
        f"- {drafter}, T={temperature:g}: per-position acceptance {coupled.per_position_acceptance:.3f} against "
        f"{stochastic.per_position_acceptance:.3f}, {acceptance:.2f}x (goal ≥ {ACCEPTANCE_GOAL}x: "
        f"{'met' if acceptance >= ACCEPTANCE_GOAL else 'missed'}); speed-up {coupled.tokens_per_second / base:.2f}x "
        f"against {stochastic.tokens_per_second / base:.2f}x, {speed:.2f}x (goal ≥ {SPEED_GOAL}x: "
        f"{'met' if speed >= SPEED_GOAL else 'missed'})."
    )


def run_coupling_sets(pair: Pair, n: int, k: int, repeats: int, temperatures: list[float], write: bool) -> None:
    """Issue 39: the classic draft model and MTP (lossless), coupled and uncoupled sampler-match
    and the stochastic rule, against target-only, at each temperature; each set in one run."""
    target = pair.target
    drafter = load_model(EMBEDDED_DRAFTER, role="drafter")
    code = [target.tokenizer.encode(p) for p in HELD_OUT_CODE]
    plain = LoopBuilder(target, None, LoopPlan())
    classic, mtp = f"classic k={k}", "mtp"
    builders = {f"{classic} {rule}": classic_builder(target, drafter, k, rule) for rule in CLASSIC_RULES}
    builders |= {f"{mtp} {rule}": lossless_block_builder(pair, "mtp", rule) for rule in CLASSIC_RULES}
    rows, goals = [], []
    for temperature in temperatures:
        sampling = SamplingParams(temperature=temperature)
        arms = {"target-only": lambda p, s, t=sampling: ours(plain, p, t, n, s)}
        arms |= {name: (lambda p, s, b=b, t=sampling: ours(b, p, t, n, s)) for name, b in builders.items()}
        results = run_set(arms, code, repeats)
        rows += coupling_rows(results, temperature)
        goals += [coupling_goals(results, temperature, name) for name in (classic, mtp)]
        identical = all(
            results[name].outputs == results["target-only"].outputs for name in builders if "sampler" in name
        )
        goals.append(
            f"- T={temperature:g}: sampler-match outputs identical to target-only: {'yes' if identical else 'NO'}."
        )
    header = ["arm", "T", "tokens/s", "vs target-only", "mean accepted len", "per-position acceptance"]
    body = "\n".join(
        [
            heading("Coupled drafts", "coupling"),
            "",
            held_out(pair, n, repeats) + "Sampler-match with coupled drafts (`speculative.coupled`, the default), with "
            f"`speculative.coupled = false`, and the stochastic rule (`{STOCHASTIC_ACCEPT_ENV}=1`); MTP under "
            '`drafter.block_rule = "lossless"`.',
            "",
            table(header, rows),
            "",
            *goals,
        ]
    )
    print(body)
    if write:
        write_section(pair.section("speculative-coupling"), body)


if __name__ == "__main__":
    main()
