"""`mlxcel generate`: decode one prompt offline, streaming text to stdout.

With `--draft-model` it runs the classic speculative generator, with `--prompt-lookup` prompt
lookup on the token loop; after either, the acceptance summary is printed on stdout.
"""

from __future__ import annotations

import argparse
import os
import sys

import mlx.core as mx
import structlog

from app.acceptance import diagnostic_line, summary_line
from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.generation import Generation
from app.decoding.plan import LoopPlan, Switches
from app.drafters.kinds import DrafterKind, Resolution, resolve_drafter_kind
from app.drafters.prompt_lookup import PROMPT_LOOKUP_WIDTH
from app.execution.model import LoadedModel, load_model
from app.loading import EMBEDDED_TARGET, Checkpoint, ModelLoadError, read_checkpoint
from app.runtime.logging import configure_logging
from app.sampling import SamplingParams
from app.sampling.rng import resolve_seed

DEFAULT_WIDTH = {DrafterKind.DRAFT_MODEL: 4, DrafterKind.PROMPT_LOOKUP: PROMPT_LOOKUP_WIDTH}


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("generate", help="generate text from one prompt")
    p.add_argument("-m", "--model", default=str(EMBEDDED_TARGET), help="target model directory")
    p.add_argument("-p", "--prompt", required=True, help="the prompt (a user message unless --no-chat-template)")
    p.add_argument("-n", "--n-predict", type=int, default=128, help="tokens to generate (-1: until EOS)")
    p.add_argument("--temp", type=float, default=0.8, help="temperature (0: greedy)")
    p.add_argument("--top-k", type=int, default=40, help="keep the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus: keep the smallest set with this mass")
    p.add_argument("--min-p", type=float, default=0.05, help="drop tokens below this fraction of the top one")
    p.add_argument("--repeat-penalty", type=float, default=1.0, help="penalise recent tokens (1.0: off)")
    p.add_argument("--repeat-last-n", type=int, default=64, help="how many recent tokens the penalties see")
    p.add_argument("--presence-penalty", type=float, default=0.0, help="subtracted once from each recent token")
    p.add_argument("--frequency-penalty", type=float, default=0.0, help="subtracted per occurrence of a token")
    p.add_argument("--seed", type=int, default=-1, help="-1: a random seed; any other integer is taken modulo 2**64")
    p.add_argument("--no-chat-template", action="store_true", help="feed the prompt as raw text")
    p.add_argument("--max-kv-size", type=int, default=None, help="rotating KV cache of this many rows")
    spec = p.add_argument_group("speculative decoding")
    spec.add_argument("--draft-model", help="drafter model directory (the classic speculative generator)")
    spec.add_argument("--prompt-lookup", action="store_true", help="draft from n-gram lookups in the context")
    spec.add_argument(
        "--draft-kind",
        choices=[k.value for k in DrafterKind if k is not DrafterKind.NONE],
        help="drafter kind (default: read from the drafter's config.json)",
    )
    spec.add_argument("--num-draft-tokens", type=int, default=None, help="draft width k (4; prompt lookup 7)")
    spec.add_argument(
        "--governor-policy", choices=["gated", "graded"], default="gated", help="prompt lookup: when to pause drafting"
    )
    spec.add_argument(
        "--no-governor-adaptive", action="store_true", help="prompt lookup: always propose the full block"
    )
    p.set_defaults(handler=run)


def sampling_from(args: argparse.Namespace) -> SamplingParams:
    params = SamplingParams(
        temperature=args.temp,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        repeat_last_n=args.repeat_last_n,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
    )
    problems = params.problems()
    if problems:
        raise ModelLoadError("; ".join(problems))
    return params


def encode_prompt(tokenizer: object, prompt: str, use_template: bool) -> list[int]:
    if use_template and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}]
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    return list(tokenizer.encode(prompt))


def resolve(args: argparse.Namespace) -> Resolution:
    """Which drafter runs; refuses the kinds this offline path does not construct."""
    if args.prompt_lookup or args.draft_kind == DrafterKind.PROMPT_LOOKUP:
        return resolve_drafter_kind(DrafterKind.PROMPT_LOOKUP, None)
    checkpoint = read_checkpoint(args.draft_model) if args.draft_model else None
    resolution = resolve_drafter_kind(args.draft_kind, checkpoint)
    detected_block = checkpoint is not None and resolution.detected is not None and resolution.detected.is_block_loop
    if resolution.kind.is_block_loop or detected_block:
        raise ModelLoadError(block_loop_refusal(resolution, checkpoint if detected_block else None))
    if resolution.kind is DrafterKind.DRAFT_MODEL and checkpoint is None:
        raise ModelLoadError("--draft-kind draft-model needs --draft-model PATH")
    return resolution


