"""The prompt cache on the embedded target and its block drafters: restored prefixes give a full
prefill's bits, entries are never written by the rows that restore them, and the budget holds."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from app.acceptance import Rule
from app.decoding.adaptive import ControlledWidth, WidthController
from app.decoding.generation import Generation
from app.decoding.loop import Drafting, SpeculativeLoop
from app.decoding.speculation import Speculation
from app.decoding.width import WidthPolicy
from app.drafters.block import DFlashDrafter, MtpDrafter, block_proposer, load_block_drafter
from app.execution.model import LoadedModel
from app.execution.prompt_cache import Entry, PrefixRows, PromptCache, RowCaching, exact_grain, shared_rows
from app.execution.runner import PREFILL_CHUNK, ModelRunner
from app.loading.paths import REPO_ROOT
from app.sampling import RowRng, SamplerPipeline, SamplingParams
from app.sampling.state import RowState

B = PREFILL_CHUNK
TENANT = "tests"
MODELS = REPO_ROOT / "models"


def prompt(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 37) % 4000 + 10 for i in range(n)]


def prefilled(model: LoadedModel, tokens: list[int], cache: PromptCache | None = None) -> tuple[ModelRunner, mx.array]:
    """A runner holding `tokens` (restored from `cache` where it can), and the last logits."""
    runner = ModelRunner(model.model)
    if cache is not None:
        cache.restore({"target": runner}, tokens, tenant=TENANT)
    logits = runner.prefill(tokens)
    mx.eval(logits)
    return runner, logits


def rows(runner: PrefixRows) -> list[np.ndarray]:
    """Every layer's keys and values as numpy, up to the model's length (the bits, compared exactly)."""
    return [np.array(a.astype(mx.float32)) for layer in runner.rows(runner.length) for a in layer]


def test_shared_rows_count_whole_grains_and_keep_one_token_to_prefill() -> None:
    a = prompt(1, 3 * B)
    entry = Entry(tuple(a), 3 * B, {}, 0)
    assert shared_rows(entry, a, len(a) - 1, B) == 2 * B  # the last token is always prefilled
    assert shared_rows(entry, [*a[: 2 * B + 5], 1, 2], 10**6, B) == 2 * B
    assert shared_rows(entry, [*a[:B], a[B] + 1, *a[B + 1 :]], 10**6, B) == B
    assert shared_rows(entry, prompt(2, 3 * B), 10**6, B) == 0
    ahead = Entry(tuple(a[: 2 * B + 1]), 2 * B, {}, 0)  # rows that depend on one token past them (MTP)
    assert shared_rows(ahead, a, 10**6, B) == 2 * B
    assert shared_rows(ahead, [*a[: 2 * B], a[2 * B] + 1], 10**6, B) == B  # row 2B - 1 read the token that differs
    # a grain of one token: every shared token but the one a lookahead row read past
    assert shared_rows(entry, a, len(a) - 1, 1) == 3 * B - 1
    assert shared_rows(entry, [*a[: 2 * B + 5], 1, 2], 10**6, 1) == 2 * B + 5
    assert shared_rows(ahead, [*a[: 2 * B], a[2 * B] + 1], 10**6, 1) == 2 * B - 1


def test_the_cpu_restores_any_prefix_length() -> None:
    """The CPU's row-stable forwards give a prompt's rows the same bits however prefill cuts them."""
    assert exact_grain() == 1


@pytest.mark.parametrize(
    ("grain", "shared"), [(B, 2 * B + 11), (1, 2 * B + 11), (1, 60)], ids=["chunks", "tokens", "short"]
)
def test_a_restored_prefix_gives_the_full_prefills_bits(embedded_target: LoadedModel, grain: int, shared: int) -> None:
    """The second prompt shares `shared` tokens with the first: restored (whole grains of them)
    and then prefilled, its cache and last logits are bit-identical to a prefill from nothing.
    A grain of one token restores all of them, so a prompt shorter than a chunk hits too."""
    first, second = prompt(3, shared + 29), prompt(3, shared + 29)[:shared] + prompt(4, 150)
    cache = PromptCache(budget_bytes=1 << 30, max_entries=8, grain=grain)
    runner, _ = prefilled(embedded_target, first)
    cache.store({"target": runner}, first, tenant=TENANT)
    restored, restored_logits = prefilled(embedded_target, second, cache)
    full, full_logits = prefilled(embedded_target, second)
    assert cache.counters.bytes > 0 and len(cache) == 1
    assert np.array_equal(np.array(restored_logits), np.array(full_logits))
    for a, b in zip(rows(restored), rows(full), strict=True):
        assert np.array_equal(a, b)


def test_rows_never_write_into_the_entry_they_restored(embedded_target: LoadedModel) -> None:
    """A row that restores, decodes and rewinds below the restored length leaves the entry as it was."""
    tokens = prompt(5, 2 * B + 3)
    cache = PromptCache(budget_bytes=1 << 30, max_entries=8, grain=B)
    runner, _ = prefilled(embedded_target, tokens)
    cache.store({"target": runner}, tokens, tenant=TENANT)
    (entry,) = cache._entries.values()
    before = [np.array(a.astype(mx.float32)) for kv in entry.models["target"] for a in kv]
    row = ModelRunner(embedded_target.model)
    assert cache.restore({"target": row}, tokens, tenant=TENANT) == 2 * B
    mx.eval(row.prefill(tokens))
    row.rewind(row.length - B - 7)  # into the restored rows, as a speculative rewind could
    mx.eval(row.forward([1, 2, 3, 4, 5, 6, 7, 8]))
    after = [np.array(a.astype(mx.float32)) for kv in entry.models["target"] for a in kv]
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))


def test_tenants_find_only_their_own_prefixes_unless_the_cache_is_global(embedded_target: LoadedModel) -> None:
    """Per tenant, B finds nothing of A's, and B's longer prompt neither reuses nor drops the entry
    of A's that it covers; shared, B finds A's."""
    tokens, longer = prompt(7, 2 * B + 3), prompt(7, 3 * B + 3)
    runner, _ = prefilled(embedded_target, tokens)
    apart = PromptCache(budget_bytes=1 << 30, max_entries=8, grain=B)
    apart.store({"target": runner}, tokens, tenant="a")
    assert apart.restore({"target": ModelRunner(embedded_target.model)}, tokens, tenant="b") == 0
    apart.store({"target": prefilled(embedded_target, longer)[0]}, longer, tenant="b")
    assert len(apart) == 2
    assert apart.restore({"target": ModelRunner(embedded_target.model)}, tokens, tenant="a") == 2 * B
    shared = PromptCache(budget_bytes=1 << 30, max_entries=8, per_tenant=False, grain=B)
    shared.store({"target": runner}, tokens, tenant="a")
    assert shared.restore({"target": ModelRunner(embedded_target.model)}, tokens, tenant="b") == 2 * B


def test_eviction_keeps_bytes_and_entries_within_the_budget(embedded_target: LoadedModel) -> None:
    """Each one-chunk entry takes `size` bytes; a budget of two and a half entries keeps two,
    dropping the least recently used; an entry a longer one covers is replaced, not kept twice."""
    probe = PromptCache(budget_bytes=1 << 30, max_entries=8, grain=B)
    runners = {seed: prefilled(embedded_target, prompt(seed, B + 1))[0] for seed in (10, 11, 12)}
    probe.store({"target": runners[10]}, prompt(10, B + 1), tenant=TENANT)
    size = probe.counters.bytes
    cache = PromptCache(budget_bytes=size * 5 // 2, max_entries=8, grain=B)
    for seed in (10, 11):
        cache.store({"target": runners[seed]}, prompt(seed, B + 1), tenant=TENANT)
        assert cache.counters.bytes <= cache.budget_bytes
    fresh = {"target": ModelRunner(embedded_target.model)}
    assert cache.restore(fresh, prompt(10, B + 5), tenant=TENANT) == B  # 10 is now recent
    cache.store({"target": runners[12]}, prompt(12, B + 1), tenant=TENANT)
    assert (len(cache), cache.counters.evictions, cache.counters.bytes) == (2, 1, 2 * size)
    assert cache.restore({"target": ModelRunner(embedded_target.model)}, prompt(11, B + 5), tenant=TENANT) == 0
    assert cache.restore({"target": ModelRunner(embedded_target.model)}, prompt(10, B + 5), tenant=TENANT) == B
    longer = prompt(12, 2 * B + 1)
    cache.store({"target": prefilled(embedded_target, longer)[0]}, longer, tenant=TENANT)  # covers entry 12
    assert cache.counters.bytes <= cache.budget_bytes
    assert [len(e.tokens) for e in cache._entries.values()] == [2 * B]  # 10 evicted for room, 12 replaced
    small = PromptCache(budget_bytes=size - 1, max_entries=8, grain=B)
    small.store({"target": runners[10]}, prompt(10, B + 1), tenant=TENANT)
    assert (len(small), small.counters.bytes) == (0, 0)  # larger than the whole budget: not kept
    one = PromptCache(budget_bytes=1 << 30, max_entries=1, grain=B)
    for seed in (10, 11):
        one.store({"target": runners[seed]}, prompt(seed, B + 1), tenant=TENANT)
    assert (len(one), one.counters.evictions) == (1, 1)


@pytest.mark.parametrize("grain", [B, 1], ids=["chunks", "tokens"])
@pytest.mark.parametrize("drafter", ["mtp", "dflash"])
def test_block_drafters_resume_from_a_restored_prefix_exactly(
    embedded_target: LoadedModel, drafter: str, grain: int
) -> None:
    """The drafter's context rows (and MTP's last output) after a restored prefix are the bits a
    full prefill gives, and so are the tokens decoded after them. The second prompt shares the
    first's two chunks and its next token too: MTP's row 2B - 1 reads that token; in whole tokens
    DFlash restores that token's row too, and MTP all but the row that read past the prefix."""
    bound = load_block_drafter(MODELS / drafter, embedded_target)
    first, second = prompt(20, 2 * B + 40), prompt(20, 2 * B + 1) + prompt(21, 30)
    assert first[2 * B + 1] != second[2 * B + 1]
    cache = PromptCache(budget_bytes=1 << 30, max_entries=8, grain=grain)

    def decoded(tokens: list[int], cache: PromptCache | None) -> tuple[Generation, DFlashDrafter | MtpDrafter]:
        width = bound.declared_width
        drafting = Drafting(
            block_proposer(bound), WidthPolicy(ControlledWidth(WidthController(width, width)), width - 1)
        )
        loop = SpeculativeLoop(ModelRunner(embedded_target.model), drafting,
                               Speculation(rule=Rule.ARGMAX_AGAINST_ARGMAX, draft_kind=bound.draft_kind))  # fmt: skip
        caching = None
        if cache is not None:
            models = {"target": loop.target, "drafter": loop.proposer.context}
            caching = RowCaching(cache, tuple(tokens), models, TENANT)
            caching.restore()
        state = RowState(tokens=list(tokens), sampler=SamplerPipeline(SamplingParams(temperature=0.0), 4096),
                         rng=RowRng(0))  # fmt: skip
        generation = Generation(loop=loop, state=state, tokenizer=embedded_target.tokenizer, max_tokens=6,
                                context_limit=4096, ignore_eos=True, caching=caching)  # fmt: skip
        generation.prefill()
        return generation, loop.proposer

    decoded(first, cache)
    restored, restored_drafter = decoded(second, cache)
    full, full_drafter = decoded(second, None)
    want = 2 * B if grain == B else 2 * B + 1 - (drafter == "mtp")
    # whole chunks: the second prompt's are the first's (one entry serves both); tokens: its own entry
    assert restored.cache_n == want and len(cache) == (1 if grain == B else 2)
    assert cache.counters.bytes == sum(
        a.nbytes for entry in cache._entries.values() for rows in entry.models.values() for kv in rows for a in kv
    )
    context = [restored_drafter.context, full_drafter.context]
    assert context[0].length == context[1].length == len(second)
    for a, b in zip(rows(context[0]), rows(context[1]), strict=True):
        assert np.array_equal(a, b)
    if drafter == "mtp":
        assert np.array_equal(np.array(restored_drafter.last), np.array(full_drafter.last))
    while not full.finished:
        full.step(), restored.step()
    assert restored.emitted == full.emitted
