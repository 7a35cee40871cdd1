"""The prompt cache's two goals (issue 15), on one server per profile, cache on and off in the same run.

1. Chat replay: a 500-token system prompt, then 6 turns each adding about 60 tokens (the user's
   message and the reply). Time to first token at turn 6 with `cache_prompt: true` (the earlier
   turns filled the cache) against `cache_prompt: false`, client-side: from sending the request
   to the first streamed token.
2. Repeated prefix: one 1,000-token document, different questions after it; aggregate throughput
   (requests and generated tokens per second over the whole set) with and without the cache.

Prompts are token ids (built with /tokenize), so every turn extends the last one exactly. Each
conversation and document is fresh (no earlier run's entries hit), and the arms alternate.

    python -m ops.bench.prompt_cache [--profiles default target-only mtp] [--repeats 3] [--note TEXT] [--write]
"""

from __future__ import annotations

# isort: off
from ops.bench.common import WRITE_HELP, arguments, machine, progress  # first: sets up MLX's BLAS
from ops.bench.common import stage, table, write_section

# isort: on
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import httpx

from app.execution.prompt_cache import exact_grain
from ops.bench.spawn import spawned_server

SYSTEM_TOKENS, TURNS, TURN_TOKENS, DOCUMENT_TOKENS, QUESTIONS = 500, 6, 60, 1000, 8
WORDS = [
    *("the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at", "from", "his"),
    *("her", "an", "which", "or", "be", "are", "this", "had", "not", "but"),
]


def text_tokens(url: str, seed: int, n: int) -> list[int]:
    """n token ids of fresh English-like text (seed picks it)."""
    words = " ".join(WORDS[(seed * 31 + i * 7 + i * i) % len(WORDS)] + str((seed + i) % 97) for i in range(n))
    return httpx.post(f"{url}/tokenize", json={"content": words}, timeout=60).json()["tokens"][:n]


def first_token_s(url: str, prompt: list[int], cache: bool, n_predict: int = 8) -> float:
    """Client-side seconds from sending a streamed request to its first token."""
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "stream": True, "cache_prompt": cache}
    start, first = time.perf_counter(), None
    with httpx.stream("POST", f"{url}/completion", json=body, timeout=300) as response:
        for line in response.iter_lines():
            if first is None and line.startswith("data: ") and json.loads(line[6:]).get("tokens"):
                first = time.perf_counter() - start
    assert first is not None
    return first


def chat_replay(url: str, seed: int) -> dict[bool, float]:
    """One conversation per arm (fresh tokens each); the arms' turns interleave. Turn 6's TTFT."""
    turn6: dict[bool, float] = {}
    conversations = {cache: text_tokens(url, seed * 2 + cache, SYSTEM_TOKENS) for cache in (True, False)}
    for turn in range(TURNS):
        for cache in (True, False) if turn % 2 == 0 else (False, True):
            conversations[cache] += text_tokens(url, seed * 100 + turn * 2 + cache, TURN_TOKENS)
            turn6[cache] = first_token_s(url, conversations[cache], cache)
    return turn6


def generated_by(url: str, body: dict) -> int:
    return httpx.post(f"{url}/completion", json=body, timeout=300).json()["tokens_predicted"]


def repeated_document(url: str, seed: int, cache: bool, n_predict: int, clients: int) -> tuple[float, int]:
    """The questions after one document, `clients` at a time; (wall seconds, generated tokens).
    With several clients, one untimed question goes first in both arms (with the cache it fills it)."""
    document = text_tokens(url, 7000 + seed * 2 + cache + 10 * clients, DOCUMENT_TOKENS)
    bodies = [
        {"prompt": document + text_tokens(url, 9000 + seed * 50 + q, 20), "n_predict": n_predict, "temperature": 0}
        | {"ignore_eos": True, "cache_prompt": cache}
        for q in range(QUESTIONS + (clients > 1))
    ]
    if clients > 1:
        generated_by(url, bodies.pop())
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        generated = sum(pool.map(partial(generated_by, url), bodies))
    return time.perf_counter() - start, generated


