"""The prompt cache through the real server: a hit gives the output of `cache_prompt: false`
(T = 0 byte-identical, seeded T = 0.7 token-identical), counts exactly, and shared prefixes do
not couple concurrent rows. Each test uses prompts of its own, so the shared servers' caches
from other tests never hit. What a hit restores is the shared prefix in whole grains of the
device (app/execution/prompt_cache.py `exact_grain`: one token on the CPU, a prefill chunk on a
GPU), the prompt's last token always left to prefill."""

from __future__ import annotations

import threading

import httpx
import pytest

from app.execution.runner import PREFILL_CHUNK
from tests.support.caching import GRAIN, restored
from tests.support.server import RunningServer

B = PREFILL_CHUNK
GREEDY = {"temperature": 0}
SEEDED = {"temperature": 0.7, "seed": 4321}


def tokens(seed: int, n: int) -> list[int]:
    """A prompt of n token ids of its own (seed)."""
    return [(seed * 7919 + i * 131) % 3900 + 20 for i in range(n)]


def complete(server: RunningServer, prompt: list[int], sampling: dict, **extra: object) -> dict:
    body = {"prompt": prompt, "n_predict": 24, "return_tokens": True, **sampling, **extra}
    response = httpx.post(f"{server.url}/completion", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def assert_hit_is_exact(server: RunningServer, prompt: list[int], sampling: dict) -> None:
    """Uncached, then cached twice (the first fills the cache, the second restores from it)."""
    reference = complete(server, prompt, sampling, cache_prompt=False)
    filling = complete(server, prompt, sampling)
    hit = complete(server, prompt, sampling)
    n = restored(len(prompt), len(prompt))
    assert n >= 2 * B
    assert [b["timings"]["cache_n"] for b in (reference, filling, hit)] == [0, 0, n]
    assert [b["timings"]["prompt_n"] for b in (reference, filling, hit)] == [len(prompt)] * 2 + [len(prompt) - n]
    assert hit["tokens_evaluated"] == len(prompt)
    for body in (filling, hit):
        assert body["tokens"] == reference["tokens"]
        assert body["content"].encode() == reference["content"].encode()


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["T0", "seeded-T0.7"])
def test_a_hit_is_exact_on_target_only(target_only_server, sampling) -> None:
    assert_hit_is_exact(target_only_server, tokens(101 + len(sampling), 2 * B + 37), sampling)


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["T0", "seeded-T0.7"])
def test_a_hit_is_exact_with_the_draft_model(default_server, sampling) -> None:
    """The target's and the draft model's prefixes are both restored."""
    assert_hit_is_exact(default_server, tokens(201 + len(sampling), 2 * B + 37), sampling)


@pytest.mark.slow
@pytest.mark.xdist_group("prompt-lookup")  # with the other tests of its profile's server (tests/conftest.py)
@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["T0", "seeded-T0.7"])
def test_a_hit_is_exact_with_prompt_lookup(profile_server, sampling) -> None:
    prompt = tokens(301 + len(sampling), 2 * B + 37)
    assert_hit_is_exact(profile_server("prompt-lookup"), prompt + prompt[:60], sampling)


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["stochastic", "mtp", "dflash", "dspark", "muse"])
def test_a_hit_is_exact_with_every_other_profile(profile_server, profile: str) -> None:
    """The rest of the shipped profiles, T = 0 and seeded T = 0.7 on a cached chunk and more: block
    drafters restore their context rows with the target's prefix (DSpark serves T > 0 with classic
    decode, which restores the target's rows of the same entry; an MTP row reads the token after
    it, so its entry holds one row less than the prompt, which the last prefilled token covers)."""
    server, prompt, short = profile_server(profile), tokens(801 + len(profile), B + 9), {"n_predict": 8}
    complete(server, prompt, GREEDY | {"n_predict": 1})  # fills the cache
    for sampling in (GREEDY, SEEDED):
        reference = complete(server, prompt, sampling | short, cache_prompt=False)
        hit = complete(server, prompt, sampling | short)
        n = restored(len(prompt), len(prompt))
        assert (reference["timings"]["cache_n"], hit["timings"]["cache_n"], hit["timings"]["prompt_n"]) == (
            0,
            n,
            len(prompt) - n,
        )
        assert hit["tokens"] == reference["tokens"]
        assert hit["content"].encode() == reference["content"].encode()
        if sampling is GREEDY:
            assert hit["timings"]["draft_kind"] == reference["timings"]["draft_kind"]


