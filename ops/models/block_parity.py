"""Check that the torch drafters of train_block_drafters.py and the MLX ones of the server agree.

Needs torch, transformers and mlx in one environment (float32 on the CPU is enough):

    python ops/models/block_parity.py [--target models/target]

Random-weight DFlash, DSpark and MTP drafters are saved exactly as training saves them, loaded by
the server's loader, and run on the same tokens against the embedded target; the logits must
agree to float32 rounding.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import app  # noqa: E402, F401 - routes MLX's BLAS before mlx.core loads
import mlx.core as mx  # noqa: E402

from app.sampling.state import RowState  # noqa: E402
from app.drafters.block import DFlashDrafter as MlxDFlash  # noqa: E402
from app.drafters.block import MtpDrafter as MlxMtp  # noqa: E402
from app.drafters.block import load_block_drafter  # noqa: E402
from app.execution.target_taps import TargetTaps  # noqa: E402
from app.execution.model import load_model  # noqa: E402
from app.sampling import RowRng, SamplerPipeline, SamplingParams  # noqa: E402
from ops.models.train_block_drafters import SHAPE, DFlashDrafter, MtpHead, config_for, target_states  # noqa: E402


def randomize(module: torch.nn.Module) -> None:
    torch.manual_seed(0)
    for name, param in module.named_parameters():
        param.data = torch.randn_like(param) * (0.05 if "norm" not in name else 0.1) + ("norm" in name)


def save(module: torch.nn.Module, config: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().float().contiguous() for k, v in module.state_dict().items() if not k.startswith("rotary")}
    save_file(state, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config))
    return out


def main() -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__)
    p.add_argument("--target", type=Path, default=Path(__file__).resolve().parents[2] / "models" / "target")
    args = p.parse_args()
    torch_target = Qwen3ForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    mlx_target = load_model(args.target)
    vocab, n_layers = torch_target.config.vocab_size, torch_target.config.num_hidden_layers
    embed = torch_target.model.embed_tokens
    x = torch.tensor([[11, 42, 7, 300, 19, 5, 88, 1024, 3, 64, 901, 17, 17, 4, 250, 6, 2047, 33, 512, 9]])
    anchor, tmp = 12, Path(tempfile.mkdtemp())
    features, final = target_states(torch_target, x)
    greedy = SamplerPipeline(SamplingParams(temperature=0.0), vocab)
    worst = {}
    for kind, block, rank in (("dflash", 8, 0), ("dspark", 7, 8)):
        model = DFlashDrafter(2, vocab, rank)
        randomize(model)
        with torch.no_grad():
            rows = block if kind == "dspark" else block
            positions = (anchor + torch.arange(rows))[None, None]
            tokens = torch.full_like(positions, 3)
            tokens[..., 0] = x[0, anchor]
            hidden = model(features, embed(tokens).float(), positions, torch.tensor([[anchor]]))
            expected = torch_target.lm_head(hidden)[0, 0].numpy()
        bound = load_block_drafter(save(model, config_for(kind, kind, 2, block, {"markov_rank": rank} if rank else {},
                                                          vocab, n_layers), tmp / kind), mlx_target)  # fmt: skip
        drafter = MlxDFlash(bound)
        with bound.taps.capture(bound.tap_names) as seen:
            mlx_target.model(mx.array(x[:, :anchor].numpy()))
        drafter.add_context(TargetTaps.rows(seen, bound.tap_names))
        block_tokens = mx.array([[int(x[0, anchor])] + [3] * (rows - 1)])
        got = np.array(bound.taps.lm_head(drafter.model(bound.taps.embed_tokens(block_tokens), drafter.caches, anchor))[0])
        worst[kind] = float(np.abs(got - expected).max() / (np.abs(expected).max() + 1e-9))
        row = RowState(x[0, : anchor + 1].tolist(), greedy, RowRng(0))  # anchored at x[anchor], position anchor
        drafter.propose(row, rows - 1 if kind == "dflash" else rows)
    cfg = Qwen3Config(**SHAPE, num_hidden_layers=1, vocab_size=vocab, rms_norm_eps=1e-6, rope_theta=10000.0,
                      max_position_embeddings=4096, attn_implementation="sdpa")  # fmt: skip
    head = MtpHead(cfg)
    randomize(head)
    with torch.no_grad():
        expected = torch_target.lm_head(head.norm(head(final[:, :-1], embed(x[:, 1:]).float())))[0].numpy()
    bound = load_block_drafter(save(head, config_for("mtp", "mtp", 1, 0, {}, vocab, n_layers), tmp / "mtp"), mlx_target)
    mtp = MlxMtp(bound)
    with bound.taps.capture(bound.tap_names) as seen:
        mlx_target.model(mx.array(x.numpy()))
    hidden = TargetTaps.rows(seen, bound.tap_names)[:, :-1]
    out = mtp.head(hidden, bound.taps.embed_tokens(mx.array(x[:, 1:].numpy())), mtp.cache)
    got = np.array(bound.taps.lm_head(mtp.head.norm(out))[0])
    worst["mtp"] = float(np.abs(got - expected).max() / (np.abs(expected).max() + 1e-9))
    print(json.dumps(worst, indent=2))
    assert all(v < 1e-4 for v in worst.values()), worst


if __name__ == "__main__":
    main()
