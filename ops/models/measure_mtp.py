"""Per-depth acceptance of an MTP head through the real round loop, on the held-out code prompts.

    python -m ops.models.measure_mtp [--drafter models/mtp] [--tokens 256]

Greedy (T = 0), EOS ignored, the head's declared width with the adaptive controller off. Depth d
is the head's d-th chained proposal of a round; its acceptance is accepted at d / tested at d,
where a depth is tested only in rounds whose earlier proposals were all accepted. Also checks the
output is byte-identical to target-only greedy decoding, and times both loops in process CPU
seconds (the development machine is shared; CPU time moves less under load than wall time).
"""

from __future__ import annotations

# isort: off
import ops.bench.common  # noqa: F401 - first: sets up MLX's BLAS

# isort: on
import argparse
import time
from itertools import zip_longest
from pathlib import Path

from app.acceptance import AcceptanceStats
from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.plan import LoopPlan, plan_from_settings
from app.loading import EMBEDDED_TARGET
from app.execution.model import load_model
from app.profiles.schema import AdaptiveSettings, DrafterSettings, Settings
from app.sampling import SamplingParams
from ops.bench.common import REPO_ROOT
from ops.bench.prompts import HELD_OUT_CODE

GREEDY = SamplingParams(temperature=0.0)


def per_depth(rounds: int, accepted_at: list[int]) -> list[tuple[int, int]]:
    """(accepted, tested) at each chained depth: depth d is tested where depths 1..d-1 were accepted."""
    return list(zip(accepted_at, [rounds, *accepted_at[:-1]], strict=True))


def run(builder: LoopBuilder, prompt: list[int], tokens: int) -> tuple[list[int], AcceptanceStats, float]:
    started = time.process_time()
    generation = builder.build(RowRequest(prompt, GREEDY, max_tokens=tokens, ignore_eos=True))
    generation.prefill()
    while not generation.finished:
        generation.step()
    return generation.emitted, generation.stats.acceptance, time.process_time() - started


def main() -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--drafter", type=Path, default=REPO_ROOT / "models" / "mtp")
    p.add_argument("--tokens", type=int, default=256)
    args = p.parse_args()
    target = load_model(EMBEDDED_TARGET)
    settings = Settings(
        drafter=DrafterSettings(kind="mtp", model=str(args.drafter)), adaptive=AdaptiveSettings(enabled=False)
    )
    mtp, plain = LoopBuilder(target, None, plan_from_settings(settings)), LoopBuilder(target, None, LoopPlan())
    prompts = [target.tokenizer.encode(text) for text in HELD_OUT_CODE]
    run(mtp, prompts[0][:8], 8)  # the drafter's load and exactness probe, untimed
    rounds, accepted, tested, accepted_at, identical = 0, 0, 0, [], True
    seconds = {"mtp": 0.0, "target-only": 0.0}
    for prompt in prompts:
        emitted, stats, cpu = run(mtp, prompt, args.tokens)
        reference, _, plain_cpu = run(plain, prompt, args.tokens)
        identical &= emitted == reference
        seconds["mtp"] += cpu
        seconds["target-only"] += plain_cpu
        rounds, accepted, tested = rounds + stats.rounds, accepted + stats.accepted, tested + stats.positions_tested
        accepted_at = [a + b for a, b in zip_longest(accepted_at, stats.accepted_per_position, fillvalue=0)]
    print(f"drafter {args.drafter}: {len(prompts)} held-out code prompts x {args.tokens} tokens, T = 0")
    for depth, (hits, tries) in enumerate(per_depth(rounds, accepted_at), start=1):
        print(f"depth {depth}: {hits / tries:.3f} ({hits} / {tries})")
    print(f"per-position acceptance {accepted / tested:.3f}, mean accepted per round {accepted / rounds:.2f}, "
          f"rounds {rounds}")  # fmt: skip
    print(f"CPU seconds: mtp {seconds['mtp']:.1f}, target-only {seconds['target-only']:.1f} "
          f"({seconds['target-only'] / seconds['mtp']:.2f}x)")  # fmt: skip
    print(f"byte-identical to target-only greedy: {'yes' if identical else 'NO'}")


if __name__ == "__main__":
    main()