def block_loop_refusal(resolution: Resolution, block_checkpoint: Checkpoint | None) -> str:
    """Why this offline path cannot run the drafter asked for, and where it runs instead."""
    if block_checkpoint is not None:
        kind = resolution.detected
        asked = (
            f"{block_checkpoint.path} is a drafter checkpoint of kind {block_checkpoint.kind}; its {kind} round loop"
        )
    else:
        kind = resolution.kind
        asked = f"--draft-kind {kind} selects the {kind} round loop, which"
    return (
        f"mlxcel generate runs only the classic speculative generator and prompt lookup: {asked} "
        f'runs only under `mlxcel serve` (drafter.kind = "{kind}")'
    )


def run(args: argparse.Namespace) -> int:
    configure_logging(os.environ.get("MLXCEL_LOG"))
    log = structlog.get_logger("mlxcel.generate")
    resolution = resolve(args)
    target = load_model(args.model)
    drafter: LoadedModel | None = None
    if resolution.kind is DrafterKind.DRAFT_MODEL:
        drafter = load_model(args.draft_model, role="drafter")
    if resolution.kind is not DrafterKind.NONE:
        for line in resolution.lines():
            print(line, file=sys.stderr)
        if resolution.disagreement:
            print(f"warning: {resolution.disagreement}", file=sys.stderr)
        log.info("drafter_kind_resolved", kind=resolution.kind, explicit=resolution.explicit)
    width = args.num_draft_tokens if args.num_draft_tokens is not None else DEFAULT_WIDTH.get(resolution.kind, 0)
    plan = LoopPlan(
        drafter_kind=resolution.kind,
        num_draft_tokens=width,
        max_kv_size=args.max_kv_size,
        governor_policy=args.governor_policy,
        governor_adaptive=not args.no_governor_adaptive,
        switches=Switches.read(),  # the contract's MLXCEL_* switches, read once
    )
    builder = LoopBuilder(target, drafter, plan)
    seed = resolve_seed(args.seed)  # any integer, as the server takes it; -1 draws one
    mx.random.seed(seed)
    prompt = encode_prompt(target.tokenizer, args.prompt, not args.no_chat_template)
    request = RowRequest(prompt=prompt, sampling=sampling_from(args), max_tokens=args.n_predict, seed=seed)
    generation = builder.build(request)
    speculation = generation.speculation
    if speculation.drafting:
        log.info("acceptance_rule_active", rule=speculation.rule, drafter_kind=resolution.kind, width=width)
    stream(generation)
    report(generation, plan)
    return 0


def stream(generation: Generation) -> None:
    out = sys.stdout
    for delta in generation:
        out.write(delta.text)
        out.flush()
    out.write("\n")


def report(generation: Generation, plan: LoopPlan) -> None:
    """The tokens/s line on stderr; after a speculative run, the acceptance summary on stdout."""
    decode_s = generation.last_token_at - generation.prefill_finished
    prefill_s = generation.prefill_finished - generation.prefill_started
    n = len(generation.emitted)
    rate = (n - 1) / decode_s if n > 1 and decode_s > 0 else 0.0
    print(
        f"prompt: {generation.prompt_n} tokens in {prefill_s:.3f} s; generated: {n} tokens, {rate:.1f} tokens/s",
        file=sys.stderr,
    )
    speculation = generation.speculation
    if not speculation.drafting:
        return
    stats = generation.stats.acceptance
    print(summary_line(speculation.rule, stats, speculation.description))
    if plan.switches.accept_diag:
        print(diagnostic_line(stats))
    structlog.get_logger("mlxcel.generate").info(
        "speculative_decode_finished",
        rule=speculation.rule,
        rounds=stats.rounds,
        proposed=stats.proposed,
        positions_tested=stats.positions_tested,
        accepted=stats.accepted,
        per_position_acceptance=round(stats.per_position_acceptance, 4),
        mean_accepted_len=round(stats.mean_accepted_len, 4),
        predicted_n=n,
    )
