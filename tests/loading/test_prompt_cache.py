"""The prompt cache on the embedded target: restored prefixes give a full prefill's bits, entries
are never written by the rows that restore them, and the budget holds."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from app.loading import LoadedModel
from app.loading.prompt_cache import PromptCache, shared_chunks
from app.loading.runner import PREFILL_CHUNK, ModelRunner

B = PREFILL_CHUNK


def prompt(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 37) % 4000 + 10 for i in range(n)]


def prefilled(model: LoadedModel, tokens: list[int], cache: PromptCache | None = None) -> tuple[ModelRunner, mx.array]:
    """A runner holding `tokens` (restored from `cache` where it can), and the last logits."""
    runner = ModelRunner(model.model)
    if cache is not None:
        cache.restore("target", runner, tokens)
    logits = runner.prefill(tokens)
    mx.eval(logits)
    return runner, logits


def rows(runner: ModelRunner) -> list[np.ndarray]:
    """Every layer's keys and values as numpy, up to the runner's length (the bits, compared exactly)."""
    n = runner.length
    return [np.array(a[..., :n, :].astype(mx.float32)) for c in runner.cache for a in (c.keys, c.values)]


def test_shared_chunks_counts_whole_chunks_and_keeps_one_token_to_prefill() -> None:
    a = prompt(1, 3 * B)
    assert shared_chunks(a, a, len(a) - 1) == 2 * B  # the last token is always prefilled
    assert shared_chunks(a, [*a[: 2 * B + 5], 1, 2], 10**6) == 2 * B
    assert shared_chunks(a, [*a[:B], a[B] + 1, *a[B + 1 :]], 10**6) == B
    assert shared_chunks(a, prompt(2, 3 * B), 10**6) == 0


def test_a_restored_prefix_gives_the_full_prefills_bits(embedded_target: LoadedModel) -> None:
    """The second prompt shares two chunks and a bit with the first: restored and then prefilled,
    its cache and last logits are bit-identical to a prefill from nothing."""
    first, second = prompt(3, 2 * B + 40), prompt(3, 2 * B + 40)[: 2 * B + 11] + prompt(4, 150)
    cache = PromptCache(budget_bytes=1 << 30, max_entries=8)
    runner, _ = prefilled(embedded_target, first)
    cache.store("target", runner, first)
    restored, restored_logits = prefilled(embedded_target, second, cache)
    full, full_logits = prefilled(embedded_target, second)
    assert cache.counters.bytes > 0 and len(cache) == 1
    assert np.array_equal(np.array(restored_logits), np.array(full_logits))
    for a, b in zip(rows(restored), rows(full), strict=True):
        assert np.array_equal(a, b)
    assert [c.keys.shape[2] for c in restored.cache] == [c.keys.shape[2] for c in full.cache]


def test_rows_never_write_into_the_entry_they_restored(embedded_target: LoadedModel) -> None:
    """A row that restores, decodes and rewinds below the restored length leaves the entry as it was."""
    tokens = prompt(5, 2 * B + 3)
    cache = PromptCache(budget_bytes=1 << 30, max_entries=8)
    runner, _ = prefilled(embedded_target, tokens)
    cache.store("target", runner, tokens)
    (entry,) = cache._entries.values()
    before = [np.array(a.astype(mx.float32)) for kv in entry.layers for a in kv]
    row = ModelRunner(embedded_target.model)
    assert cache.restore("target", row, tokens) == 2 * B
    mx.eval(row.prefill(tokens))
    row.rewind(row.length - B - 7)  # into the restored rows, as a speculative rewind could
    mx.eval(row.forward([1, 2, 3, 4, 5, 6, 7, 8]))
    after = [np.array(a.astype(mx.float32)) for kv in entry.layers for a in kv]
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))


def test_eviction_keeps_bytes_and_entries_within_the_budget(embedded_target: LoadedModel) -> None:
    """Each one-chunk entry takes `size` bytes; a budget of two and a half entries keeps two,
    dropping the least recently used; an entry a longer one covers is replaced, not kept twice."""
    probe = PromptCache(budget_bytes=1 << 30, max_entries=8)
    runners = {seed: prefilled(embedded_target, prompt(seed, B + 1))[0] for seed in (10, 11, 12)}
    probe.store("target", runners[10], prompt(10, B + 1))
    size = probe.counters.bytes
    cache = PromptCache(budget_bytes=size * 5 // 2, max_entries=8)
    for seed in (10, 11):
        cache.store("target", runners[seed], prompt(seed, B + 1))
        assert cache.counters.bytes <= cache.budget_bytes
    assert cache.restore("target", ModelRunner(embedded_target.model), prompt(10, B + 5)) == B  # 10 is now recent
    cache.store("target", runners[12], prompt(12, B + 1))
    assert (len(cache), cache.counters.evictions, cache.counters.bytes) == (2, 1, 2 * size)
    assert cache.restore("target", ModelRunner(embedded_target.model), prompt(11, B + 5)) == 0  # 11 went
    assert cache.restore("target", ModelRunner(embedded_target.model), prompt(10, B + 5)) == B
    longer = prompt(12, 2 * B + 1)
    cache.store("target", prefilled(embedded_target, longer)[0], longer)  # covers entry 12
    assert cache.counters.bytes <= cache.budget_bytes
    assert [len(e.tokens) for e in cache._entries.values()] == [2 * B]  # 10 evicted for room, 12 replaced
    small = PromptCache(budget_bytes=size - 1, max_entries=8)
    small.store("target", runners[10], prompt(10, B + 1))
    assert (len(small), small.counters.bytes) == (0, 0)  # larger than the whole budget: not kept
    one = PromptCache(budget_bytes=1 << 30, max_entries=1)
    for seed in (10, 11):
        one.store("target", runners[seed], prompt(seed, B + 1))
    assert (len(one), one.counters.evictions) == (1, 1)
