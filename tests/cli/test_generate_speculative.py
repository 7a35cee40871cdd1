"""What `mlxcel generate` prints about speculation: drafter kind, summary, diagnostic, logs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from app.loading import EMBEDDED_DRAFTER

SUMMARY = re.compile(
    r"^\[Speculative acceptance\] rule=(?P<rule>[a-z-]+) rounds=(?P<rounds>\d+) proposed=(?P<proposed>\d+) "
    r"positions_tested=(?P<tested>\d+) accepted=(?P<accepted>\d+) per_position_acceptance=(?P<ppa>[\d.]+) "
    r"acceptance_rate=(?P<rate>[\d.]+) mean_accepted_len=(?P<mal>[\d.]+) \((?P<why>.+)\)$",
    re.MULTILINE,
)
DIAGNOSTIC = re.compile(
    r"^\[Speculative acceptance diagnostic\] closed_form_sum_min=(?P<smin>[\d.]+) "
    r"closed_form_sum_prod=(?P<sprod>[\d.]+) \(",
    re.MULTILINE,
)
PROMPT = ["-p", "def quicksort(items):", "-n", "48", "--no-chat-template", "--seed", "5"]


def generate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MLXCEL_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "app", "generate", *args], capture_output=True, text=True, env=full_env
    )


def summary_of(stdout: str) -> dict[str, str]:
    match = SUMMARY.search(stdout)
    assert match, stdout
    return match.groupdict()


def test_summary_line_arithmetic_and_drafter_kind_lines() -> None:
    result = generate(*PROMPT, "--temp", "0", "--draft-model", str(EMBEDDED_DRAFTER))
    assert result.returncode == 0, result.stderr
    s = summary_of(result.stdout)
    assert s["rule"] == "greedy-argmax"
    rounds, proposed, tested, accepted = (int(s[k]) for k in ("rounds", "proposed", "tested", "accepted"))
    assert float(s["ppa"]) == pytest.approx(accepted / tested, abs=1e-4)
    assert float(s["rate"]) == pytest.approx(accepted / proposed, abs=1e-4)
    assert float(s["mal"]) == pytest.approx(accepted / rounds, abs=1e-4)
    assert "Resolved drafter kind: draft-model" in result.stderr
    assert "auto-detected only; running the classic speculative generator" in result.stderr
    assert not DIAGNOSTIC.search(result.stdout)


@pytest.mark.parametrize(
    ("env", "rule"), [({}, "sampler-match"), ({"MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT": "on"}, "stochastic")]
)
def test_rule_and_diagnostic_at_temperature(env: dict[str, str], rule: str) -> None:
    result = generate(
        *PROMPT,
        "--temp",
        "0.7",
        "--draft-model",
        str(EMBEDDED_DRAFTER),
        env={**env, "MLXCEL_SPECULATIVE_ACCEPT_DIAG": "1"},
    )
    assert summary_of(result.stdout)["rule"] == rule
    diag = DIAGNOSTIC.search(result.stdout)
    assert diag and float(diag["smin"]) >= float(diag["sprod"])


def test_seeded_sampler_match_prints_the_target_only_text() -> None:
    """`--seed` reproduces a run, and under sampler-match (MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT=0
    keeps it) the drafted run's text is target-only's: the drafter draws from its own stream."""
    hot = [*PROMPT, "--temp", "0.7"]
    alone = generate(*hot)
    drafted = generate(*hot, "--draft-model", str(EMBEDDED_DRAFTER), env={"MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT": "0"})
    assert alone.returncode == drafted.returncode == 0, drafted.stderr
    assert summary_of(drafted.stdout)["rule"] == "sampler-match" and int(summary_of(drafted.stdout)["rounds"]) > 0
    text = alone.stdout  # the text and a newline; the drafted run's summary line follows it
    assert drafted.stdout[: len(text)] == text and drafted.stdout[len(text) :].startswith("[Speculative acceptance]")


def test_explicit_kind_is_reported_as_explicit() -> None:
    result = generate(*PROMPT, "--temp", "0", "--draft-model", str(EMBEDDED_DRAFTER), "--draft-kind", "draft-model")
    assert "explicit)" in result.stderr
    assert "auto-detected only" not in result.stderr


def test_prompt_lookup_summary_says_sampler_match_is_already_optimal() -> None:
    result = generate(*PROMPT, "--temp", "0.7", "--prompt-lookup", env={"MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT": "1"})
    s = summary_of(result.stdout)
    assert s["rule"] == "sampler-match"
    assert "one-hot" in s["why"] and "nothing to opt into" in s["why"]


def test_a_block_drafter_checkpoint_runs_its_round_loop() -> None:
    """A DFlash checkpoint given with --draft-model gets the kind its config.json describes, and
    that round loop runs, as `serve` runs it."""
    result = generate(*PROMPT, "--temp", "0", "--draft-model", str(EMBEDDED_DRAFTER.parent / "dflash"))
    assert result.returncode == 0, result.stderr
    assert "Resolved drafter kind: dflash (" in result.stderr and "running the dflash round loop" in result.stderr
    assert summary_of(result.stdout)["rule"] == "argmax-against-argmax"


def test_a_kind_that_cannot_drive_the_drafter_is_refused_naming_the_kind_it_needs() -> None:
    result = generate(*PROMPT, "--draft-model", str(EMBEDDED_DRAFTER), "--draft-kind", "mtp")
    assert result.returncode == 2
    assert '"mtp" cannot drive' in result.stderr and 'set drafter.kind = "draft-model"' in result.stderr


def test_mlxcel_log_installs_structlog_on_stderr_only_when_set() -> None:
    quiet = generate(*PROMPT, "--temp", "0", "--draft-model", str(EMBEDDED_DRAFTER))
    loud = generate(*PROMPT, "--temp", "0", "--draft-model", str(EMBEDDED_DRAFTER), env={"MLXCEL_LOG": "info"})
    assert quiet.stdout == loud.stdout  # stdout stays clean
    events = [json.loads(line) for line in loud.stderr.splitlines() if line.startswith("{")]
    names = [e["event"] for e in events]
    assert names == ["drafter_kind_resolved", "acceptance_rule_active", "speculative_decode_finished"]
    assert not any(line.startswith("{") for line in quiet.stderr.splitlines())
    finished = events[-1]
    assert finished["rule"] == "greedy-argmax" and finished["accepted"] == int(summary_of(loud.stdout)["accepted"])
