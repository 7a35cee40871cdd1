"""The share of the engine's time that heavy work may take while rows decode.

Heavy work is what one request can make as long as it likes between or within ticks: an
embedding's chunks (run between ticks) and a grammar row whose masks are costly (run within
them). Left alone, 24 long embedding inputs held every other client's completion for minutes,
and the masks of 16 ambiguous-grammar rows made a 16-token canary 40 to 90 times slower. Each
piece of heavy work that takes s seconds pushes the next one back by s * (1 / share - 1), so
while rows decode, heavy work gets at most `share` of the engine (`server.heavy_work_share`),
and the rows between get the rest. With no row decoding it runs unthrottled.
"""

from __future__ import annotations

import time


class HeavyShare:
    def __init__(self, share: float) -> None:
        self._pause = 1.0 / share - 1.0  # seconds of other work owed per second of heavy work
        self._free_at = 0.0

    @property
    def free(self) -> bool:
        """Whether heavy work may run now."""
        return time.perf_counter() >= self._free_at

    def spent(self, seconds: float) -> None:
        """Heavy work just took `seconds`: the next waits for the rows' share."""
        self._free_at = max(self._free_at, time.perf_counter()) + seconds * self._pause
