"""llama.cpp's GGUF files (app/loading/gguf.py): a file the test writes from the embedded target
(tests/support/gguf_file.py) is converted at load and served, its answers at T = 0 the target's
own; `-hf org/repo-GGUF:QUANT` is found in the Hugging Face cache; a tensor type or an
architecture MLX cannot serve gets one error naming GGUF, what it found and the doc."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest
from huggingface_hub import constants

from app.loading import EMBEDDED_TARGET, gguf
from app.profiles import ProfileError, resolve
from tests.loading.test_hub_cache import cache_model
from tests.support.cli import mlxcel
from tests.support.gguf_file import gguf_name, retype, source_weights, write_gguf
from tests.support.server import serve

Q4_K = 12  # ggml's type id


@pytest.fixture(scope="module")
def f32_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("gguf") / "target-F32.gguf")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Converted directories go under this test's own cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "mlxcel" / "gguf"


@pytest.mark.slow
def test_a_gguf_file_is_served_and_answers_as_its_source_model(
    f32_file: Path, tmp_path: Path, target_only_server
) -> None:
    body = {"prompt": "def fibonacci(n):\n", "n_predict": 32, "temperature": 0}
    text = {"content": "def fibonacci(n):\n    return 12345 + x", "with_pieces": False}
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    with serve(tmp_path, "-m", str(f32_file), env=env) as server, server.client() as http:
        answer = http.post("/completion", json=body).json()
        tokens = http.post("/tokenize", json=text).json()
        chat = http.post("/apply-template", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    with target_only_server.client() as http:
        assert answer["content"] == http.post("/completion", json=body).json()["content"]
        assert tokens == http.post("/tokenize", json=text).json()
        assert chat == http.post("/apply-template", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert answer["tokens_predicted"] > 8


def test_f16_and_f32_files_convert_without_loss(f32_file: Path, tmp_path: Path, cache: Path) -> None:
    """Every tensor of the directory made from a file is the file's, as the source's tensor in
    that type; the config is the source's shape."""
    f16_file = write_gguf(tmp_path / "target-F16.gguf", mx.float16)
    source = source_weights()
    for file, dtype in ((f32_file, mx.float32), (f16_file, mx.float16)):
        directory = gguf.served_directory(file)
        assert directory.parent == cache
        converted = mx.load(str(directory / "model.safetensors"))
        assert set(converted) == set(source)
        for name, array in source.items():
            assert converted[name].dtype == dtype and mx.array_equal(converted[name], array.astype(dtype)), name
        config = json.loads((directory / "config.json").read_text())
        want = json.loads((EMBEDDED_TARGET / "config.json").read_text())
        shape = ("vocab_size", "hidden_size", "num_hidden_layers", "num_key_value_heads", "head_dim", "rms_norm_eps")
        assert {k: config[k] for k in shape} == {k: want[k] for k in shape}
        assert sorted(config["eos_token_id"]) == sorted(want["eos_token_id"])
        assert gguf.served_directory(file) == directory  # converted once, then reused


def test_hf_repo_and_quant_tag_resolve_in_the_cache(
    f32_file: Path, tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama-server's `-hf org/repo-GGUF:QUANT`: the file whose name holds the tag (any case)."""
    files = tmp_path / "repo"
    files.mkdir()
    (files / "target-F32.gguf").write_bytes(f32_file.read_bytes())
    (files / "README.md").write_text("GGUF")
    hub = tmp_path / "hub"
    cache_model(hub, "acme/target-GGUF", files)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    settings = resolve(flags={"model": "acme/target-GGUF:f32"}).settings
    assert Path(settings.target.model).parent == cache
    assert (Path(settings.target.model) / "config.json").is_file()
    assert settings.server.model_alias == "acme/target-GGUF:f32"
    with pytest.raises(ProfileError, match=r"tag 'Q8_0' picks 0 of its GGUF files \(target-F32.gguf\)"):
        resolve(flags={"model": "acme/target-GGUF:Q8_0"})
    with pytest.raises(ProfileError, match="acme/absent-GGUF is not in the Hugging Face cache"):
        resolve(flags={"model": "acme/absent-GGUF:Q4_K_M"})


def test_a_tensor_type_mlx_cannot_read_is_one_error_naming_gguf_the_type_and_the_doc(
    f32_file: Path, tmp_path: Path
) -> None:
    bad = retype(f32_file, gguf_name("model.layers.0.mlp.down_proj.weight"), Q4_K, tmp_path / "target-Q4_K_M.gguf")
    result = mlxcel("serve", "-m", str(bad), "--port", "0", env={"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if "GGUF" in line]
    assert len(lines) == 1, result.stderr
    assert "tensor type Q4_K (1 tensors), first blk.0.ffn_down.weight" in lines[0]
    assert "docs/bring-your-own-model.md" in lines[0] and str(bad) in lines[0]
    assert not (tmp_path / "xdg").exists()  # refused from the header, before MLX read a tensor


def test_an_architecture_without_an_mlx_lm_module_here_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.gguf"
    mx.save_gguf(str(path), {"token_embd.weight": mx.zeros((4, 8))}, {"general.architecture": "gemma3"})
    with pytest.raises(ProfileError, match=r"a GGUF file .* architecture 'gemma3'; GGUF files are read for llama"):
        resolve(flags={"model": str(path)})


def test_a_missing_gguf_path_says_gguf(tmp_path: Path) -> None:
    result = mlxcel("serve", "-m", str(tmp_path / "absent.gguf"), "--port", "0")
    assert result.returncode == 2
    assert f"GGUF file not found: {tmp_path / 'absent.gguf'}" in result.stderr
