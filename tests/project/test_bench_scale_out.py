"""The scale-out benchmark's table, without starting a server."""

from __future__ import annotations

from ops.bench.concurrency import Cell
from ops.bench.scale_out import ONE, TENSOR, TWO, parse_args, render


def test_table_compares_with_one_replica_and_says_why_an_arm_is_missing() -> None:
    args = parse_args(["--tokens", "16", "--write"])
    assert (args.clients, args.tokens, args.write, args.tensor_profile) == (8, 16, True, None)
    cells = {(ONE, 8): Cell(tokens=640, seconds=8.0, inter_token_s=[0.01]), (TWO, 8): Cell(tokens=640, seconds=4.0)}
    body = render(cells, {ONE: "default", TWO: "default"}, "no shipped profile has it", args)
    assert "| 1 replica, direct | `default` | 80.0 | 1.00x | 10.0 / 10.0 |" in body
    assert "| 2 replicas behind nginx | `default` | 160.0 | 2.00x |" in body
    assert body.endswith(f"- {TENSOR}: not available here; no shipped profile has it.") and "2 cores" in body
