"""Where a tick of B rows spends its time on the host: the tick's parts and its functions.

B rows of the embedded pair (held-out code prompts, greedy or seeded at `--temperature` with the
server's other sampling defaults, EOS ignored) step together through
`run_together`, as the engine's tick runs them, at their loop's own widths (no width choice:
what a fixed-width arm does). After the prompts are in and `--warm` ticks, `--ticks` ticks are
timed part by part (`TickClock`: the drafting phase, the target's forward, the rest) and run
under cProfile; the functions that took the most of them are listed, by own time and by time
including their callees, with their calls per tick. On a GPU the calls that wait for the device
(an array's `tolist`, `item`, `mx.eval`; `mx.async_eval` only queues) hold the GPU's time too:
their own time is what the host waited, and their calls per tick are the tick's synchronisations.

`--limit N` offers every row at most N drafts a tick, as the tick's choice would (0: plain rounds,
each queuing the next a tick ahead, as the choice's held rows do): a drafting loop's plain ticks
against target-only's.

    python -m ops.bench.tick_profile [--loop target-only|draft-model|mtp] [--rows 16] [--ticks 24] [--temperature 0]
        [--limit N]
"""

from __future__ import annotations

# isort: off
from ops.bench.common import REPO_ROOT, machine, stage  # first: sets up MLX's BLAS

# isort: on
import argparse
import cProfile
import pstats
import statistics
from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx

from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.plan import LoopPlan, plan_from_settings
from app.decoding.width import OWN_WIDTH, WidthOffer
from app.execution.model import load_model
from app.execution.steps import run_together
from app.loading import EMBEDDED_DRAFTER, EMBEDDED_TARGET
from app.profiles.schema import DrafterSettings, Settings
from app.sampling import SamplingParams
from ops.bench.prompts import HELD_OUT_CODE

LOOPS = ("target-only", "draft-model", "mtp")
SYNCS = ("tolist", "item", "eval", "async_eval")  # the calls that wait for the device


@contextmanager
def visible_waits() -> Iterator[None]:
    """MLX's calls that wait for the device, each through a Python function of this module, so
    cProfile sees them with their callers (it does not see MLX's own functions)."""
    originals = {name: getattr(mx, name) for name in ("eval", "async_eval")}
    methods = {name: getattr(mx.array, name) for name in ("tolist", "item")}

    def eval(*arrays: object) -> None:
        return originals["eval"](*arrays)

    def async_eval(*arrays: object) -> None:
        return originals["async_eval"](*arrays)

    def tolist(array: mx.array) -> object:
        return methods["tolist"](array)

    def item(array: mx.array) -> object:
        return methods["item"](array)

    mx.eval, mx.async_eval, mx.array.tolist, mx.array.item = eval, async_eval, tolist, item
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(mx, name, function)
        for name, method in methods.items():
            setattr(mx.array, name, method)


def builder_for(loop: str) -> LoopBuilder:
    target = load_model(EMBEDDED_TARGET)
    if loop == "target-only":
        return LoopBuilder(target, None, LoopPlan())
    if loop == "draft-model":
        drafter = load_model(EMBEDDED_DRAFTER, role="drafter")
        return LoopBuilder(target, drafter, LoopPlan(drafter_kind="draft-model", num_draft_tokens=4))
    settings = Settings(drafter=DrafterSettings(kind="mtp", model=str(REPO_ROOT / "models" / "mtp")))
    return LoopBuilder(target, None, plan_from_settings(settings))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--loop", choices=LOOPS, default="draft-model")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--ticks", type=int, default=24)
    parser.add_argument("--warm", type=int, default=8)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--temperature", type=float, default=0.0, help="above 0: row i seeded i")
    parser.add_argument("--limit", type=int, help="at most N drafts per row and tick (0: plain, queued ahead)")
    args = parser.parse_args(argv)
    stage(f"loading the {args.loop} loop")
    builder = builder_for(args.loop)
    encode = builder.target.tokenizer.encode
    sampling = SamplingParams(temperature=args.temperature)
    seeded = args.temperature > 0
    rows = [
        builder.build(
            RowRequest(
                encode(HELD_OUT_CODE[i % len(HELD_OUT_CODE)]),
                sampling,
                max_tokens=4096,
                ignore_eos=True,
                **({"seed": i} if seeded else {}),
            )
        )
        for i in range(args.rows)
    ]
    offer = OWN_WIDTH if args.limit is None else WidthOffer(limit=args.limit, then_plain=args.limit == 0)
    while not all(row.prefilled for row in rows):
        run_together([row.ticking() for row in rows])
    for _ in range(args.warm):
        run_together([row.ticking(offer) for row in rows])
    clocks, emitted = [], sum(len(row.emitted) for row in rows)
    profile = cProfile.Profile()
    with visible_waits():
        for _ in range(args.ticks):
            profile.enable()
            result = run_together([row.ticking(offer) for row in rows])
            profile.disable()
            clocks.append(result.clock)
    emitted = sum(len(row.emitted) for row in rows) - emitted
    ms = lambda values: statistics.median(values) * 1e3  # noqa: E731
    total = [c.drafting_s + c.forward_s + c.rest_s for c in clocks]
    limited = "" if args.limit is None else f", at most {args.limit} drafts"
    at = f"{args.rows} rows at T = {args.temperature:g}{limited}"
    print(f"{machine()}\n{args.loop}, {at}, {args.ticks} ticks after {args.warm} warm ones")
    print(
        f"tick median {ms(total):.2f} ms: drafting {ms([c.drafting_s for c in clocks]):.2f} "
        f"({statistics.mean(c.passes for c in clocks):.1f} passes), target forward "
        f"{ms([c.forward_s for c in clocks]):.2f}, rest {ms([c.rest_s for c in clocks]):.2f}; "
        f"{emitted / args.ticks / args.rows:.2f} tokens per row and tick, "
        f"{emitted / sum(total):.0f} tokens/s"
    )
    stats = pstats.Stats(profile)
    waits = {k: v for k, v in stats.stats.items() if k[0] == __file__ and k[2] in SYNCS}
    print(f"calls that wait for the device ({', '.join(SYNCS)}), per tick, by caller:")
    for key, (_, calls, own, _, callers) in sorted(waits.items(), key=lambda kv: -kv[1][1]):
        print(f"  {calls / args.ticks:6.1f} {own / args.ticks * 1e3:7.3f} ms  {key[2]}")
        for (file, line, name), caller in sorted(callers.items(), key=lambda kv: -kv[1][1]):
            print(f"      {caller[1] / args.ticks:6.1f}  {name}  {file.removeprefix(str(REPO_ROOT) + '/')}:{line}")
    for key in ("tottime", "cumulative"):
        print(f"\nby {key} (ms per tick, calls per tick):")
        rows_of = sorted(stats.stats.items(), key=lambda kv: kv[1][2 if key == "tottime" else 3], reverse=True)
        for (file, line, name), (_, calls, own, cumulative, _) in rows_of[: args.top]:
            where = f"{file.removeprefix(str(REPO_ROOT) + '/')}:{line}" if line else file
            print(f"  {own / args.ticks * 1e3:7.3f} {cumulative / args.ticks * 1e3:7.3f} "
                  f"{calls / args.ticks:6.1f}  {name}  {where}")  # fmt: skip


if __name__ == "__main__":
    main()
