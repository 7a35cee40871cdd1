"""Loading refuses what it cannot run, with the stated messages and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main
from app.decoding.builder import LoopBuilder
from app.decoding.plan import LoopPlan
from app.execution.model import load_model
from app.loading import CheckpointKind, ModelLoadError, read_checkpoint
from ops.models.tiny import build_block_drafter_checkpoint, build_tiny_model
from tests.support.checkpoints import DFLASH, DSPARK, MUSE


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="model path does not exist"):
        load_model(tmp_path / "nowhere")


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"not a model directory \(no config.json\)"):
        load_model(tmp_path)


def test_config_without_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelLoadError, match=r"no \*.safetensors"):
        load_model(tmp_path)


def test_config_that_is_not_a_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        read_checkpoint(tmp_path)


@pytest.mark.parametrize(
    ("config", "kind"),
    [(DFLASH, CheckpointKind.DFLASH), (DSPARK, CheckpointKind.DSPARK), (MUSE, CheckpointKind.MUSE)],
)
def test_block_drafter_checkpoint_is_not_a_standalone_model(tmp_path: Path, config: dict, kind: str) -> None:
    path = build_block_drafter_checkpoint(tmp_path / kind, config)
    assert read_checkpoint(path).kind is kind
    with pytest.raises(ModelLoadError, match=r"not a standalone model.*mlxcel serve"):
        load_model(path)


def test_qwen3_model_type_alone_is_standalone(tiny_dir: Path) -> None:
    assert read_checkpoint(tiny_dir).kind is CheckpointKind.STANDALONE


def test_vocabulary_mismatch_is_refused(tmp_path: Path, tiny_model) -> None:
    other = load_model(build_tiny_model(tmp_path / "other", perturb_vocab=True))
    with pytest.raises(ModelLoadError, match=r"its vocabulary differs from the target's .* share a tokenizer"):
        LoopBuilder(tiny_model, other, LoopPlan(drafter_kind="draft-model"))


def test_untrimmable_cache_is_refused_for_speculation(tmp_path: Path, tiny_model) -> None:
    mamba = load_model(build_tiny_model(tmp_path / "mamba", model_type="mamba"))
    with pytest.raises(ModelLoadError, match=r"cache cannot be rewound \(ArraysCache\)"):
        LoopBuilder(tiny_model, mamba, LoopPlan(drafter_kind="draft-model"))


def test_cli_exits_2_with_the_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "-m", str(tmp_path / "missing"), "-p", "x"]) == 2
    assert "model path does not exist" in capsys.readouterr().err
    dflash = build_block_drafter_checkpoint(tmp_path / "dflash", DFLASH)
    assert main(["generate", "-m", str(dflash), "-p", "x"]) == 2
    assert "not a standalone model" in capsys.readouterr().err


def test_console_script_exit_code(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app", "generate", "-m", str(tmp_path), "-p", "x"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "not a model directory" in result.stderr
