"""Chained training of the MTP head for its declared depth, in MLX on the CPU.

The head drafts `depth` tokens by feeding itself: its first proposal reads the target's final
hidden state, every later one reads the head's own previous output (app/drafters/block.py,
`MtpDrafter.propose`). `train_block_drafters.py` trained only the first step, so steps 2 and 3
ran untrained recursion. This fine-tunes that depth-1 head (models/mtp as of d1ceab6) on all
`depth` steps at once, each step's input being the head's own previous output, with gradients
through the chain; it also records the run as `mtp_chained` in models/block-drafters-metrics.json:

    mkdir -p /tmp/mtp-depth1 && for f in config.json model.safetensors; do
      git show d1ceab6:models/mtp/$f > /tmp/mtp-depth1/$f; done
    python -m ops.models.train_mtp_chained --drafter /tmp/mtp-depth1 --out models/mtp

About 20 minutes on the shared 2-core development machine, half of it generating the data
(`--data FILE` keeps the data for a rerun). Seeded throughout (data, sampling keys, batch order;
MLX on the CPU): two runs generated the same data. Data: 32-token
windows of this interpreter's stdlib sources continued by the embedded target for 96 tokens,
half greedily and half sampled at T 0.8, so the head learns what the target says.

Attention reproduces what the round loop's head cache holds when it drafts: a step-d query at
position j sees the decided entries (step 1) at positions <= j - d + 1 and, at each position
between that and j, the entry of the chain step that was drafted there. Every step's loss
counts from the first position where its chain is whole; the token inputs are the target's
tokens (a later step is only ever tested after the earlier drafts were accepted, i.e. equal).
"""

from __future__ import annotations

# isort: off
import ops.bench.common  # noqa: F401 - first: sets up MLX's BLAS

# isort: on
import argparse
import json
import math
import random
import sysconfig
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from app.drafters.block import load_block_drafter
from app.loading import EMBEDDED_TARGET
from app.execution.model import LoadedModel, load_model
from ops.bench.common import REPO_ROOT

SEED = 20261201
PROMPT_LEN, NEW_TOKENS = 32, 96
SAMPLE_TEMPERATURE = 0.8
GENERATE_BATCH = 64
HELD_OUT = 32  # greedy sequences (of the first batch) kept for the teacher-forced acceptance
MAX_SOURCE_BYTES = 256 * 1024


class DepthStack:
    """Stands in for the head's KV cache during training: step d's attention reads the keys and
    values of steps 1..d (appended in order), all at their true rotary positions (offset 0)."""

    offset = 0

    def __init__(self) -> None:
        self.keys: list[mx.array] = []
        self.values: list[mx.array] = []

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        self.keys.append(keys)
        self.values.append(values)
        return mx.concatenate(self.keys, axis=2), mx.concatenate(self.values, axis=2)


def chain_mask(length: int, step: int) -> mx.array:
    """Visibility [length, step * length] of step `step`'s queries over the keys of steps 1..step."""
    j = mx.arange(length)[:, None]
    m = mx.arange(length)[None, :]
    blocks = [m <= j - step + 1] + [m == j - step + e for e in range(2, step + 1)]
    return mx.concatenate(blocks, axis=1)


def chained_outputs(head, hidden: mx.array, embedded: mx.array, depth: int) -> list[mx.array]:
    """The head's outputs of each chain step at every position `[B, L, H]`; step d at position j
    reads step d-1's output at j-1 (step 1 reads the target's hidden at j)."""
    stack, outputs, inputs = DepthStack(), [], hidden
    length = hidden.shape[1]
    for step in range(1, depth + 1):
        out = head(inputs, embedded, stack, mask=chain_mask(length, step))
        outputs.append(out)
        inputs = mx.concatenate([hidden[:, :1], out[:, :-1]], axis=1)  # position 0: never read (see mask)
    return outputs


