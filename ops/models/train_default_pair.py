"""Train the embedded default pair (target + distilled drafter) with torch and transformers.

Everything that decides the result is in this file: the corpus rule, the tokenizer, both
architectures, the seeds and the step counts. Run it on a machine with torch, transformers and
tokenizers (an NVIDIA GPU makes it take minutes; CPU works for the `--smoke` sizes):

    python ops/models/train_default_pair.py --out /tmp/pair

It writes `<out>/target`, `<out>/drafter` (Qwen3 checkpoints that `mlx_lm.load` reads
unchanged, weights in bfloat16) and `<out>/metrics.json`.

Corpus: every `*.py` file under the training interpreter's stdlib and site-packages, decoded as
UTF-8, deduplicated by content, at most 256 KB each, sorted by path, capped at `--corpus-mb`.
One file in a hundred (by content hash) is held out for validation. Instruction samples in the
ChatML format are built from functions that carry a docstring, so chat routes answer in shape.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import os
import random
import sys
import sysconfig
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MAX_FILE_BYTES = 256 * 1024
HELD_OUT_PER_MILLE = 10

# Architecture of the pair: depth is what costs on a CPU, so the drafter is shallow.
TARGET_SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=14)
DRAFTER_SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2)
SMOKE_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--roots", nargs="*", type=Path, help="corpus roots (default: stdlib + site-packages)")
    p.add_argument("--corpus-mb", type=int, default=256)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--target-steps", type=int, default=2000)
    p.add_argument("--drafter-steps", type=int, default=2500)
    p.add_argument("--target-minutes", type=float, default=4.0, help="time cap; stops early and records it")
    p.add_argument("--drafter-minutes", type=float, default=2.5, help="time cap; stops early and records it")
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--smoke", action="store_true", help="tiny shapes for a CPU check of the pipeline")
    return p.parse_args()


def default_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    return sorted({Path(paths[k]) for k in ("stdlib", "purelib", "platlib")})


def read_source(path: Path) -> str | None:
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if len(raw) > MAX_FILE_BYTES or b"\0" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def collect_corpus(roots: list[Path], cap_bytes: int) -> list[tuple[str, str]]:
    """Deduplicated (relative path, text) pairs, sorted by path, up to cap_bytes."""
    files = sorted({p for root in roots for p in root.rglob("*.py") if p.is_file()})
    seen: set[str] = set()
    docs: list[tuple[str, str]] = []
    total = 0
    for path in files:
        text = read_source(path)
        if not text or not text.strip():
            continue
        digest = hashlib.sha1(text.encode()).hexdigest()
        if digest in seen:
            continue
        seen.add(digest)
        docs.append((str(path), text))
        total += len(text)
        if total >= cap_bytes:
            break
    return docs


def is_held_out(text: str) -> bool:
    return int(hashlib.sha1(text.encode()).hexdigest()[:8], 16) % 1000 < HELD_OUT_PER_MILLE


def instruction_samples(text: str) -> list[str]:
    """ChatML samples built from documented top-level functions of one file."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return []
    samples = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        doc = ast.get_docstring(node)
        source = ast.get_source_segment(text, node)
        if not doc or not doc.strip() or not source or len(source) > 2000:
            continue
        ask = f"Write a Python function `{node.name}`: {doc.strip().splitlines()[0]}"
        samples.append(f"<|im_start|>user\n{ask}<|im_end|>\n<|im_start|>assistant\n{source}<|im_end|>\n")
    return samples


def train_tokenizer(texts: list[str], vocab: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|endoftext|>", "<|MASK|>"],
    )
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.model_max_length = 4096
    return wrapped


def encode_stream(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    ids: list[int] = []
    for i in range(0, len(texts), 512):
        for enc in tokenizer.backend_tokenizer.encode_batch(texts[i : i + 512]):
            ids.extend(enc.ids)
            ids.append(eot)
    return torch.tensor(ids, dtype=torch.int32)


def model_config(tokenizer: PreTrainedTokenizerFast, shape: dict) -> Qwen3Config:
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    return Qwen3Config(
        vocab_size=len(tokenizer),
        num_attention_heads=max(1, shape["hidden_size"] // 64),
        num_key_value_heads=max(1, shape["hidden_size"] // 128),
        head_dim=64 if shape["hidden_size"] >= 64 else shape["hidden_size"],
        max_position_embeddings=4096,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
        attn_implementation="sdpa",
        **shape,
    )


def batches(stream: torch.Tensor, seq: int, batch: int, seed: int, device: str):
    gen = torch.Generator().manual_seed(seed)
    stream = stream.to(device)
    while True:
        starts = torch.randint(0, len(stream) - seq - 1, (batch,), generator=gen).to(device)
        idx = starts[:, None] + torch.arange(seq + 1, device=device)[None, :]
        yield stream[idx].long()


def lr_at(step: int, steps: int, peak: float) -> float:
    warm = max(1, steps // 20)
    if step < warm:
        return peak * (step + 1) / warm
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm))))


