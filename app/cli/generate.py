"""`mlxcel generate`: decode one prompt offline, streaming text to stdout."""

from __future__ import annotations

import argparse
import sys

import mlx.core as mx

from app.acceptance import describe, diagnostic_line, summary_line
from app.decoding.builder import DIAG_ENV, LoopBuilder, LoopSpec, RowRequest
from app.loading import EMBEDDED_TARGET, load_model
from app.runtime.env import truthy
from app.sampling import SamplingParams


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("generate", help="generate text from one prompt")
    p.add_argument("-m", "--model", default=str(EMBEDDED_TARGET), help="target model directory")
    p.add_argument("-p", "--prompt", required=True)
    p.add_argument("-n", "--n-predict", type=int, default=128, help="tokens to generate (-1: until EOS)")
    p.add_argument("--temp", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--repeat-last-n", type=int, default=64)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=-1, help="-1: a random seed")
    p.add_argument("--no-chat-template", action="store_true", help="feed the prompt as raw text")
    p.add_argument("--max-kv-size", type=int, default=None, help="rotating KV cache of this many rows")
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
        raise SystemExit(f"error: {'; '.join(problems)}")
    return params


def encode_prompt(tokenizer: object, prompt: str, use_template: bool) -> list[int]:
    if use_template and getattr(tokenizer, "chat_template", None):
        return list(
            tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        )
    return list(tokenizer.encode(prompt))


def run(args: argparse.Namespace) -> int:
    target = load_model(args.model)
    builder = LoopBuilder(target, None, LoopSpec(max_kv_size=args.max_kv_size))
    if args.seed >= 0:
        mx.random.seed(args.seed)
    prompt = encode_prompt(target.tokenizer, args.prompt, not args.no_chat_template)
    generation = builder.build(
        RowRequest(prompt=prompt, sampling=sampling_from(args), max_tokens=args.n_predict, seed=args.seed)
    )
    out = sys.stdout
    out.write(generation.prefill().text)
    while not generation.finished:
        out.write(generation.step().text)
        out.flush()
    out.write("\n")
    report(generation)
    return 0


def report(generation: object) -> None:
    """The tokens/s line on stderr; after a speculative run, the acceptance summary on stdout."""
    decode_s = generation.last_token_at - generation.prefill_finished
    prefill_s = generation.prefill_finished - generation.prefill_started
    n = len(generation.emitted)
    rate = (n - 1) / decode_s if n > 1 and decode_s > 0 else 0.0
    print(
        f"prompt: {generation.prompt_n} tokens in {prefill_s:.3f} s; generated: {n} tokens, "
        f"{rate:.1f} tokens/s",
        file=sys.stderr,
    )
    loop = generation.loop
    if loop.stats is None or loop.rule is None:
        return
    one_hot = getattr(loop, "drafter", None) is not None and loop.drafter.one_hot_proposals
    print(summary_line(loop.rule, loop.stats, describe(loop.rule, one_hot_proposals=one_hot)))
    if truthy(__import__("os").environ.get(DIAG_ENV)):
        print(diagnostic_line(loop.stats))
