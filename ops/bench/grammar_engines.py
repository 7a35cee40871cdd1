"""Grammar engines compared: per-token mask time for one JSON schema on the embedded tokenizer.

Both engines (llguidance, xgrammar) compile the same schema over models/target's tokenizer, then
walk the same valid token path, computing the next-token mask before each token. Reported:
compile time, mean and p99 mask time per token, and a rollback round (consume 4, roll back 4).
xgrammar needs torch at import; run it with torch on PYTHONPATH or it is reported as missing.

    python -m ops.bench.grammar_engines [--tokens N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from transformers import AutoTokenizer

REPO_ROOT = Path(__file__).resolve().parents[2]
TARGET = REPO_ROOT / "models" / "target"

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "tags", "address"],
}
DOCUMENT = {
    "name": "Ada Lovelace",
    "age": 36,
    "tags": ["math", "engine", "poetry"],
    "address": {"city": "London", "zip": "W1"},
}


def measured(mask: Callable[[], object], consume: Callable[[int], object], path: list[int]) -> list[float]:
    """Seconds per mask along `path`, consuming each token after its mask."""
    times = []
    for token in path:
        start = time.perf_counter()
        mask()
        times.append(time.perf_counter() - start)
        consume(token)
    return times


def llguidance_arm(hf_tokenizer: object, vocab: int, path: list[int]) -> dict:
    import llguidance
    import llguidance.hf
    import llguidance.numpy

    tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab)
    start = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults={"whitespace_flexible": False})
    matcher = llguidance.LLMatcher(tokenizer, grammar)
    compile_s = time.perf_counter() - start
    bitmask = llguidance.numpy.allocate_token_bitmask(1, vocab)
    times = measured(lambda: llguidance.numpy.fill_next_token_bitmask(matcher, bitmask, 0), matcher.consume_token, path)
    assert not matcher.is_error(), matcher.get_error()
    start = time.perf_counter()
    matcher.rollback(4)
    rollback_s = time.perf_counter() - start
    return {"compile_s": compile_s, "mask_s": times, "rollback_s": rollback_s, "version": llguidance.__version__}


def xgrammar_arm(hf_tokenizer: object, vocab: int, path: list[int]) -> dict:
    import xgrammar

    info = xgrammar.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab)
    start = time.perf_counter()
    compiler = xgrammar.GrammarCompiler(info)
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    matcher = xgrammar.GrammarMatcher(compiled, max_rollback_tokens=16)
    compile_s = time.perf_counter() - start
    bitmask = xgrammar.allocate_token_bitmask(1, vocab)
    times = measured(lambda: matcher.fill_next_token_bitmask(bitmask), matcher.accept_token, path)
    start = time.perf_counter()
    matcher.rollback(4)
    rollback_s = time.perf_counter() - start
    return {"compile_s": compile_s, "mask_s": times, "rollback_s": rollback_s, "version": "0.2.8"}


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    hf_tokenizer = AutoTokenizer.from_pretrained(TARGET)
    vocab = json.loads((TARGET / "config.json").read_text())["vocab_size"]
    path = hf_tokenizer.encode(json.dumps(DOCUMENT, separators=(",", ":")), add_special_tokens=False)
    print(f"vocab {vocab}, path {len(path)} tokens, {args.repeats} repeats")
    for name, arm in (("llguidance", llguidance_arm), ("xgrammar", xgrammar_arm)):
        try:
            runs = [arm(hf_tokenizer, vocab, path) for _ in range(args.repeats)]
        except ImportError as missing:
            print(f"{name}: not importable ({missing})")
            continue
        masks = sorted(t for run in runs for t in run["mask_s"])
        print(
            f"{name} {runs[0]['version']}: compile {statistics.median(r['compile_s'] for r in runs) * 1e3:.2f} ms, "
            f"mask mean {statistics.fmean(masks) * 1e6:.1f} us, median {statistics.median(masks) * 1e6:.1f} us, "
            f"p99 {masks[int(len(masks) * 0.99)] * 1e6:.1f} us, "
            f"rollback(4) {statistics.median(r['rollback_s'] for r in runs) * 1e6:.1f} us"
        )


if __name__ == "__main__":
    main()
