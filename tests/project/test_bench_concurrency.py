"""The concurrency benchmark's options, stream accounting and table, without starting a server."""

from __future__ import annotations

import json

import pytest

from ops.bench.concurrency import (
    MLX_LM,
    Cell,
    Stream,
    arm_settings,
    fast_arms,
    fixed_arms,
    parse_args,
    record,
    render,
    request_body,
    waves_of,
)
from ops.bench.prompts import HELD_OUT_CODE


def test_help_and_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["--help"])
    assert exited.value.code == 0 and "--clients" in capsys.readouterr().out
    args = parse_args(["--clients", "8,1,2", "--tokens", "16", "--profiles", "default", "--no-mlx-lm", "--write"])
    assert (args.clients, args.tokens, args.profiles, args.no_mlx_lm, args.write) == (
        [1, 2, 8],
        16,
        ["default"],
        True,
        True,
    )


def test_every_client_count_covers_every_prompt() -> None:
    for clients in (1, 3, 8, 16):
        waves = waves_of(clients, offset=5)
        assert all(len(w) == clients for w in waves)
        assert {p for w in waves for p in w} == set(HELD_OUT_CODE)


def frame(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def test_a_speculative_frame_spreads_its_gap_over_its_tokens() -> None:
    """Frames of 1 then 3 tokens, the second split across two reads: one first-token time and
    three gaps of a third of the time between the frames each."""
    first = frame({"choices": [{"text": "a"}], "timings": {"predicted_n": 1}})
    second = frame({"choices": [{"text": "bcd"}], "timings": {"predicted_n": 4}})
    final = frame({"choices": [{"text": ""}], "usage": {"completion_tokens": 4}, "timings": {"predicted_n": 4}})
    stream = Stream(sent=10.0)
    for at, data in ((10.5, first + second[:5]), (10.8, second[5:] + final + b"data: [DONE]\n\n")):
        stream.received += data
        stream.arrivals.append((at, len(stream.received)))
    cell = Cell()
    record(cell, stream, 4)
    assert cell.tokens == 4 and cell.first_token_s == [0.5]
    assert cell.inter_token_s == pytest.approx([0.1] * 3)
    with pytest.raises(RuntimeError, match="expected 5 tokens"):
        record(Cell(), stream, 5)


def test_table_ratios_and_goals() -> None:
    cells = {
        ("default", 1): Cell(tokens=100, seconds=1.0, first_token_s=[0.05], inter_token_s=[0.01] * 10),
        ("default", 8): Cell(tokens=800, seconds=2.0, first_token_s=[0.1], inter_token_s=[0.015] * 10),
        (MLX_LM, 1): Cell(tokens=50, seconds=1.0, first_token_s=[0.06], inter_token_s=[0.02] * 10),
        (MLX_LM, 8): Cell(tokens=400, seconds=2.0, first_token_s=[0.2], inter_token_s=[0.04] * 10),
    }
    text = render(cells, n=64, repeats=1, note="a busy machine")
    assert "| `default` profile | 8 | 400.0 | 4.00x | 2.00x | 15.0 / 15.0 | 100 / 100 |" in text
    assert "| mlx_lm.server | 1 | 50.0 | 1.00x | 1.00x | 20.0 / 20.0 | 60 / 60 |" in text
    assert "4.00x aggregate (goal ≥ 3x); p95 inter-token latency 1.50x" in text
    assert "at 8 clients: 2.00x (goal ≥ 1.5x)" in text and "a busy machine" in text


def test_fixed_width_arms_and_the_goodput_goal() -> None:
    """Every profile with a drafter gets a fixed-width arm; each profile is compared with the
    better of target-only and its fixed-width arm at every client count."""
    assert fixed_arms(["target-only", "default", "mtp"]) == ["default@fixed", "mtp@fixed"]
    assert parse_args(["--no-fixed"]).no_fixed and not parse_args([]).no_fixed
    cells = {
        ("target-only", 1): Cell(tokens=100, seconds=1.0),
        ("target-only", 8): Cell(tokens=400, seconds=1.0),
        ("mtp", 1): Cell(tokens=200, seconds=1.0),
        ("mtp", 8): Cell(tokens=380, seconds=1.0),
        ("mtp@fixed", 1): Cell(tokens=190, seconds=1.0),
        ("mtp@fixed", 8): Cell(tokens=300, seconds=1.0),
    }
    text = render(cells, n=64, repeats=1)
    assert "`mtp` against the better of target-only and `mtp@fixed` by clients: 1: 1.05x, 8: 0.95x" in text
    assert "(goal ≥ 0.95x at every count: met)" in text
    cells["mtp", 8] = Cell(tokens=379, seconds=1.0)
    assert "8: 0.95x (goal ≥ 0.95x at every count: missed)" in render(cells, n=64, repeats=1)


def test_variants_sampled_requests_and_the_coupling_goal() -> None:
    """Issue 39's arms: a profile's variants are settings in its server's environment; sampled
    requests are seeded by their prompt and ask for timings.speculative, whose counters the cell
    sums; coupled sampler-match is held against its stochastic variant at 8 clients."""
    assert arm_settings("mtp+lossless+uncoupled") == (
        "mtp",
        {"MLXCEL_DRAFTER__BLOCK_RULE": "lossless", "MLXCEL_SPECULATIVE__COUPLED": "false"},
    )
    assert arm_settings("default+stochastic@fixed")[1]["MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT"] == "1"
    body = json.loads(request_body(HELD_OUT_CODE[3], 16, "default", temperature=0.7))
    assert (body["temperature"], body["seed"], body["speculative_diagnostics"]) == (0.7, 3, True)
    assert "seed" not in json.loads(request_body(HELD_OUT_CODE[3], 16, "default"))
    speculative = {"positions_tested": 10, "accepted": 8}
    final = frame({"choices": [{"text": "ab"}], "usage": {"completion_tokens": 2},
                   "timings": {"predicted_n": 2, "speculative": speculative}})  # fmt: skip
    stream = Stream(sent=0.0, received=bytearray(final), arrivals=[(0.5, len(final))])
    cell = Cell()
    record(cell, stream, 2)
    assert (cell.tested, cell.accepted, cell.per_position_acceptance) == (10, 8, 0.8)
    cells = {
        ("default", 8): Cell(tokens=950, seconds=1.0, tested=100, accepted=85),
        ("default+stochastic", 8): Cell(tokens=1000, seconds=1.0, tested=100, accepted=90),
    }
    text = render(cells, n=64, repeats=1, temperature=0.7)
    assert "T=0.7 (seeded by prompt)" in text and "| 0.850 |" in text
    assert "0.850 against 0.900, 0.94x (goal ≥ 0.9x: met); aggregate tokens/s 0.95x (goal ≥ 0.95x: met)" in text


def test_fast_path_arms_price_exactness_and_the_target_only_goals() -> None:
    """Every profile gets a fast-path arm (execution.exact = false); the table says what exactness
    costs by clients, and target-only's goals against its single stream and mlx_lm.server."""
    assert fast_arms(["target-only", "mtp"]) == ["target-only@fast", "mtp@fast"]
    assert parse_args(["--no-fast"]).no_fast and not parse_args([]).no_fast
    cells = {
        ("target-only", 1): Cell(tokens=300, seconds=1.0, first_token_s=[0.02]),
        ("target-only", 16): Cell(tokens=2400, seconds=1.0, first_token_s=[0.05]),
        ("target-only@fast", 1): Cell(tokens=330, seconds=1.0, first_token_s=[0.02]),
        ("target-only@fast", 16): Cell(tokens=3200, seconds=1.0, first_token_s=[0.04]),
        (MLX_LM, 1): Cell(tokens=120, seconds=1.0, first_token_s=[0.03]),
        (MLX_LM, 16): Cell(tokens=1000, seconds=1.0, first_token_s=[0.1]),
    }
    text = render(cells, n=64, repeats=1)
    assert "`target-only@fast` over `target-only` by clients: 1: 1.10x, 16: 1.33x (goal ≤ 1.25x: missed)" in text
    assert "single stream: 300 tokens/s (goal ≥ 250 on the 1.2 B target); 16 clients against 1: 8.00x" in text
    assert "`mlx_lm.server` at 16 clients: 2.40x (goal ≥ 2x, ≥ 1.5x 4-bit); time to first token p95 0.50x" in text
