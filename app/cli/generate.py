"""`mlxcel generate`: decode one prompt offline, streaming text to stdout, as `serve` would serve it.

It takes the path a server's request takes: a profile (`--profile NAME|FILE`, `target-only` by
default, so it drafts only when asked) with `serve`'s flags as its overrides, settled and checked
as `serve` settles it, the loop plan built from it, and the loop builder's row for the prompt
with the profile's sampler defaults and seed. Every drafter kind and rule runs, and the same
events are logged (to stderr when MLXCEL_LOG is set); after a verify round the acceptance
summary is printed on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import msgspec
from mlx_lm.tokenizer_utils import TokenizerWrapper

from app.acceptance import diagnostic_line, summary_line
from app.cli.exit_codes import EXIT_FAILURE
from app.decoding.block_builder import DrafterUnavailableError
from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.generation import Generation
from app.decoding.plan import LoopPlan, plan_from_settings
from app.drafters.kinds import DrafterKind, resolve_drafter_kind
from app.engine.host import ModelInfo, startup
from app.events.generate import speculative_decode_finished
from app.events.speculation import acceptance_rule_active
from app.execution.model import load_model
from app.loading import read_checkpoint
from app.profiles import ProfileError, Resolved, add_profile_flags, settled
from app.profiles.loader import flags_of, resolve
from app.profiles.schema import Settings
from app.profiles.tenants import ANONYMOUS
from app.runtime.logging import configure_logging
from app.sampling import SamplingParams
from app.sampling.dry import dry_breakers
from app.sampling.infill import with_infill
from app.sampling.rng import resolve_seed

PROFILE = "target-only"  # without --profile (or MLXCEL_PROFILE): the target alone, unless a flag names a drafter


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "generate", allow_abbrev=False, help="generate text from one prompt, on a profile (default: target-only)"
    )
    p.add_argument("-p", "--prompt", required=True, help="the prompt (a user message unless --no-chat-template)")
    p.add_argument("--no-chat-template", action="store_true", help="feed the prompt as raw text")
    p.add_argument("--max-kv-size", type=int, default=None, help="rotating KV cache of this many rows")
    p.add_argument(
        "--prompt-lookup",
        action="store_const",
        const=str(DrafterKind.PROMPT_LOOKUP),
        dest="draft_kind",
        help="draft from n-gram lookups in the context (--draft-kind prompt-lookup)",
    )
    add_profile_flags(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    configure_logging(os.environ.get("MLXCEL_LOG"))
    resolved = settled(resolve(args.profile, flags_of(args), default=PROFILE))
    settings = resolved.settings
    if settings.target.parallel == "tensor":
        raise ProfileError(f"{settings.source}: target.parallel = tensor: only `mlxcel serve` shards a target")
    plan = plan_from_settings(settings)
    if args.max_kv_size is not None:
        plan = dataclasses.replace(plan, max_kv_size=args.max_kv_size)
    say_drafter(resolved)
    target_settings = settings.target
    target = load_model(
        target_settings.model,
        exact=plan.exact,
        adapter=target_settings.adapter_path,
        adapter_scale=target_settings.adapter_scale,
    )
    drafter = None
    if plan.drafter_kind is DrafterKind.DRAFT_MODEL:
        drafter = load_model(settings.drafter.model, role="drafter", exact=plan.exact)
    builder = LoopBuilder(target, drafter, plan)
    # no tool probe: its greedy row would cost this one request's time and tell it nothing
    acceptance_rule_active(**startup(settings, plan, ModelInfo.of(builder, settings, probe_tools=False), None))
    try:
        generation = builder.build(row_request(settings, target.tokenizer, args))
    except DrafterUnavailableError as exc:  # the server answers this request 503 and goes on
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    generation.log_notes(None)
    stream(generation)
    report(generation, settings, plan)
    return 0


def say_drafter(resolved: Resolved) -> None:
    """The drafter kind and where it came from, on stderr (nothing without a drafter)."""
    drafter = resolved.settings.drafter
    if drafter.kind == DrafterKind.NONE:
        return
    checkpoint = read_checkpoint(drafter.model) if drafter.model else None
    resolution = resolve_drafter_kind(None if resolved.drafter_detected else drafter.kind, checkpoint)
    for line in resolution.lines():
        print(line, file=sys.stderr)


def row_request(settings: Settings, tokenizer: TokenizerWrapper, args: argparse.Namespace) -> RowRequest:
    """The prompt's row, as a request that sets nothing but its prompt gets it from this profile."""
    drafter = settings.drafter
    return RowRequest(
        prompt=encode_prompt(tokenizer, args.prompt, not args.no_chat_template),
        sampling=sampling(settings, tokenizer),
        max_tokens=settings.sampling.n_predict,
        seed=resolve_seed(settings.sampling.seed),
        n_min=drafter.min_draft_tokens,
        p_min=drafter.p_min,
    )


def sampling(settings: Settings, tokenizer: TokenizerWrapper) -> SamplingParams:
    """The profile's sampler defaults, DRY's breakers as the tokenizer's tokens."""
    params = settings.sampling.params()
    if params.has_dry:
        breakers = dry_breakers(tokenizer, params.dry_sequence_breakers, ANONYMOUS)
        params = msgspec.structs.replace(params, dry_breakers=breakers)
    problems = params.problems()
    if problems:
        raise ProfileError(f"{settings.source}: [sampling]: {'; '.join(problems)}")
    return with_infill(params, tokenizer)


def encode_prompt(tokenizer: TokenizerWrapper, prompt: str, use_template: bool) -> list[int]:
    if use_template and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}]
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    return list(tokenizer.encode(prompt))


def stream(generation: Generation) -> None:
    out = sys.stdout
    for delta in generation:
        generation.log_notes(None)
        out.write(delta.text)
        out.flush()
    out.write("\n")


def report(generation: Generation, settings: Settings, plan: LoopPlan) -> None:
    """The tokens/s line on stderr; where a drafter ran, the acceptance summary on stdout (and its
    event, after a verify round)."""
    decode_s = generation.last_token_at - generation.prefill_finished
    prefill_s = generation.prefill_finished - generation.prefill_started
    n = len(generation.emitted)
    rate = (n - 1) / decode_s if n > 1 and decode_s > 0 else 0.0
    print(
        f"prompt: {generation.prompt_n} tokens in {prefill_s:.3f} s; generated: {n} tokens, {rate:.1f} tokens/s",
        file=sys.stderr,
    )
    speculation, stats = generation.speculation, generation.stats.acceptance
    if not speculation.drafting:
        return
    print(summary_line(speculation.rule, stats, speculation.description))
    if plan.switches.accept_diag:
        print(diagnostic_line(stats))
    if (speculated := generation.speculated()) is not None:  # as the server's event: after a verify round
        speculative_decode_finished(profile=settings.profile, **speculated)
