"""JSON-schema generation: constrained target-only against constrained speculation, with and
without jump-forward, in one process on the embedded pair (offline, like ops/bench/speculative.py).

Arms run interleaved prompt by prompt at T = 0; each request runs until its document is complete
(EOS, allowed only there) or --tokens. Tokens per second are wall-clock, prefill included; the
speculative arms' outputs are checked equal to the target-only arm's (exactness at T = 0).

    python -m ops.bench.structured [--tokens 256] [--repeats 2] [--write]
"""

from __future__ import annotations

# isort: off
from ops.bench.common import WRITE_HELP, Arm, machine, table, timed, write_section  # first: sets up MLX's BLAS

# isort: on
import argparse
from collections.abc import Callable

from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.plan import LoopPlan
from app.execution.model import load_model
from app.loading import EMBEDDED_DRAFTER, EMBEDDED_TARGET
from app.sampling import SamplingParams
from app.sampling.grammar import Constraint, Grammar

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 99999},
        "name": {"type": "string", "maxLength": 24},
        "language": {"enum": ["python", "rust", "javascript", "typescript", "haskell"]},
        "status": {"enum": ["draft", "reviewed", "merged", "abandoned"]},
        "owner": {
            "type": "object",
            "properties": {"login": {"type": "string", "maxLength": 16}, "admin": {"type": "boolean"}},
            "required": ["login", "admin"],
            "additionalProperties": False,
        },
        "labels": {"type": "array", "items": {"enum": ["bug", "feature", "docs", "performance"]}, "maxItems": 4},
        "description": {"type": "string", "maxLength": 80},
    },
    "required": ["id", "name", "language", "status", "owner", "labels", "description"],
    "additionalProperties": False,
}
PROMPTS = [
    "Describe this pull request as JSON.\n",
    "def summarize(pr):\n    return ",
    '{"id": 12, "name": "fix-cache", "language": "python"}\nAnother one:\n',
    "The record for the repository's latest change:\n",
]
JUMPED: dict[str, int] = {}  # per arm: tokens decided by jump-forward (no forward)
GREEDY = SamplingParams(temperature=0.0)
HEADER = ["arm", "tokens/s", "vs target-only", "mean accepted len", "tokens jumped", "same output"]


class NoJumpForward(Constraint):
    """The arms without jump-forward: no token is ever reported forced."""

    def forced(self, limit: int) -> list[int]:
        return []


def arm_run(builder: LoopBuilder, prompt: list[int], n: int, jump: bool, name: str) -> Callable:
    def run() -> tuple[list[int], object]:
        generation = builder.build(RowRequest(prompt, GREEDY, max_tokens=n, grammar=Grammar.json_schema(SCHEMA)))
        if not jump:
            generation.state.constraint.__class__ = NoJumpForward
        generation.prefill()
        while not generation.finished:
            generation.step()
        JUMPED[name] = JUMPED.get(name, 0) + generation.stats.jumped
        return generation.emitted, generation.stats.acceptance

    return run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--write", action="store_true", help=WRITE_HELP)
    args = parser.parse_args(argv)
    target, drafter = load_model(EMBEDDED_TARGET), load_model(EMBEDDED_DRAFTER, role="drafter")
    plain = LoopBuilder(target, None, LoopPlan())
    draft = LoopBuilder(target, drafter, LoopPlan(drafter_kind="draft-model", num_draft_tokens=4))
    lookup = LoopBuilder(target, None, LoopPlan(drafter_kind="prompt-lookup", num_draft_tokens=4))
    arms = {
        "target-only": (plain, False),
        "target-only + jump-forward": (plain, True),
        "draft model": (draft, False),
        "draft model + jump-forward": (draft, True),
        "prompt lookup + jump-forward": (lookup, True),
    }
    results = {name: Arm(name) for name in arms}
    prompts = [target.tokenizer.encode(p) for p in PROMPTS]
    for builder, jump in arms.values():  # untimed warm-up
        arm_run(builder, prompts[0], 8, jump, "warm-up")()
    names = list(arms)
    for r in range(args.repeats):
        for i, prompt in enumerate(prompts):
            shift = (i + r) % len(names)
            for name in names[shift:] + names[:shift]:
                builder, jump = arms[name]
                timed(results[name], arm_run(builder, prompt, args.tokens, jump, name))
    base = results["target-only"]
    rows = []
    for arm in results.values():
        speculative = arm.rounds > 0
        rows.append(
            [
                arm.name,
                f"{arm.tokens_per_second:.1f}",
                f"{arm.tokens_per_second / base.tokens_per_second:.2f}x",
                f"{arm.mean_accepted_len:.2f}" if speculative else "",
                str(JUMPED.get(arm.name, 0)),
                "yes" if arm.outputs == base.outputs else "NO",
            ]
        )
    body = "\n".join(
        [
            "## Structured output (JSON schema)",
            "",
            f"`python -m ops.bench.structured --tokens {args.tokens} --repeats {args.repeats}`: {machine()}.",
            f"T = 0, {len(prompts)} prompts x {args.repeats}, one {len(SCHEMA['properties'])}-key schema with "
            "enums, bounded strings and a nested object; each request runs until its document is complete. "
            "Mean accepted length counts accepted drafts per verify round; tokens jumped were decided "
            "with no forward.",
            "",
            table(HEADER, rows),
        ]
    )
    print(body)
    if args.write:
        write_section("structured-output", body)


if __name__ == "__main__":
    main()
