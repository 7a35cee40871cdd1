"""A LoRA adapter named by a profile (target.adapter_path), the environment or a flag (--adapter-path,
--lora, --lora-scaled) that cannot be applied stops startup naming where it was set, before MLX
loads: checked from the adapter's files and the weights' headers (app/loading/adapter.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.loading import EMBEDDED_TARGET
from app.profiles import ProfileError, resolve, settled
from tests.cli.test_migration_flags import parsed
from tests.support.lora import RANK, write_adapter

Q_PROJ = "model.layers.13.self_attn.q_proj"  # the embedded target's: 256 in, 256 out


def fitting(root: Path) -> Path:
    return write_adapter(root, {f"{Q_PROJ}.lora_a": [256, RANK], f"{Q_PROJ}.lora_b": [RANK, 256]})


def refusal(flags: dict | None = None, profile: str = "target-only") -> str:
    with pytest.raises(ProfileError) as refused:
        settled(resolve(profile, flags))
    return str(refused.value)


def test_an_adapter_that_fits_is_served_with_its_scale(tmp_path: Path) -> None:
    adapter = fitting(tmp_path / "adapter")
    target = settled(resolve("default", parsed("--lora-scaled", str(adapter), "0.5"))).settings.target
    assert (target.adapter_path, target.adapter_scale) == (str(adapter), 0.5)
    assert settled(resolve("default", parsed("--lora", str(adapter)))).settings.drafter.kind == "draft-model"


def test_a_missing_adapter_names_its_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nowhere"
    assert refusal({"adapter_path": str(missing)}).startswith(
        f"flag --adapter-path: adapter path does not exist: {missing}"
    )
    monkeypatch.setenv("MLXCEL_TARGET__ADAPTER_PATH", str(missing))
    assert refusal().startswith("environment: MLXCEL_TARGET__ADAPTER_PATH: adapter path does not exist")
    monkeypatch.delenv("MLXCEL_TARGET__ADAPTER_PATH")
    profile = tmp_path / "mine.toml"
    profile.write_text(f'[target]\nmodel = "{EMBEDDED_TARGET}"\nadapter_path = "adapters"\n')
    assert refusal(profile=str(profile)).startswith(f"{profile}: target.adapter_path: adapter path does not exist: ")


def test_lora_with_a_file_names_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """llama-server's --lora takes a GGUF LoRA: refused at once, naming the flag and what it takes."""
    for name in ("adapter.gguf", "adapter.bin"):
        (tmp_path / name).write_bytes(b"GGUF")
        with pytest.raises(SystemExit):
            parsed("--lora", str(tmp_path / name))
        said = " ".join(capsys.readouterr().err.split())
        assert f"--lora: {tmp_path / name} is a" in said and "an mlx-lm adapter directory" in said
    adapter = fitting(tmp_path / "adapter")
    with pytest.raises(SystemExit):
        parsed("--lora", str(adapter), "--adapter-path", str(adapter))
    assert "--adapter-path: one adapter is served" in " ".join(capsys.readouterr().err.split())


def test_an_adapter_for_another_model_names_the_tensor(tmp_path: Path) -> None:
    wide = write_adapter(tmp_path / "wide", {f"{Q_PROJ}.lora_a": [512, RANK], f"{Q_PROJ}.lora_b": [RANK, 256]})
    said = refusal({"adapter_path": str(wide)})
    assert said.startswith(f"flag --adapter-path: {wide} cannot be applied to the target ")
    assert f"{Q_PROJ}.lora_a: shape (512, {RANK}) does not fit" in said


def test_a_broken_adapter_config_or_a_stray_scale_is_refused(tmp_path: Path) -> None:
    alpha = {"num_layers": 1, "lora_parameters": {"rank": RANK, "alpha": 16}}  # PEFT's spelling, not mlx-lm's
    broken = write_adapter(tmp_path / "alpha", {}, alpha)
    assert "lora_parameters has no scale" in refusal({"adapter_path": str(broken)})
    assert refusal({"adapter_scale": 0.5}).startswith("flag --lora-scaled: scales an adapter, but")
