"""The concurrency benchmark's options, stream accounting and table, without starting a server."""

from __future__ import annotations

import json

import pytest

from app.engine.metrics import Metrics
from app.server.metrics import HttpMetrics, exposition
from ops.bench.concurrency import (
    MLX_LM,
    SEED,
    Cell,
    Rounds,
    Stream,
    arm_settings,
    fast_arms,
    figures,
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
    assert "| `default` profile | 8 | 400.0 | 4.00x | 2.00x |  |  | 15.0 / 15.0 | 100 / 100 |" in text
    assert "| mlx_lm.server | 1 | 50.0 | 1.00x | 1.00x |  |  | 20.0 / 20.0 | 60 / 60 |" in text
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
    cells["mtp", 8] = Cell(tokens=400, seconds=1.0)
    text = render(cells, n=64, repeats=1)
    assert "`mtp` against the better of target-only and `mtp@fixed` by clients: 1: 1.05x, 8: 1.00x" in text
    assert "(goal ≥ 1.0x at every count: met)" in text
    assert "`mtp` at 1 client against target-only: 2.00x (goal on the H200 ≥ 1.5x)" in text
    cells["mtp", 8] = Cell(tokens=399, seconds=1.0)
    assert "8: 1.00x (goal ≥ 1.0x at every count: missed)" in render(cells, n=64, repeats=1)


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
    assert (body["temperature"], body["seed"], body["speculative_diagnostics"]) == (0.7, SEED + 3, True)
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
    text = render({}, n=64, repeats=1, sampled={0.7: cells})
    assert "T = 0.7, each request seeded" in text and "| 0.850 |" in text
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


def test_sampled_waves_are_seeded_alike_in_every_arm_and_reported_apart() -> None:
    """At T > 0 each request carries its prompt's seed (the same in every arm); the sampled
    temperatures get their own tables and goals, and the JSON keeps every temperature's figures."""
    prompt = HELD_OUT_CODE[3]
    body = json.loads(request_body(prompt, 16, "default", 0.7))
    assert body["temperature"] == 0.7 and body["seed"] == SEED + 3
    assert "seed" not in json.loads(request_body(prompt, 16, "default"))
    args = parse_args(["--temperatures", "0.7,0", "--sampled-clients", "8,1"])
    assert args.temperatures == [0.0, 0.7] and args.sampled_clients == [1, 8]
    cold = {("target-only", 1): Cell(tokens=100, seconds=1.0), ("default", 1): Cell(tokens=150, seconds=1.0)}
    hot = {("target-only", 1): Cell(tokens=80, seconds=1.0), ("default", 1): Cell(tokens=70, seconds=1.0),
           ("default@fixed", 1): Cell(tokens=60, seconds=1.0, widths={4: 10}, plain_steps=0)}  # fmt: skip
    text = render(cold, n=16, repeats=1, sampled={0.7: hot})
    assert "T = 0.7, each request seeded" in text
    assert "| `default@fixed` profile | 1 | 60.0 | 1.00x |  | 0.75x | 4.0 (0 %) |" in text
    assert "`default` against the better of target-only and `default@fixed` by clients: 1: 0.88x" in text
    saved = figures({0.0: cold, 0.7: hot})
    assert saved["tokens_per_second"]["default"] == {1: 150.0}
    assert saved["runs"]["0.7"]["tokens_per_second"]["default@fixed"] == {1: 60.0}
    assert saved["runs"]["0.7"]["mean_width"]["default@fixed"] == {1: "4.0 (0 %)"}


def test_the_widths_rounds_ran_at_come_from_the_servers_metrics() -> None:
    """The cumulative width histogram and the plain-step counter of two scrapes, as one cell's
    rounds by width: its mean width over every step, and the share of plain ones."""
    metrics = Metrics(spec_widths=[0, 2, 2, 0, 10], spec_decode_plain_steps_total=5)
    before = Rounds.parse(exposition(metrics, HttpMetrics()).decode())
    assert before == Rounds(widths={0: 0, 1: 2, 2: 2, 3: 0, 4: 10}, plain_steps=5)
    after = Rounds(widths={0: 0, 1: 6, 2: 8, 4: 20}, plain_steps=15)
    cell = Cell()
    after.since(before, cell)
    assert cell.widths == {1: 4, 2: 6, 4: 10} and cell.plain_steps == 10
    assert cell.width_summary() == f"{(4 + 12 + 40) / 30:.1f} (33 %)"


def test_the_plot_draws_a_panel_per_file_and_temperature(tmp_path) -> None:
    from ops.bench import plot

    cells = {("target-only", 1): Cell(tokens=100, seconds=1.0), ("default", 1): Cell(tokens=150, seconds=1.0),
             ("default@fixed", 1): Cell(tokens=140, seconds=1.0)}  # fmt: skip
    (tmp_path / "cpu.json").write_text(json.dumps(figures({0.0: cells, 0.7: cells})))
    (tmp_path / "old.json").write_text(json.dumps({"machine": "m", "tokens_per_second": {"default": {"1": 1.0}}}))
    assert [label for label, _ in plot.panels(json.loads((tmp_path / "cpu.json").read_text()))] == [
        "T = 0.0",
        "T = 0.7",
    ]
    plot.main([str(tmp_path / "cpu.json"), str(tmp_path / "old.json"), "--out", str(tmp_path / "p.png")])
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