def throughput(runs: dict[bool, list[tuple[float, int]]]) -> list[str]:
    """Requests/s and tokens/s without and with the cache, and the speed-up."""
    seconds = {cache: sum(s for s, _ in r) for cache, r in runs.items()}
    requests = {cache: QUESTIONS * len(r) / seconds[cache] for cache, r in runs.items()}
    tokens = {cache: sum(g for _, g in r) / seconds[cache] for cache, r in runs.items()}
    return [f"{requests[False]:.2f}", f"{requests[True]:.2f}", f"{tokens[False]:.1f}", f"{tokens[True]:.1f}",
            f"{requests[True] / requests[False]:.1f}x"]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = arguments("prompt_cache", __doc__)
    parser.add_argument("--profiles", nargs="+", default=["default", "target-only", "mtp"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32, help="generated per question (repeated-prefix set)")
    parser.add_argument("--note", default="", help="a line for the section (e.g. the machine's state)")
    parser.add_argument("--write", action="store_true", help=WRITE_HELP)
    args = parser.parse_args(argv)
    chat_rows, document_rows = [], []
    bar = progress(len(args.profiles) * args.repeats * 5, "chat replays and question sets")
    for profile in args.profiles:
        stage(f"starting the {profile} server")
        with spawned_server(profile) as (url, _):
            ttft: dict[bool, list[float]] = {True: [], False: []}
            runs = {clients: {True: [], False: []} for clients in (1, QUESTIONS)}
            for repeat in range(args.repeats):
                for cache, seconds in chat_replay(url, repeat).items():
                    ttft[cache].append(seconds)
                bar.update()
                for clients, arms in runs.items():
                    for cache in (True, False) if repeat % 2 == 0 else (False, True):
                        arms[cache].append(repeated_document(url, repeat, cache, args.tokens, clients))
                        bar.update()
        on, off = statistics.median(ttft[True]) * 1000, statistics.median(ttft[False]) * 1000
        chat_rows.append([profile, f"{off:.0f}", f"{on:.0f}", f"{off / on:.1f}x"])
        for clients, arms in runs.items():
            document_rows.append(
                [profile, "one at a time" if clients == 1 else f"{clients} at once", *throughput(arms)]
            )
    bar.close()
    body = "\n".join(
        [
            "## Prompt cache (`ops/bench/prompt_cache.py`)",
            "",
            f"{machine()}. One server per profile, `cache_prompt: false` and `true` alternating in the same run, "
            f"{args.repeats} repeats, fresh prompts each (token ids), T=0. Prefixes are reused in whole "
            f"{exact_grain()}-token grains (app/execution/prompt_cache.py).",
            *(["", args.note] if args.note else []),
            "",
            f"Chat replay: a {SYSTEM_TOKENS}-token system prompt, {TURNS} turns of {TURN_TOKENS} tokens each; "
            "client-side time to first streamed token at turn 6 (median). Goal: at least 5x lower with the cache.",
            "",
            table(["profile", "turn 6 TTFT, no cache (ms)", "with cache (ms)", "speed-up"], chat_rows),
            "",
            f"Repeated prefix: one {DOCUMENT_TOKENS}-token document, {QUESTIONS} different 20-token questions "
            f"after it, {args.tokens} tokens each (EOS ignored), sent one at a time, or all at once after one "
            "untimed question (in both arms; with the cache it fills it). Goal: at least 2x the throughput.",
            "",
            table(
                [
                    "profile",
                    "questions",
                    "requests/s, no cache",
                    "with cache",
                    "tokens/s, no cache",
                    "with cache",
                    "speed-up",
                ],
                document_rows,
            ),
        ]
    )
    print(body)
    if args.write:
        write_section("prompt-cache", body)


if __name__ == "__main__":
    main()
