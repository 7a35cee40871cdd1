"""The prompt cache: the KV rows of prompt prefixes, kept between requests and reused exactly.

Exactness. A restored prefix must be the bits a full prefill of the new prompt computes, so its
length is a multiple of the cache's grain (`exact_grain`):

- On the CPU, every product of up to the BLAS shim's row-stable limit gives each row the same
  bits whatever the other rows of the forward (app/runtime/sgemm_rows.c), and attention reads
  each query's visible keys the same way whatever follows them: a prompt's KV rows are the same
  however its prefill is cut into forwards (prefill chunks are within that limit), which is also
  what keeps a verify forward equal to single decode steps. The grain is one token: any shared
  prefix is restored.
- On a GPU, a prefill chunk runs MLX's own kernels, whose bits depend on the forward's width, so
  only the cut places are exact: prefill cuts every prompt at absolute multiples of PREFILL_CHUNK
  (runner.py), and a block drafter adds its context rows in the same cuts (app/drafters/block.py),
  so the rows of a prompt's first k whole chunks are the same bits in every prompt that starts
  with those tokens. The grain is PREFILL_CHUNK (128): a prompt of 128 tokens or fewer never hits.

Entries hold such prefixes only, and a row restores one into every model it runs (never its last
token: the first token's logits come from a forward) and prefills the rest from there (cut where
a full prefill cuts it), so its caches, and so its output, are what a full prefill gives. Only
prompt rows are kept: rows decided in decode steps or verify rounds came from forwards of other
widths.

A model's rows may depend on tokens past them (`lookahead`): an MTP head's row i pairs the
target's hidden state at i with token i + 1. An entry's key is its rows' tokens plus those.

Entries are immutable: they hold copies made when stored, and a row restores new arrays sliced
off them into KV caches of its own (MLX arrays are values), so a row's updates and rewinds never
reach an entry.

One entry is one prefix with the rows of every model its row ran (`role`: "target", "drafter"),
so the budget counts them together and they are evicted together. Lookup is the longest shared
prefix in whole grains over a linear scan of a few entries; one entry serves every shorter prefix
of itself, so an entry that another covers is not kept. Bytes and entries stay within the budget:
the least recently used entries go first. Touched by the engine thread only.

Tenants. Every lookup and store names the tenant of its request. Per tenant (the default,
`server.prompt_cache_scope = "tenant"`) entries are partitioned by it, so one tenant's lookup
never finds, covers or reports another's prefix: a hit shows in `cache_n` and in how fast the
prompt is in, a side channel on other clients' prompts (docs/reliability.md). Scope "global"
shares every entry. The budget is shared either way: one tenant's entries can evict another's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import Protocol

import mlx.core as mx

from app.execution.device import backend
from app.execution.pool import Layers
from app.execution.runner import PREFILL_CHUNK

SHARED = ""  # the one partition of a cache shared by all tenants


class PrefixRows(Protocol):
    """One model's KV caches in a row, as the cache reads and restores them (a `ModelRunner`, a
    block drafter's context)."""

    lookahead: int  # tokens past its rows that its rows depend on

    @property
    def length(self) -> int: ...  # rows it holds

    @property
    def can_restore(self) -> bool: ...

    def rows(self, n: int) -> Layers:
        """Its first n rows of every layer, copied out (evaluated)."""
        ...

    def restore(self, layers: Sequence[tuple[mx.array, mx.array]], n: int) -> None:
        """Start its empty caches from the first n rows of `layers`."""
        ...


@dataclass(frozen=True)
class Entry:
    tokens: tuple[int, ...]  # its rows' tokens (a whole number of grains), then `lookahead` more
    rows: int
    models: dict[str, Layers]  # role: that model's rows
    nbytes: int

    @property
    def lookahead(self) -> int:
        return len(self.tokens) - self.rows


