"""The prompt cache: the KV rows of prompt prefixes, kept between requests and reused exactly.

Exactness. Prefill cuts every prompt at absolute multiples of PREFILL_CHUNK (runner.py), so the
KV rows of a prompt's first k whole chunks are the same bits in every prompt that starts with
those tokens: each chunk was one forward of the same rows over the same cache. Entries hold such
prefixes only, and a row restores k whole chunks (never its last token: the first token's logits
come from a forward) and prefills the rest from there, so its cache, and so its output, is what a
full prefill gives. Only prompt rows are kept: rows decided in decode steps or verify rounds came
from forwards of other widths.

Entries are immutable: they hold copies made when stored, and a row restores new arrays sliced
off them into KVCache objects of its own (MLX arrays are values), so a row's updates and rewinds
never reach an entry.

Each model keeps its own entries (`role`: "target", "drafter"). Lookup is the longest shared
prefix in whole chunks over a linear scan of a few entries; one entry serves every shorter prefix
of itself, so an entry that another covers is not kept. Bytes and entries stay within the budget:
the least recently used entries go first. Touched by the engine thread only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import count

import mlx.core as mx

from app.loading.runner import PREFILL_CHUNK, ModelRunner


@dataclass(frozen=True)
class Entry:
    role: str
    tokens: tuple[int, ...]  # a whole number of chunks
    layers: list[tuple[mx.array, mx.array]]  # per layer: keys and values `[1, heads, len(tokens), D]`
    nbytes: int


@dataclass
class CacheCounters:
    """What /metrics reports of the cache."""

    hits: int = 0  # target lookups that restored a prefix
    misses: int = 0  # target lookups that found none
    evictions: int = 0  # entries dropped for the budget
    bytes: int = 0  # held by the entries now


def shared_chunks(kept: Sequence[int], tokens: Sequence[int], limit: int) -> int:
    """Tokens of the longest common prefix of `kept` and `tokens` in whole chunks, at most `limit`."""
    n = 0
    while n + PREFILL_CHUNK <= min(len(kept), len(tokens), limit):
        if kept[n : n + PREFILL_CHUNK] != tokens[n : n + PREFILL_CHUNK]:
            break
        n += PREFILL_CHUNK
    return n


@dataclass
class PromptCache:
    budget_bytes: int
    max_entries: int
    counters: CacheCounters = field(default_factory=CacheCounters)
    _entries: OrderedDict[int, Entry] = field(default_factory=OrderedDict)  # least recently used first
    _ids: count = field(default_factory=count)

    def __len__(self) -> int:
        return len(self._entries)

    def restore(self, role: str, runner: ModelRunner, tokens: Sequence[int]) -> int:
        """Restore into an empty runner the longest cached prefix of `tokens` that leaves at least
        one token to prefill; the tokens restored (0: none)."""
        tokens = tuple(tokens)
        best, best_n = None, 0
        for key, entry in self._entries.items():
            if entry.role == role and (n := shared_chunks(entry.tokens, tokens, len(tokens) - 1)) > best_n:
                best, best_n = key, n
        if best is None:
            return 0
        self._entries.move_to_end(best)
        runner.restore(self._entries[best].layers, best_n)
        return best_n

    def store(self, role: str, runner: ModelRunner, tokens: Sequence[int]) -> None:
        """Keep the whole chunks of a prompt the runner has just prefilled."""
        n = min(len(tokens), runner.length) // PREFILL_CHUNK * PREFILL_CHUNK
        if n == 0 or not runner.can_restore:
            return
        tokens = tuple(tokens[:n])
        same_role = [(key, e) for key, e in self._entries.items() if e.role == role]
        for key, entry in same_role:
            if shared_chunks(entry.tokens, tokens, n) == n:  # it already serves this prefix
                self._entries.move_to_end(key)
                return
        layers = [(mx.contiguous(c.keys[..., :n, :]), mx.contiguous(c.values[..., :n, :])) for c in runner.cache]
        mx.eval(layers)
        nbytes = sum(k.nbytes + v.nbytes for k, v in layers)
        if nbytes > self.budget_bytes:
            return
        for key, entry in same_role:  # entries this one covers serve nothing it does not
            if shared_chunks(entry.tokens, tokens, len(entry.tokens)) == len(entry.tokens):
                self._drop(key)
        while self._entries and (
            self.counters.bytes + nbytes > self.budget_bytes or len(self._entries) >= self.max_entries
        ):
            self._drop(next(iter(self._entries)))
            self.counters.evictions += 1
        self._entries[next(self._ids)] = Entry(role, tokens, layers, nbytes)
        self.counters.bytes += nbytes

    def _drop(self, key: int) -> None:
        self.counters.bytes -= self._entries.pop(key).nbytes


@dataclass
class RowCaching:
    """One row's use of the cache: its models' prefixes restored when it is built, its prompt's
    chunks stored once the prompt is in (every model's cache then holds the prompt and nothing past it)."""

    cache: PromptCache
    prompt: tuple[int, ...]
    runners: dict[str, ModelRunner]  # role: an empty runner of that model for this row
    reused: int = 0  # prompt tokens the target restored (`cache_n`)

    def restore(self) -> None:
        restored = {role: self.cache.restore(role, runner, self.prompt) for role, runner in self.runners.items()}
        self.reused = restored["target"]
        if self.reused:
            self.cache.counters.hits += 1
        else:
            self.cache.counters.misses += 1

    def store(self) -> None:
        for role, runner in self.runners.items():
            self.cache.store(role, runner, self.prompt)
