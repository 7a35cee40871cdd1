"""The benchmarks say what they are doing on a terminal (a bar per timed loop, a line before each
step without one: servers starting, models loading and warming) and print the tables alone when
stderr is not one; each suite's --help names it as `mlxcel bench SUITE` runs it."""

from __future__ import annotations

import importlib
import io

import pytest

from app.cli.bench import SUITES
from ops.bench.common import progress, stage


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "piped"])
def test_progress_shows_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch, terminal: bool) -> None:
    err = Terminal() if terminal else io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    stage("starting the default server")
    with progress(3, "requests") as bar:
        bar.update(3)
    shown = err.getvalue()
    if terminal:
        assert "mlxcel bench: starting the default server" in shown and "requests:   0%" in shown
    else:
        assert shown == ""


@pytest.mark.parametrize("suite", SUITES)
def test_each_suites_help_names_it_as_mlxcel_bench_runs_it(suite: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        importlib.import_module(f"ops.bench.{suite}").main(["--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: mlxcel bench {suite} ")