def train(model, loss_fn, data, steps: int, peak_lr: float, max_minutes: float, label: str) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    start, done, loss = time.time(), 0, torch.tensor(0.0)
    for step in range(steps):
        if time.time() - start > max_minutes * 60:
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, peak_lr)
        with torch.autocast(device_type=model.device.type, dtype=torch.bfloat16):
            loss = loss_fn(next(data))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done = step + 1
        if step % 200 == 0:
            print(f"[{label}] step {step} loss {loss.item():.4f} {time.time() - start:.0f}s", flush=True)
    return {"steps_planned": steps, "steps_done": done, "seconds": round(time.time() - start, 1),
            "final_loss": round(loss.item(), 4)}


@torch.no_grad()
def evaluate(target, drafter, stream: torch.Tensor, seq: int, device: str) -> dict:
    target.eval()
    drafter.eval()
    windows = stream[: (len(stream) // (seq + 1)) * (seq + 1)].view(-1, seq + 1)[:64].to(device).long()
    if len(windows) == 0:
        return {"val_tokens": 0}
    ce_t = ce_d = agree = n = 0.0
    for row in windows.split(16):
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            lt = target(row[:, :-1]).logits.float()
            ld = drafter(row[:, :-1]).logits.float()
        ce_t += F.cross_entropy(lt.flatten(0, 1), row[:, 1:].flatten(), reduction="sum").item()
        ce_d += F.cross_entropy(ld.flatten(0, 1), row[:, 1:].flatten(), reduction="sum").item()
        agree += (lt.argmax(-1) == ld.argmax(-1)).sum().item()
        n += row[:, 1:].numel()
    return {"val_ppl_target": round(math.exp(ce_t / n), 3), "val_ppl_drafter": round(math.exp(ce_d / n), 3),
            "teacher_forced_top1_agreement": round(agree / n, 4), "val_tokens": int(n)}


def save(model, tokenizer, path: Path) -> None:
    model.to(torch.bfloat16).save_pretrained(path, max_shard_size="15MB")
    tokenizer.save_pretrained(path)


def main() -> None:
    args = parse_args()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = True
    t0 = time.time()
    roots = args.roots or default_roots()
    docs = collect_corpus(roots, args.corpus_mb * 1024 * 1024)
    train_docs = [t for _, t in docs if not is_held_out(t)]
    val_docs = [t for _, t in docs if is_held_out(t)]
    with ProcessPoolExecutor(max(1, min(16, os.cpu_count() or 1))) as pool:
        chat = [s for found in pool.map(instruction_samples, train_docs[:20000], chunksize=64) for s in found]
    print(f"corpus: {len(docs)} files, {sum(map(len, train_docs)) / 1e6:.1f} MB train, "
          f"{len(val_docs)} held out, {len(chat)} instruction samples ({time.time() - t0:.0f}s)", flush=True)

    tokenizer = train_tokenizer(train_docs[:: max(1, len(train_docs) // 2000)] + chat[:2000], args.vocab)
    train_texts = train_docs + chat
    random.Random(args.seed).shuffle(train_texts)
    stream = encode_stream(tokenizer, train_texts)
    val_stream = encode_stream(tokenizer, val_docs)
    print(f"tokens: {len(stream) / 1e6:.1f}M train, {len(val_stream) / 1e6:.2f}M val ({time.time() - t0:.0f}s)",
          flush=True)

    t_shape = SMOKE_SHAPE if args.smoke else TARGET_SHAPE
    d_shape = dict(SMOKE_SHAPE, num_hidden_layers=1) if args.smoke else DRAFTER_SHAPE
    target = Qwen3ForCausalLM(model_config(tokenizer, t_shape)).to(device)
    data = batches(stream, args.seq, args.batch, args.seed, device)

    def lm_loss(x: torch.Tensor) -> torch.Tensor:
        logits = target(x[:, :-1]).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten())

    t_run = train(target, lm_loss, data, args.target_steps, 3e-3, args.target_minutes, "target")
    target.eval().requires_grad_(False)
    save(target, tokenizer, args.out / "target")

    torch.manual_seed(args.seed + 1)
    drafter = Qwen3ForCausalLM(model_config(tokenizer, d_shape)).to(device)
    drafter.model.embed_tokens.weight.data.copy_(target.model.embed_tokens.weight.data)
    data = batches(stream, args.seq, args.batch, args.seed + 1, device)

    def distill_loss(x: torch.Tensor) -> torch.Tensor:
        # Forward KL to the frozen target's next-token distribution: what acceptance rewards.
        with torch.no_grad():
            teacher = target(x[:, :-1]).logits.float().log_softmax(-1)
        student = drafter(x[:, :-1]).logits.float().log_softmax(-1)
        return F.kl_div(student.flatten(0, 1), teacher.flatten(0, 1), log_target=True, reduction="batchmean")

    d_run = train(drafter, distill_loss, data, args.drafter_steps, 3e-3, args.drafter_minutes, "drafter")
    metrics = {"corpus_files": len(docs), "corpus_train_mb": round(sum(map(len, train_docs)) / 1e6, 1),
               "held_out_files": len(val_docs), "instruction_samples": len(chat),
               "train_tokens": len(stream), "device": device, "torch": torch.__version__,
               "python": sys.version.split()[0], "seed": args.seed, "seq": args.seq, "batch": args.batch,
               "target_run": t_run, "drafter_run": d_run,
               **evaluate(target, drafter, val_stream, args.seq, device)}
    print(json.dumps(metrics, indent=2), flush=True)
    save(drafter, tokenizer, args.out / "drafter")
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")


if __name__ == "__main__":
    main()
