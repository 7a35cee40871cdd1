"""A LoRA adapter fused into the target at load (target.adapter_path): the served answer is mlx-lm's
own with the adapter fused, with the drafter and without, and the exactness guards hold over it.

The adapter is built with mlx-lm's LoRA tooling for the embedded target (tests/support/lora.py).
Engines are built from the shipped profiles as the server builds them, the adapter given as the
`--adapter-path` flag gives it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from app.acceptance import Rule
from app.decoding.builder import LoopBuilder, RowRequest
from app.engine.engine import Engine
from app.execution.model import load_model
from app.loading import ModelLoadError
from app.profiles import resolve, settled
from app.sampling import SamplingParams
from tests.support.lora import RANK, SCALE, build_adapter, greedy_tokens, mlx_lm_fused, write_adapter

PROMPTS = ["def merge_sorted(left, right):\n", "class LRUCache:\n    def __init__(self, capacity):\n"]
N_PREDICT = 48
GREEDY = SamplingParams(temperature=0.0)
HOT = SamplingParams(temperature=0.7)


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_adapter(tmp_path_factory.mktemp("lora") / "adapter")


@functools.cache
def builder(profile: str, adapter: Path | None, scale: float | None = None) -> LoopBuilder:
    flags = {"adapter_path": str(adapter) if adapter else None, "adapter_scale": scale}
    engine = Engine(settled(resolve(profile, flags)).settings)
    engine.host.load()
    return engine.host.builder


def run(loops: LoopBuilder, request: RowRequest) -> list[int]:
    generation = loops.build(request)
    generation.prefill()
    while not generation.finished:
        generation.step()
    return generation.emitted


def prompt_tokens() -> list[list[int]]:
    tokenizer = builder("target-only", None).target.tokenizer
    return [list(tokenizer.encode(prompt)) for prompt in PROMPTS]


@functools.cache
def fused(adapter: Path) -> tuple:
    return mlx_lm_fused(adapter)


def test_the_served_answer_is_mlx_lms_own_with_the_adapter_fused(adapter: Path) -> None:
    """T = 0, target-only and with the default profile's draft model (T = 0 identity): mlx-lm's
    greedy tokens of its own fused model; and not the answer without the adapter (so this can fail)."""
    model, tokenizer = fused(adapter)
    for tokens in prompt_tokens():
        want = greedy_tokens(model, tokenizer, tokens, N_PREDICT)
        request = RowRequest(tokens, GREEDY, max_tokens=N_PREDICT)
        alone = run(builder("target-only", adapter), request)
        drafted = run(builder("default", adapter), request)
        assert alone == want and drafted == want
        assert run(builder("target-only", None), request) != want


def test_a_scaled_adapter_is_mlx_lms_own_with_that_scale(adapter: Path, tmp_path: Path) -> None:
    """--lora-scaled DIR 0.5 serves the model an adapter_config.json of half its scale gives mlx-lm."""
    halved = tmp_path / "halved"
    halved.mkdir()
    (halved / "adapters.safetensors").symlink_to(adapter / "adapters.safetensors")
    config = (adapter / "adapter_config.json").read_text()
    (halved / "adapter_config.json").write_text(config.replace(f'"scale": {SCALE}', f'"scale": {SCALE * 0.5}'))
    model, tokenizer = mlx_lm_fused(halved)
    tokens = prompt_tokens()[0]
    want = greedy_tokens(model, tokenizer, tokens, N_PREDICT)
    assert run(builder("target-only", adapter, 0.5), RowRequest(tokens, GREEDY, max_tokens=N_PREDICT)) == want
    assert want != greedy_tokens(*fused(adapter), tokens, N_PREDICT)


def test_seeded_speculation_emits_target_only_tokens_with_the_adapter(adapter: Path) -> None:
    """Seeded identity: at T = 0.7 the default profile's sampler-match rows emit the adapted
    target-only's tokens, token for token, having drafted."""
    for i, tokens in enumerate(prompt_tokens()):
        request = RowRequest(tokens, HOT, max_tokens=N_PREDICT, seed=50 + i, ignore_eos=True)
        generation = builder("default", adapter).build(request)
        generation.prefill()
        while not generation.finished:
            generation.step()
        assert generation.speculation.rule is Rule.SAMPLER_MATCH and generation.stats.acceptance.rounds > 0
        assert generation.emitted == run(builder("target-only", adapter), request)


def test_what_the_headers_cannot_tell_mlx_lm_refuses_at_load(tmp_path: Path) -> None:
    """A tensor the target has no layer for passes the startup check (names the architecture may
    rename on load are left to mlx-lm) and mlx-lm's own check refuses it at load: a ModelLoadError,
    which `serve` ends with exit 2."""
    bogus = write_adapter(tmp_path / "bogus", {"model.layers.13.self_attn.q_norm.lora_a": [64, RANK]})
    settings = settled(resolve("target-only", {"adapter_path": str(bogus)})).settings
    with pytest.raises(ModelLoadError, match=r"cannot apply the adapter .*not an adapter parameter in the model"):
        load_model(settings.target.model, adapter=settings.target.adapter_path)
