"""Train tiny block drafters against the embedded target: DFlash, DSpark, the Muse assistant, MTP.

torch + transformers; one NVIDIA GPU makes it minutes. Everything that decides the result is
here: data, architectures, seeds, steps. The modules mirror app/drafters/block_model.py weight
for weight (ops/models/block_parity.py checks the two give the same outputs).

    python ops/models/train_block_drafters.py --target models/target --out /tmp/drafters

Data: 64-token windows of the corpus rule of train_default_pair.py, continued by the frozen
target itself for 192 tokens (half greedy, half sampled at T 0.8), so drafters learn what the
target will actually say. Distillation on the target's own generations and hidden states:
DFlash-family drafters read the outputs of target layers `TARGET_LAYER_IDS`; the MTP head reads
the target's final (normed) hidden state.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RotaryEmbedding

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from ops.models.train_default_pair import collect_corpus, default_roots, is_held_out  # noqa: E402

SEED = 20261201
PROMPT_LEN, NEW_TOKENS = 64, 192
TARGET_LAYER_IDS = [1, 5, 9, 12]
SHAPE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64)
DRAFTERS = {  # name -> kind, layers, block size, extra config
    "dflash": ("dflash", 2, 8, {}),
    "dspark": ("dspark", 2, 7, {"markov_rank": 64}),
    "muse": ("muse", 2, 8, {}),
    "mtp": ("mtp", 1, 0, {}),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype) * self.weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Non-interleaved rotary embedding of x [..., T, d] at positions [..., T]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    angles = positions.float()[..., None] * inv
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return (x.float() * cos + half.float() * sin).to(x.dtype)


class MLP(nn.Module):
    def __init__(self, h: int, i: int) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(h, i, bias=False), nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class InjectedAttention(nn.Module):
    def __init__(self, h: int, heads: int, kv: int, d: int) -> None:
        super().__init__()
        self.heads, self.kv, self.d = heads, kv, d
        self.q_proj, self.k_proj = nn.Linear(h, heads * d, bias=False), nn.Linear(h, kv * d, bias=False)
        self.v_proj, self.o_proj = nn.Linear(h, kv * d, bias=False), nn.Linear(heads * d, h, bias=False)
        self.q_norm, self.k_norm = RMSNorm(d), RMSNorm(d)

    def keys_values(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(n, t, self.kv, self.d)).transpose(1, 2)
        v = self.v_proj(x).view(n, t, self.kv, self.d).transpose(1, 2)
        return rope(k, positions[:, None, :]), v

    def forward(self, x, ctx_k, ctx_v, positions, ctx_mask):
        """x [N, L, H] block rows; ctx_k/ctx_v [N, kv, S, d]; ctx_mask [N, S] (True: visible)."""
        n, length, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(n, length, self.heads, self.d)).transpose(1, 2)
        q = rope(q, positions[:, None, :])
        k, v = self.keys_values(x, positions)
        keys, values = torch.cat([ctx_k, k], 2), torch.cat([ctx_v, v], 2)
        reps = self.heads // self.kv
        keys, values = keys.repeat_interleave(reps, 1), values.repeat_interleave(reps, 1)
        visible = torch.cat([ctx_mask, torch.ones(n, length, dtype=torch.bool, device=x.device)], 1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible[:, None, None, :])
        return self.o_proj(out.transpose(1, 2).reshape(n, length, -1))


class DraftLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        h = SHAPE["hidden_size"]
        self.self_attn = InjectedAttention(h, SHAPE["num_attention_heads"], SHAPE["num_key_value_heads"],
                                           SHAPE["head_dim"])  # fmt: skip
        self.mlp = MLP(h, SHAPE["intermediate_size"])
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(h), RMSNorm(h)

    def forward(self, x, ctx_k, ctx_v, positions, ctx_mask):
        x = x + self.self_attn(self.input_layernorm(x), ctx_k, ctx_v, positions, ctx_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    def __init__(self, layers: int, vocab: int, markov_rank: int = 0) -> None:
        super().__init__()
        h = SHAPE["hidden_size"]
        self.fc = nn.Linear(len(TARGET_LAYER_IDS) * h, h, bias=False)
        self.hidden_norm = RMSNorm(h)
        self.layers = nn.ModuleList(DraftLayer() for _ in range(layers))
        self.norm = RMSNorm(h)
        if markov_rank:
            self.markov_w1 = nn.Embedding(vocab, markov_rank)
            self.markov_w2 = nn.Linear(markov_rank, vocab, bias=False)
            nn.init.zeros_(self.markov_w2.weight)  # start from the parallel drafter

    def forward(self, features, block_embeddings, block_positions, anchors):
        """features [B, S, F]; block rows [B, A, L, H] at positions [B, A, L]; anchors [B, A]."""
        b, a, length, h = block_embeddings.shape
        s = features.shape[1]
        h_ctx = self.hidden_norm(self.fc(features))
        ctx_positions = torch.arange(s, device=features.device)[None, :].expand(b, s)
        ctx_mask = (torch.arange(s, device=features.device)[None, None, :] < anchors[..., None]).reshape(b * a, s)
        x = block_embeddings.reshape(b * a, length, h)
        positions = block_positions.reshape(b * a, length)
        for layer in self.layers:
            k, v = layer.self_attn.keys_values(h_ctx, ctx_positions)
            k = k[:, None].expand(b, a, *k.shape[1:]).reshape(b * a, *k.shape[1:])
            v = v[:, None].expand(b, a, *v.shape[1:]).reshape(b * a, *v.shape[1:])
            x = layer(x, k, v, positions, ctx_mask)
        return self.norm(x).view(b, a, length, h)


class MtpHead(nn.Module):
    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        h = SHAPE["hidden_size"]
        self.enorm, self.hnorm = RMSNorm(h), RMSNorm(h)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.layer = Qwen3DecoderLayer(config, layer_idx=0)
        self.norm = RMSNorm(h)
        self.rotary = Qwen3RotaryEmbedding(config)

    def forward(self, hidden, embedded):
        x = self.eh_proj(torch.cat([self.enorm(embedded), self.hnorm(hidden)], -1))
        positions = torch.arange(x.shape[1], device=x.device)[None, :].expand(x.shape[0], -1)
        cos_sin = self.rotary(x, positions)
        causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).tril()
        out = self.layer(x, attention_mask=causal[None, None], position_ids=positions, position_embeddings=cos_sin)
        return out[0] if isinstance(out, tuple) else out


def generate_data(target, tokenizer, device: str, sequences: int, seed: int) -> torch.Tensor:
    """Prompts from the corpus continued by the target: [N, PROMPT_LEN + NEW_TOKENS] token ids."""
    docs = [t for _, t in collect_corpus(default_roots(), 48 * 1024 * 1024) if not is_held_out(t)]
    rng = random.Random(seed)
    stream = []
    for text in rng.sample(docs, min(len(docs), 6000)):
        stream.extend(tokenizer(text)["input_ids"])
    starts = [rng.randrange(0, len(stream) - PROMPT_LEN) for _ in range(sequences)]
    prompts = torch.tensor([stream[s : s + PROMPT_LEN] for s in starts], device=device)
    out = []
    torch.manual_seed(seed)
    with torch.no_grad(), torch.autocast(device_type=device, dtype=torch.bfloat16):
        for i, batch in enumerate(prompts.split(512)):
            sample = i % 2 == 1
            generated = target.generate(batch, attention_mask=torch.ones_like(batch), max_new_tokens=NEW_TOKENS,
                                        min_new_tokens=NEW_TOKENS, do_sample=sample, temperature=0.8 if sample else None,
                                        top_k=0, top_p=1.0, pad_token_id=0)  # fmt: skip
            out.append(generated[:, : PROMPT_LEN + NEW_TOKENS])
    return torch.cat(out)


def target_states(target, x):
    with torch.no_grad(), torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=x.is_cuda):
        states = target(x, output_hidden_states=True).hidden_states
    features = torch.cat([states[i + 1] for i in TARGET_LAYER_IDS], -1).float()
    return features, states[-1].float()


def block_batch(x, features, block: int, anchors_per_seq: int, mask_id: int, embed, gen):
    """Anchors inside the generated part, block inputs [anchor, mask...] and their positions."""
    b, s = x.shape
    low, high = PROMPT_LEN - 1, s - block - 1
    anchors = torch.randint(low, high, (b, anchors_per_seq), generator=gen).to(x.device)
    offsets = torch.arange(block, device=x.device)
    positions = anchors[..., None] + offsets
    tokens = torch.full_like(positions, mask_id)
    tokens[..., 0] = torch.gather(x, 1, anchors)
    return anchors, positions, embed(tokens)


def dflash_loss(model, x, target, embed, head, kind: str, block: int, gen):
    features, _ = target_states(target, x)
    anchors, positions, blocks = block_batch(x, features, block, 32, 3, embed, gen)
    hidden = model(features, blocks.float(), positions, anchors)
    labels_at = positions[..., 1:] if kind != "dspark" else positions + 1
    labels = torch.gather(x, 1, labels_at.flatten(1)).view(labels_at.shape)
    if kind == "dspark":
        logits = head(hidden).float()
        previous = torch.gather(x, 1, positions.flatten(1)).view(positions.shape)  # teacher-forced chain
        logits = logits + model.markov_w2(model.markov_w1(previous)).float()
        weights = torch.exp(-torch.arange(block, device=x.device) / 4.0)
    else:
        logits = head(hidden[..., 1:, :]).float()
        weights = torch.exp(-torch.arange(block - 1, device=x.device) / 4.0)
    ce = F.cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="none").view(labels.shape)
    return (ce * weights).sum() / (weights.sum() * labels.shape[0] * labels.shape[1])


def mtp_loss(model, x, target, embed, head):
    _, final = target_states(target, x)
    out = model(final[:, :-2], embed(x[:, 1:-1]).float())
    logits = head(model.norm(out)).float()
    return F.cross_entropy(logits.flatten(0, 1), x[:, 2:].flatten())


def train(name: str, model: nn.Module, loss_fn, data: torch.Tensor, steps: int, minutes: float, seed: int) -> dict:
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3, betas=(0.9, 0.95),
                            weight_decay=0.01)  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    start, done, loss = time.time(), 0, torch.tensor(0.0)
    for step in range(steps):
        if time.time() - start > minutes * 60:
            break
        for group in opt.param_groups:
            warm = max(1, steps // 20)
            group["lr"] = 2e-3 * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        idx = torch.randint(0, len(data), (16,), generator=gen)
        loss = loss_fn(data[idx], gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done = step + 1
        if step % 200 == 0:
            print(f"[{name}] step {step} loss {loss.item():.4f} {time.time() - start:.0f}s", flush=True)
    return {"steps_planned": steps, "steps_done": done, "seconds": round(time.time() - start, 1),
            "final_loss": round(loss.item(), 4)}  # fmt: skip


def config_for(name: str, kind: str, layers: int, block: int, extra: dict, vocab: int, target_layers: int) -> dict:
    base = {**SHAPE, "num_hidden_layers": layers, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": vocab,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", **extra}  # fmt: skip
    if kind == "mtp":
        return {**base, "architectures": ["MtpDraftHead"], "model_type": "qwen3",
                "mtp_config": {"depth": 3, "num_nextn_predict_layers": 1}}  # fmt: skip
    dflash = {"mask_token_id": 3, "target_layer_ids": TARGET_LAYER_IDS, "block_size": block}
    identity = {
        "dflash": {"architectures": ["DFlashDraftModel"], "model_type": "qwen3"},
        "dspark": {"architectures": ["Lfm2DSparkDraftModel"], "model_type": "qwen3", "markov_head_type": "vanilla"},
        "muse": {"architectures": ["MuseGlimmerAssistantModel"], "model_type": "muse_glimmer_assistant"},
    }[kind]
    return {**base, **identity, "block_size": block, "num_target_layers": target_layers, "dflash_config": dflash}


def main() -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sequences", type=int, default=6144)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--minutes", type=float, default=1.6, help="time cap per drafter; recorded")
    p.add_argument("--only", nargs="*", default=list(DRAFTERS))
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(SEED)
    t0 = time.time()
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    target = Qwen3ForCausalLM.from_pretrained(args.target, dtype=torch.bfloat16).to(device).eval().requires_grad_(False)
    embed, head = target.model.embed_tokens, target.lm_head if not target.config.tie_word_embeddings else None
    head = head or (lambda h: F.linear(h, embed.weight.float()))
    data = generate_data(target, tokenizer, device, args.sequences, SEED)
    print(f"data: {tuple(data.shape)} in {time.time() - t0:.0f}s", flush=True)
    vocab, n_layers = target.config.vocab_size, target.config.num_hidden_layers
    metrics = {"seed": SEED, "sequences": len(data), "torch": torch.__version__, "device": device}
    for name in args.only:
        kind, layers, block, extra = DRAFTERS[name]
        torch.manual_seed(SEED + len(name))
        if kind == "mtp":
            cfg = Qwen3Config(**SHAPE, num_hidden_layers=1, vocab_size=vocab, rms_norm_eps=1e-6, rope_theta=10000.0,
                              max_position_embeddings=4096, attn_implementation="sdpa")  # fmt: skip
            model = MtpHead(cfg).to(device)
            run = train(name, model, lambda x, g, m=model: mtp_loss(m, x, target, embed, head), data, args.steps,
                        args.minutes, SEED)  # fmt: skip
        else:
            model = DFlashDrafter(layers, vocab, extra.get("markov_rank", 0)).to(device)

            def loss_fn(x, g, m=model, k=kind, b=block):
                # The Muse assistant runs at its declared 4 rows and widens to 8: train both.
                rows = (4, 8)[int(torch.randint(0, 2, (1,), generator=g))] if k == "muse" else b
                return dflash_loss(m, x, target, embed, head, k, rows, g)

            run = train(name, model, loss_fn, data, args.steps, args.minutes, SEED)
        out = args.out / name
        out.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()
                 if not k.startswith("rotary")}  # fmt: skip
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        config = config_for(name, kind, layers, block, extra, vocab, n_layers)
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        metrics[name] = run
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(json.dumps(metrics, indent=2))


if __name__ == "__main__":
    main()
