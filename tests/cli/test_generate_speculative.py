"""What `mlxcel generate` prints about speculation: drafter kind, summary, diagnostic, logs."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli.generate import resolve
from app.loading import EMBEDDED_DRAFTER, ModelLoadError
from ops.models.tiny import build_block_drafter_checkpoint
from tests.support.checkpoints import DFLASH

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


def test_real_dflash_checkpoints_are_refused_naming_serve(tmp_path: Path) -> None:
    dflash = build_block_drafter_checkpoint(tmp_path / "dflash", DFLASH)
    for extra in ([], ["--draft-kind", "dflash"]):
        result = generate(*PROMPT, "--draft-model", str(dflash), *extra)
        assert result.returncode == 2
        assert "mlxcel serve" in result.stderr
    result = generate(*PROMPT, "--draft-model", str(EMBEDDED_DRAFTER), "--draft-kind", "mtp")
    assert result.returncode == 2 and "mlxcel serve" in result.stderr


@pytest.mark.parametrize(
    ("drafter", "kind", "message"),
    [
        (EMBEDDED_DRAFTER, "dflash", "--draft-kind dflash selects the dflash round loop, which runs only under"),
        (
            EMBEDDED_DRAFTER.parent / "dflash",
            None,
            "dflash is a drafter checkpoint of kind dflash; its dflash round loop runs only under",
        ),
    ],
)
def test_block_loop_refusal_names_the_loop_asked_for(drafter: Path, kind: str | None, message: str) -> None:
    args = argparse.Namespace(prompt_lookup=False, draft_kind=kind, draft_model=str(drafter))
    with pytest.raises(ModelLoadError) as refused:
        resolve(args)
    text = str(refused.value)
    assert text.startswith("mlxcel generate runs only the classic speculative generator and prompt lookup: ")
    assert message in text and text.endswith('`mlxcel serve` (drafter.kind = "dflash")')
    assert "draft-model" not in text  # the classic loop is not the one that was asked for


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
