"""Build models: `pair` trains the embedded default pair, `tiny` writes a random-weight model.

    python ops/models/build.py pair --out /tmp/pair        # torch + transformers (GPU: minutes)
    python ops/models/build.py tiny --out /tmp/tiny [--model-type llama] [--layers 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("pair", allow_abbrev=False, help="train the embedded pair (arguments: see train_default_pair.py)")
    tiny = commands.add_parser("tiny", allow_abbrev=False, help="random-weight model sharing the embedded tokenizer")
    tiny.add_argument("--out", type=Path, required=True)
    tiny.add_argument("--model-type", default="qwen3", choices=["qwen3", "llama", "mamba"])
    tiny.add_argument("--layers", type=int, default=2)
    tiny.add_argument("--hidden", type=int, default=64)
    tiny.add_argument("--seed", type=int, default=0)
    args, rest = parser.parse_known_args()
    if args.command == "pair":
        from ops.models import train_default_pair  # needs torch, only here

        sys.argv = [sys.argv[0], *rest]
        train_default_pair.main()
        return
    from ops.models.tiny import build_tiny_model

    print(build_tiny_model(args.out, model_type=args.model_type, layers=args.layers, hidden=args.hidden,
                           seed=args.seed))


if __name__ == "__main__":
    main()
