"""The sampler chain: which stages run on a row's logits, in which order (llama-server's `samplers`).

As in llama-server, the chain is the list: the stages it names run in its order (a name twice runs
twice), a stage it leaves out does not run whatever its parameters say, and a name it does not know
is skipped. llama-server reads a list of stage names (`["top_k", "min_p", "temperature"]`, its
canonical names only: a list written for older builds, naming `tfs_z` or `typical_p`, skips those)
or a string of letters (`"kmt"`). Token bias always runs first; mirostat, when on, replaces the
chain with temperature then mirostat (app/sampling/pipeline.py). Pure Python: no MLX.
"""

from __future__ import annotations

from typing import Any

# llama-server's default chain, which is also this server's default
DEFAULT = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
# Stages llama-server knows that change nothing here: `adaptive_p` replaces the final draw only
# when `adaptive_target` is set, which app/server/core/field_policy.py refuses (a negative target
# disables it in llama-server too).
NEUTRAL = frozenset({"adaptive_p"})
# Stages llama-server knows that this server cannot run, and why: naming one answers 400, since
# leaving it out would change the distribution the request asked for. (None now: `infill` runs,
# app/sampling/infill.py.)
UNSUPPORTED: dict[str, str] = {}
# Stages that run only where a chain names them (llama-server's default chain leaves them out)
OPTIONAL = frozenset({"infill"})
NAMES = frozenset(DEFAULT) | NEUTRAL | OPTIONAL | frozenset(UNSUPPORTED)
LETTERS = {"e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p", "p": "top_p"}
LETTERS |= {"m": "min_p", "x": "xtc", "t": "temperature", "i": "infill", "a": "adaptive_p"}
# The other spellings llama-server's command line (`--samplers`, not a request's list) reads
ALIASES = {"top-k": "top_k", "top-p": "top_p", "nucleus": "top_p", "top-n-sigma": "top_n_sigma", "min-p": "min_p"}
ALIASES |= {"typical-p": "typ_p", "typical": "typ_p", "typ-p": "typ_p", "typ": "typ_p", "temp": "temperature"}
ALIASES |= {"adaptive-p": "adaptive_p"}


class ChainError(ValueError):
    """A chain naming a stage this server cannot run."""


def parse(value: Any) -> tuple[str, ...] | None:
    """The chain a `samplers` value names (None: the value is neither a list nor a string, and
    the default chain runs, as llama-server keeps its default for any other JSON value)."""
    if isinstance(value, str):
        names = [LETTERS[letter] for letter in value if letter in LETTERS]
    elif isinstance(value, list):
        names = [name for name in value if isinstance(name, str) and name in NAMES]
    else:
        return None
    unsupported = [name for name in names if name in UNSUPPORTED]
    if unsupported:
        raise ChainError(f"{unsupported[0]}: {UNSUPPORTED[unsupported[0]]}")
    return tuple(name for name in names if name not in NEUTRAL)


def from_flag(value: str, letters: bool = False) -> list[str]:
    """The chain of llama-server's `--samplers a;b;c` (its aliases read too) or `--sampling-seq abc`,
    for the profile key `sampling.samplers`; a name or letter it does not know is an error here,
    where a typo would otherwise leave a stage out of every request."""
    parts = list(value) if letters else [part for part in value.split(";") if part]
    table = LETTERS if letters else {name: name for name in NAMES} | ALIASES
    unknown = [part for part in parts if part not in table]
    if unknown:
        known = "".join(LETTERS) if letters else ", ".join(sorted(NAMES))
        raise ChainError(f"unknown sampler {unknown[0]!r} (known: {known})")
    names = [table[part] for part in parts]
    if unsupported := [name for name in names if name in UNSUPPORTED]:
        raise ChainError(f"{unsupported[0]}: {UNSUPPORTED[unsupported[0]]}")
    return [name for name in names if name not in NEUTRAL]