@dataclass
class CacheCounters:
    """What /metrics reports of the cache."""

    hits: int = 0  # lookups that restored a prefix
    misses: int = 0  # lookups that found none
    evictions: int = 0  # entries dropped for the budget
    bytes: int = 0  # held by the entries now


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two token sequences."""
    n, end = 0, min(len(a), len(b))
    while n + PREFILL_CHUNK <= end and a[n : n + PREFILL_CHUNK] == b[n : n + PREFILL_CHUNK]:
        n += PREFILL_CHUNK
    while n < end and a[n] == b[n]:
        n += 1
    return n


def exact_grain() -> int:
    """The prefix lengths the cache may keep and restore are multiples of this (the module's
    docstring says why): 1 on the CPU, whose row-stable products cover every prefill chunk, else
    PREFILL_CHUNK."""
    device = backend()
    return 1 if not device.gpu and device.row_stable_rows >= PREFILL_CHUNK else PREFILL_CHUNK


def shared_rows(entry: Entry, tokens: Sequence[int], limit: int, grain: int) -> int:
    """Rows of `entry` that serve `tokens`, in whole grains, at most `limit`."""
    usable = min(common_prefix(entry.tokens, tokens) - entry.lookahead, entry.rows, limit)
    return max(0, usable) // grain * grain


EntryKey = tuple[str, int]  # (partition, serial number)


@dataclass
class PromptCache:
    budget_bytes: int
    max_entries: int
    per_tenant: bool = True  # False: every tenant's lookups find every tenant's entries
    grain: int = field(default_factory=exact_grain)  # kept and restored prefixes are multiples of this
    counters: CacheCounters = field(default_factory=CacheCounters)
    _entries: OrderedDict[EntryKey, Entry] = field(default_factory=OrderedDict)  # least recently used first
    _ids: count = field(default_factory=count)

    def __len__(self) -> int:
        return len(self._entries)

    def partition(self, tenant: str) -> str:
        """The entries a request of `tenant` may find and add to: the one place the scope is applied."""
        return tenant if self.per_tenant else SHARED

    def _visible(self, tenant: str) -> list[tuple[EntryKey, Entry]]:
        partition = self.partition(tenant)
        return [(key, entry) for key, entry in self._entries.items() if key[0] == partition]

    def restore(self, models: Mapping[str, PrefixRows], tokens: Sequence[int], *, tenant: str) -> int:
        """Restore into every (empty) model the longest prefix of `tokens` cached for `tenant`
        that leaves at least one token to prefill; the tokens restored (0: none)."""
        tokens = tuple(tokens)
        best, best_n = None, 0
        for key, entry in self._visible(tenant):
            if models.keys() <= entry.models.keys() and (n := self._shared(entry, tokens)) > best_n:
                best, best_n = key, n
        if best is None:
            return 0
        self._entries.move_to_end(best)
        for role, model in models.items():
            model.restore(self._entries[best].models[role], best_n)
        return best_n

    def _shared(self, entry: Entry, tokens: tuple[int, ...]) -> int:
        return shared_rows(entry, tokens, len(tokens) - 1, self.grain)

    def store(self, models: Mapping[str, PrefixRows], tokens: Sequence[int], *, tenant: str) -> None:
        """Keep, for `tenant`, the whole grains of a prompt the models have just prefilled."""
        lookahead = max(m.lookahead for m in models.values())
        n = min(len(tokens) - lookahead, *(m.length for m in models.values())) // self.grain * self.grain
        if n <= 0 or not all(m.can_restore for m in models.values()):
            return
        key = tuple(tokens[: n + lookahead])
        for existing, entry in self._visible(tenant):
            if models.keys() <= entry.models.keys() and entry.rows >= n and entry.tokens[: len(key)] == key:
                self._entries.move_to_end(existing)  # it already serves this prefix
                return
        layers = {role: m.rows(n) for role, m in models.items()}
        nbytes = sum(k.nbytes + v.nbytes for rows in layers.values() for k, v in rows)
        if nbytes > self.budget_bytes:
            return
        for existing, entry in self._visible(tenant):  # entries this one covers serve nothing it does not
            if entry.models.keys() <= models.keys() and entry.rows <= n and key[: len(entry.tokens)] == entry.tokens:
                self._drop(existing)
        while self._entries and (
            self.counters.bytes + nbytes > self.budget_bytes or len(self._entries) >= self.max_entries
        ):
            self._drop(next(iter(self._entries)))
            self.counters.evictions += 1
        self._entries[self.partition(tenant), next(self._ids)] = Entry(key, n, layers, nbytes)
        self.counters.bytes += nbytes

    def _drop(self, key: EntryKey) -> None:
        self.counters.bytes -= self._entries.pop(key).nbytes


@dataclass
class RowCaching:
    """One row's use of the cache: one prefix restored into all its models when it is built, its
    prompt's grains stored once the prompt is in (every model's cache then holds the prompt)."""

    cache: PromptCache
    prompt: tuple[int, ...]
    models: dict[str, PrefixRows]  # role: that model's empty caches for this row
    tenant: str  # whose request: the cache's partition follows from it
    reused: int = 0  # prompt tokens restored (`cache_n`)

    def restore(self) -> None:
        self.reused = self.cache.restore(self.models, self.prompt, tenant=self.tenant)
        if self.reused:
            self.cache.counters.hits += 1
        else:
            self.cache.counters.misses += 1

    def store(self) -> None:
        self.cache.store(self.models, self.prompt, tenant=self.tenant)