def stdlib_token_stream(tokenizer, seed: int) -> list[int]:
    """This interpreter's stdlib sources (sorted, UTF-8, at most 256 KB each), shuffled, tokenized."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for path in sorted(root.rglob("*.py")):
        raw = path.read_bytes()
        if len(raw) <= MAX_SOURCE_BYTES:
            try:
                texts.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                continue
    random.Random(seed).shuffle(texts)
    stream: list[int] = []
    for text in texts[:1500]:
        stream.extend(tokenizer.encode(text))
    return stream


def generate_data(target: LoadedModel, sequences: int, seed: int) -> mx.array:
    """Corpus windows continued by the target: `[N, PROMPT_LEN + NEW_TOKENS]` token ids."""
    stream = stdlib_token_stream(target.tokenizer, seed)
    rng = random.Random(seed)
    starts = [rng.randrange(0, len(stream) - PROMPT_LEN) for _ in range(sequences)]
    prompts = mx.array([stream[s : s + PROMPT_LEN] for s in starts])
    key = mx.random.key(seed)
    out = []
    for b, first in enumerate(range(0, sequences, GENERATE_BATCH)):
        tokens = prompts[first : first + GENERATE_BATCH]
        cache = make_prompt_cache(target.model)
        logits = target.model(tokens, cache=cache)[:, -1]
        rows = [tokens]
        for _ in range(NEW_TOKENS):
            if b % 2:
                key, sub = mx.random.split(key)
                nxt = mx.random.categorical(logits / SAMPLE_TEMPERATURE, key=sub)
            else:
                nxt = mx.argmax(logits, axis=-1)
            rows.append(nxt[:, None])
            logits = target.model(nxt[:, None], cache=cache)[:, -1]
            mx.eval(logits)
        out.append(mx.concatenate(rows, axis=1))
        print(f"data: batch {b + 1} of {math.ceil(sequences / GENERATE_BATCH)}", flush=True)
    return mx.concatenate(out)


def final_hidden(target: LoadedModel, data: mx.array) -> mx.array:
    """The target's final normed hidden state of every position (what the head reads)."""
    parts = []
    for first in range(0, data.shape[0], 64):
        parts.append(target.model.model(data[first : first + 64]))
        mx.eval(parts[-1])
    return mx.concatenate(parts)


def losses(head, lm_head, embed, hidden: mx.array, tokens: mx.array, depth: int) -> list[mx.array]:
    """Cross-entropy of each chain step on the generated labels. Step d at position j predicts
    tokens[j + 2] from (chain input, tokens[j + 1]) and is whole from j = d - 1."""
    outputs = chained_outputs(head, hidden[:, :-2], embed(tokens[:, 1:-1]), depth)
    first = PROMPT_LEN - 2  # labels from the first generated token on
    labels = tokens[:, first + 2 :]
    return [nn.losses.cross_entropy(lm_head(head.norm(out[:, first:])), labels, reduction="mean") for out in outputs]


def accuracies(head, lm_head, embed, hidden: mx.array, tokens: mx.array, depth: int) -> list[float]:
    """Teacher-forced acceptance per step: P(step d right | steps 1..d-1 right), greedy labels."""
    outputs = chained_outputs(head, hidden[:, :-2], embed(tokens[:, 1:-1]), depth)
    first = PROMPT_LEN - 2
    labels = tokens[:, first + 2 :]
    right = [mx.argmax(lm_head(head.norm(out[:, first:])), axis=-1) == labels for out in outputs]
    # Step d at position j drafts tokens[j + 2] after step d-1 drafted tokens[j + 1] at j - 1.
    chain, rates = None, []
    for d, hit in enumerate(right):
        whole = hit[:, d:]
        if chain is None:
            chain_now, tested = whole, mx.ones_like(whole)
        else:
            tested = chain[:, : whole.shape[1]]
            chain_now = tested & whole
        rates.append(float(chain_now.sum().item() / max(1, tested.sum().item())))
        chain = chain_now
    return rates


