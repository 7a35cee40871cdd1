"""Sixteen mixed rows stepping together: every drafter kind, ragged widths, rows joining late, on the
checkpoint's own dtype and on a 4-bit copy of the target. At T = 0 each row emits what it emits
alone, and what target-only decoding emits for its prompt.

Device-agnostic: on the CPU the BLAS shim keeps products row-stable (and MLX's quantized product
is row-stable there as it is); on CUDA the row-invariant kernels do, the 4-bit target through the
quantized one. On the H200: `python3 -m pytest -o addopts="" -p no:cacheprovider
tests/execution/test_mixed_rows.py`.
"""

from __future__ import annotations

import pytest
from mlx_lm import convert

from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.generation import Generation
from app.decoding.plan import LoopPlan, plan_from_settings
from app.execution.forward import batching
from app.execution.model import LoadedModel, load_model
from app.loading import EMBEDDED_TARGET
from app.loading.paths import REPO_ROOT
from app.profiles.schema import DrafterSettings, Settings
from app.sampling import SamplingParams
from tests.support.batched import Arrival, run_batched

pytestmark = pytest.mark.slow  # about 40 s of CPU: every drafter's rows, solo and together, twice

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = [
    "def merge_sorted(left, right):\n    result = []\n",
    "class LRUCache:\n    def __init__(self, capacity):\n",
    "import json\n\n\ndef load_config(path):\n",
    "for item in items:\n",
    "def fib(n):\n    if n < 2:\n",
    "    return sorted(values, key=lambda v: v.name)\n\n\ndef",
]
BLOCK_KINDS = {"mtp": "mtp", "dflash": "dflash", "dspark": "dflash", "muse": "dflash"}
# (builder, prompt, tokens, n_max, joins at tick): 16 rows, every kind, widths from 1 to the default
ROWS = [
    ("draft-model", 0, 24, None, 0), ("draft-model", 1, 16, 2, 0), ("draft-model", 4, 16, 6, 3),
    ("prompt-lookup", 5, 24, None, 0), ("prompt-lookup", 2, 16, None, 2),
    ("mtp", 1, 24, None, 0), ("mtp", 3, 16, None, 4),
    ("dflash", 2, 24, None, 0), ("dflash", 0, 16, 3, 1),
    ("dspark", 3, 24, None, 0), ("dspark", 5, 16, None, 2),
    ("muse", 4, 24, None, 0), ("muse", 1, 16, None, 5),
    ("target-only", 0, 24, None, 0), ("target-only", 3, 16, None, 1), ("draft-model", 2, 24, 0, 0),
]  # fmt: skip


@pytest.fixture(scope="module", params=["native", "4-bit"])
def target(request: pytest.FixtureRequest, embedded_target: LoadedModel, tmp_path_factory) -> LoadedModel:
    if request.param == "native":
        return embedded_target
    path = tmp_path_factory.mktemp("quantized") / "target-4bit"
    convert(hf_path=str(EMBEDDED_TARGET), mlx_path=str(path), quantize=True, q_bits=4, q_group_size=64)
    return load_model(path)


@pytest.fixture(scope="module")
def builders(target: LoadedModel, embedded_drafter: LoadedModel) -> dict[str, LoopBuilder]:
    def block(name: str) -> LoopBuilder:
        settings = Settings(drafter=DrafterSettings(kind=BLOCK_KINDS[name], model=str(REPO_ROOT / "models" / name)))
        return LoopBuilder(target, None, plan_from_settings(settings))

    return {
        "draft-model": LoopBuilder(target, embedded_drafter, LoopPlan(drafter_kind="draft-model")),
        "prompt-lookup": LoopBuilder(target, None, LoopPlan(drafter_kind="prompt-lookup")),
        "target-only": LoopBuilder(target, None, LoopPlan()),
        **{name: block(name) for name in BLOCK_KINDS},
    }


def build(builders: dict[str, LoopBuilder], kind: str, prompt: int, tokens: int, n_max: int | None) -> Generation:
    encoded = builders["target-only"].target.tokenizer.encode(PROMPTS[prompt])
    request = RowRequest(encoded, GREEDY, tokens, seed=0, ignore_eos=True, n_max=n_max)
    return builders[kind].build(request)


def alone(generation: Generation) -> list[int]:
    for _ in generation:
        pass
    return generation.emitted


def test_sixteen_mixed_rows_emit_their_solo_output_and_target_only_decoding(builders) -> None:
    # Target-only decoding of each prompt, once at the longest length asked of it: at T = 0 a
    # shorter request emits its prefix (max_tokens only ends the row).
    longest = {prompt: max(r[2] for r in ROWS if r[1] == prompt) for _, prompt, *_ in ROWS}
    plain = {prompt: alone(build(builders, "target-only", prompt, n, None)) for prompt, n in longest.items()}
    solo = [
        plain[prompt][:n] if kind == "target-only" and n_max is None else alone(build(builders, kind, prompt, n, n_max))
        for kind, prompt, n, n_max, _ in ROWS
    ]
    rows = [Arrival(build(builders, kind, prompt, n, n_max), joins=joins) for kind, prompt, n, n_max, joins in ROWS]
    widest = run_batched(rows)
    assert widest >= 12  # the rows really stepped together
    for row, one, arrival in zip(ROWS, solo, rows, strict=True):
        assert arrival.generation.emitted == one, row
        assert one == plain[row[1]][: row[2]], row  # and speculation changed nothing at T = 0
    assert sum(a.generation.stats.acceptance.accepted for a in rows) > 0  # proposals were verified, not skipped


def test_the_target_batches_quantized_or_not(builders) -> None:
    """Neither checkpoint falls back to one forward per row."""
    assert batching(builders["target-only"].target.model) == "rows"
