"""A /health canary polled from a thread: how long the slowest answer took while a test or an attack ran."""

from __future__ import annotations

import threading
import time

import httpx


class HealthCanary:
    """Polls /health from a thread; `slowest` is its slowest answer (an error counts as forever)."""

    def __init__(self, url: str) -> None:
        self.url, self.slowest, self._done = url, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> HealthCanary:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    def _poll(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            while not self._done.is_set():
                started = time.perf_counter()
                try:
                    ok = http.get("/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.slowest = max(self.slowest, time.perf_counter() - started if ok else float("inf"))
                time.sleep(0.05)