def main() -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--drafter", type=Path, required=True, help="the depth-1 head to start from")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sequences", type=int, default=384)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--metrics", type=Path, default=REPO_ROOT / "models" / "block-drafters-metrics.json",
                   help="JSON file whose `mtp_chained` entry records this run")  # fmt: skip
    p.add_argument("--data", type=Path, help="token data: read if it exists, else generated and written here")
    p.add_argument("--lr", type=float, default=5e-4)
    args = p.parse_args()
    mx.random.seed(SEED)
    started = time.time()
    target = load_model(EMBEDDED_TARGET)
    bound = load_block_drafter(args.drafter, target)
    head, depth = bound.module, bound.declared_width - 1
    embed, lm_head = bound.taps.embed_tokens, bound.taps.lm_head
    if args.data and args.data.exists():
        data = mx.load(str(args.data))["tokens"]
    else:
        data = generate_data(target, args.sequences, SEED)
        if args.data:
            mx.savez(str(args.data), tokens=data)
    hidden = final_hidden(target, data)
    held = slice(0, HELD_OUT)  # the first batch is greedy
    train_rows = list(range(HELD_OUT, data.shape[0]))
    print(f"data: {tuple(data.shape)} in {time.time() - started:.0f}s", flush=True)
    before = accuracies(head, lm_head, embed, hidden[held], data[held], depth)
    print(f"teacher-forced acceptance per step before: {before}", flush=True)

    def loss_fn(h: mx.array, x: mx.array) -> mx.array:
        return sum(losses(head, lm_head, embed, h, x, depth)) / depth

    step_loss = nn.value_and_grad(head, loss_fn)
    warm = max(1, args.steps // 20)
    schedule = optim.join_schedules(
        [optim.linear_schedule(args.lr / warm, args.lr, warm), optim.cosine_decay(args.lr, args.steps, args.lr * 0.1)],
        [warm],
    )
    opt = optim.AdamW(learning_rate=schedule, betas=[0.9, 0.95], weight_decay=0.01)
    order = random.Random(SEED + 1)
    trained = time.time()
    loss = mx.array(0.0)
    for step in range(args.steps):
        idx = mx.array(order.sample(train_rows, args.batch))
        loss, grads = step_loss(hidden[idx], data[idx])
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        opt.update(head, grads)
        mx.eval(head.parameters(), opt.state, loss)
        if step % 25 == 0:
            print(f"step {step} loss {loss.item():.4f} {time.time() - trained:.0f}s", flush=True)
    after = accuracies(head, lm_head, embed, hidden[held], data[held], depth)
    print(f"teacher-forced acceptance per step after: {after}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.astype(mx.bfloat16) for k, v in tree_flatten(head.parameters())}
    mx.save_safetensors(str(args.out / "model.safetensors"), weights, metadata={"format": "pt"})
    config = json.loads((args.drafter / "config.json").read_text())
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    metrics = {
        "seed": SEED,
        "sequences": int(data.shape[0]),
        "prompt_tokens": PROMPT_LEN,
        "generated_tokens": NEW_TOKENS,
        "device": str(mx.default_device()),
        "mlx": mx.__version__,
        "depth": depth,
        "steps": args.steps,
        "batch": args.batch,
        "lr": args.lr,
        "seconds": round(time.time() - started, 1),
        "final_loss": round(loss.item(), 4),
        "teacher_forced_acceptance_per_depth_before": [round(r, 3) for r in before],
        "teacher_forced_acceptance_per_depth_after": [round(r, 3) for r in after],
    }
    print(json.dumps(metrics, indent=2))
    recorded = json.loads(args.metrics.read_text()) if args.metrics.exists() else {}
    args.metrics.write_text(json.dumps(recorded | {"mtp_chained": metrics}, indent=2) + "\n")


if __name__ == "__main__":
    main()
