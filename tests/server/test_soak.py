"""A 20-second soak (ops/bench/soak.py; the 3-minute figures are in docs/reliability.md): 16
clients mixing streams, disconnects, abandoned and cancelled requests and bad requests. Zero
hangs, zero 5xx, T = 0 outputs equal to their solo runs, RSS growth under 5% after warm-up, and
/metrics equal to what the finished requests did."""

from __future__ import annotations

import pytest

from ops.bench.soak import run_soak


@pytest.mark.slow
def test_soak_twenty_seconds(target_only_server) -> None:
    """On the shared target-only server: the soak measures its RSS and /metrics from warm-up on.
    A first soak of the same length fills the pool and caches 16 clients need: the shared server
    may have just started (at most three run per worker), and its first half-minute's growth is
    not a leak. Measured on a fresh server (2026-12-06): after 8 s of load the next 20 s grew
    RSS 4.0 % (5.0 % and 5.6 % in other runs, over the limit), the two 20 s after that 0.5 % and
    0.4 %: the growth settles by about 30 s of load, so the warm-up is 20 s."""
    server = target_only_server
    warming = run_soak(server.url, server.process.pid, seconds=20, clients=16)
    assert not [f for f in warming.failures() if not f.startswith("RSS")], warming.table()
    report = run_soak(server.url, server.process.pid, seconds=20, clients=16)
    print(report.table())
    failures = report.failures()
    assert failures == [], "\n".join(failures[:40])
    assert sum(report.tally.sent.values()) > 0
