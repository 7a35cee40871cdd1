"""`mlxcel generate` on a tiny random model and on the embedded target."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main


def generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app", "generate", *args], capture_output=True, text=True)


def test_generate_on_a_tiny_random_model(tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "-m", str(tiny_dir), "-p", "hello", "-n", "12", "--temp", "0"]) == 0
    captured = capsys.readouterr()
    assert "generated: 12 tokens" in captured.err
    assert "tokens/s" in captured.err


def test_embedded_target_writes_plausible_python(capsys: pytest.CaptureFixture[str]) -> None:
    prompt = "def fibonacci(n):"
    assert main(["generate", "-p", prompt, "-n", "64", "--temp", "0", "--no-chat-template"]) == 0
    text = capsys.readouterr().out
    assert len(text.strip()) > 40
    # Plausible Python: an indented function body that parses once its last, cut-off line is
    # dropped and an open docstring (if any) is closed.
    lines = (prompt + text).rstrip().splitlines()[:-1]
    assert all(line.startswith("    ") or not line.strip() for line in lines[1:])
    body = "\n".join(lines)
    closers = ["\n    pass\n", '\n    """\n    pass\n', "\n    '''\n    pass\n"]
    assert any(_parses(body + closer) for closer in closers), body


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    return True


def test_same_seed_gives_byte_identical_output() -> None:
    args = ["-p", "def fibonacci(n):", "-n", "40", "--seed", "7", "--temp", "0.8"]
    first, second = generate(*args), generate(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    assert generate(*args[:-3], "--seed", "8", "--temp", "0.8").stdout != first.stdout


def test_a_seed_beyond_64_bits_wraps_as_the_server_takes_it() -> None:
    """A huge seed raised inside MLX's key derivation; it now wraps modulo 2**64."""
    args = ["-p", "def fibonacci(n):", "-n", "12", "--temp", "0.8", "--seed"]
    wrapped, plain = generate(*args, str(2**64 + 7)), generate(*args, "7")
    assert wrapped.returncode == 0, wrapped.stderr
    assert wrapped.stdout == plain.stdout


def test_rotating_kv_cache_generates(tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["-p", "x " * 40, "-n", "30", "--max-kv-size", "16", "--seed", "0"]  # seeded: a random one can draw EOS
    assert main(["generate", "-m", str(tiny_dir), *args]) == 0
    assert "generated: 30 tokens" in capsys.readouterr().err