def test_cache_n_and_cached_tokens_are_exact(target_only_server) -> None:
    """A prompt one token past two chunks restores both; one exactly two chunks long restores its
    tokens but the last (always prefilled), in whole grains; a prompt that leaves the cached one
    after B + 3 tokens restores those; OpenAI's usage reports the same count."""
    server, prompt = target_only_server, tokens(501, 2 * B + 1)
    complete(server, prompt, GREEDY)
    assert complete(server, prompt, GREEDY)["timings"]["cache_n"] == 2 * B
    assert complete(server, prompt[: 2 * B], GREEDY)["timings"]["cache_n"] == restored(2 * B, 2 * B)
    assert complete(server, [*prompt[: B + 3], 7, 8, 9], GREEDY)["timings"]["cache_n"] == restored(B + 3, B + 6)
    body = {"prompt": [*prompt, 11], "max_tokens": 4, "temperature": 0}
    usage = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()["usage"]
    cached = restored(2 * B + 1, 2 * B + 2)
    assert usage["prompt_tokens"] == 2 * B + 2 and usage["prompt_tokens_details"] == {"cached_tokens": cached}
    uncached = httpx.post(f"{server.url}/v1/completions", json=body | {"cache_prompt": False}, timeout=60).json()
    assert uncached["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_concurrent_rows_sharing_a_cached_prefix_get_their_solo_outputs(default_server) -> None:
    """Four rows restore one entry at once (the target's rows and the draft model's) and decode
    together; each decides what it decides alone."""
    server, shared = default_server, tokens(601, 2 * B)
    prompts = [shared + tokens(610 + i, 20 + i) for i in range(4)]
    samplings = [GREEDY, SEEDED, GREEDY | {"n_predict": 40}, SEEDED | {"seed": 99}]
    solo = [complete(server, p, s, cache_prompt=False)["tokens"] for p, s in zip(prompts, samplings, strict=True)]
    complete(server, [*shared, 5], GREEDY)  # fills the cache with the shared chunks
    results: list[dict] = [{}] * 4

    def run(i: int) -> None:
        results[i] = complete(server, prompts[i], samplings[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert [r["timings"]["cache_n"] for r in results] == [2 * B] * 4
    assert [r["tokens"] for r in results] == solo


def test_slots_and_metrics_show_the_cache(target_only_server) -> None:
    server, prompt = target_only_server, tokens(701, B + 9)

    def scrape() -> dict[str, float]:
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
        return {
            line.split()[0]: float(line.split()[1])
            for line in text.splitlines()
            if line.startswith("llamacpp:prompt_cache")
        }

    before = scrape()
    complete(server, prompt, GREEDY)
    body = {"prompt": prompt, "n_predict": 2000, "ignore_eos": True, "stream": True, "temperature": 0}
    with httpx.stream("POST", f"{server.url}/completion", json=body, timeout=60) as response:
        lines = response.iter_lines()  # kept: a dropped iterator closes the stream, which cancels the row
        next(lines)
        busy = [s for s in httpx.get(f"{server.url}/slots", timeout=10).json() if s["is_processing"]]
    server.wait_idle()
    after = scrape()
    mine = [s for s in busy if s["n_prompt_tokens"] == len(prompt)]
    n = restored(len(prompt), len(prompt))
    assert mine and mine[0]["n_prompt_tokens_cache"] == n and mine[0]["n_prompt_tokens_processed"] == len(prompt) - n
    assert after["llamacpp:prompt_cache_hits_total"] - before["llamacpp:prompt_cache_hits_total"] >= 1
    assert after["llamacpp:prompt_cache_misses_total"] - before["llamacpp:prompt_cache_misses_total"] >= 1
    assert 0 < after["llamacpp:prompt_cache_bytes"] <= 512 << 20
    assert "llamacpp:prompt_cache_evictions_total" in after


def test_a_prompt_shorter_than_a_chunk_hits_where_the_grain_allows(target_only_server) -> None:
    """llama.cpp's tests repeat short prompts: on the CPU (grain one token) a prompt of 40 tokens
    sent again restores all but its last, with the uncached output."""
    prompt = tokens(901, 40)
    reference = complete(target_only_server, prompt, GREEDY, cache_prompt=False)
    complete(target_only_server, prompt, GREEDY)
    hit = complete(target_only_server, prompt, GREEDY)
    assert hit["timings"]["cache_n"] == restored(40, 40) == (39 if GRAIN == 1 else 0)
    assert hit["tokens"] == reference["tokens"]
