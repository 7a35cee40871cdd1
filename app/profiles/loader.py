"""Resolving a profile: TOML file < MLXCEL_* environment < command-line flags.

The result is one validated `Settings` plus where each value came from. Any problem stops
startup with one message naming where the value came from (file and key, environment variable
or flag) and the fix (`ProfileError`, exit code 2).
Relative model paths in a profile are relative to the profile file; on the command line and in
the environment they are relative to the working directory.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import msgspec

from app.loading import gguf
from app.loading.adapter import layout_problem
from app.loading.builtin_templates import BUILTIN_TEMPLATES
from app.loading.chat_template import RESERVED_TEMPLATE_KEYS
from app.loading.checkpoint import ModelLoadError
from app.loading.hub import cached_model, is_repo_id
from app.loading.paths import REPO_ROOT
from app.profiles.schema import (
    ENV_OVERRIDES,
    DrafterKindName,
    GovernorPolicyName,
    LogLevelName,
    PoolingName,
    ReasoningFormatName,
    Settings,
)
from app.profiles.tenants import read_key_file
from app.runtime.logging import destination_problem
from app.sampling import chain

PROFILES_DIR = REPO_ROOT / "profiles"
DEFAULT_PROFILE = "default"
ENV_PREFIX = "MLXCEL"
PATH_KEYS = (
    "target.model",
    "drafter.model",
    "logging.destination",
    "server.chat_template_file",
    "server.api_key_file",
    "target.adapter_path",
    "router.models_dir",
)


@dataclass(frozen=True)
class Flag:
    """A flag that sets a settings key, in llama-server's spellings (the first is the one named)."""

    names: tuple[str, ...]
    key: str
    help: str
    options: dict[str, Any] = field(default_factory=dict)  # argparse's: a type and metavar, or a const

    @property
    def dest(self) -> str:
        return next(n for n in self.names if n.startswith("--")).lstrip("-").replace("-", "_")


def _samplers(letters: bool) -> Any:
    """An argparse type reading a sampler chain (app/sampling/chain.py) into its list of names."""

    def read(value: str) -> list[str]:
        try:
            return chain.from_flag(value, letters)
        except chain.ChainError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    return read


def _json_object(value: str) -> dict[str, Any]:
    try:
        found = json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(found, dict):
        raise argparse.ArgumentTypeError("expected a JSON object, e.g. '{\"enable_thinking\": false}'")
    return found


SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def _mebibytes(value: str) -> int:
    """A size as mlx_lm.server writes one (bytes, or 512MB, 2GB), in whole MiB (rounded up)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"{value!r}: expected bytes, or a size such as 512MB or 2GB")
    return math.ceil(float(match.group(1)) * SIZE_UNITS[unit] / (1 << 20))


def _log_level(value: str) -> str:
    level = {"critical": "error"}.get(value.lower(), value.lower())
    if level not in get_args(LogLevelName):
        raise argparse.ArgumentTypeError(f"{value!r}: expected one of debug, info, warning, error (any case)")
    return level


class Refused(argparse.Action):
    """A flag asking for what this server does not do: an error naming what to do instead."""

    def __call__(
        self, parser: argparse.ArgumentParser, _: argparse.Namespace, __: Any, option: str | None = None
    ) -> None:
        parser.error(f"{option}: not supported: {self.help.removeprefix('refused: ') if self.help else ''}")


class AdapterFlag(argparse.Action):
    """`--adapter-path DIR` (mlx_lm.server's), `--lora DIR` and `--lora-scaled DIR SCALE` (or
    `DIR:SCALE`, llama-server's): the one mlx-lm adapter directory fused into the target at load
    (target.adapter_path, target.adapter_scale). Its layout is checked here, so a GGUF LoRA or a
    path that is no adapter directory answers naming the flag it came with."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        given = values if isinstance(values, list) else [values]
        if option == "--lora-scaled" and len(given) == 1 and ":" in given[0]:
            given = given[0].rsplit(":", 1)
        if len(given) > 2:
            parser.error(f"{option}: expected FNAME SCALE, got {len(given)} values")
        path, scale = given[0], given[1] if len(given) > 1 else None
        if namespace.adapter_path is not None:
            parser.error(
                f"{option}: one adapter is served, fused into the target at load ({namespace.adapter_path} is "
                "given already); fuse several into one model offline with mlx_lm.fuse, one at a time"
            )
        problem = layout_problem(path)
        if problem is not None:
            several = " (one adapter is served)" if "," in path else ""
            parser.error(f"{option}: {problem}{several}")
        namespace.adapter_path = path
        if option == "--lora-scaled":
            try:
                namespace.adapter_scale = float(scale) if scale is not None else math.nan
            except ValueError:
                namespace.adapter_scale = math.nan
            if not math.isfinite(namespace.adapter_scale):
                parser.error(f"{option}: expected FNAME SCALE with a finite number for SCALE, got {scale!r}")


def _number(kind: type, metavar: str = "N") -> dict[str, Any]:
    return {"type": kind, "metavar": metavar}


def _set(value: Any) -> dict[str, Any]:
    return {"action": "store_const", "const": value}


SAMPLING_FLAGS = [  # llama-server's sampler defaults: the [sampling] key each sets
    Flag(("--temp",), "sampling.temperature", "default temperature", _number(float, "T")),
    Flag(("--top-k",), "sampling.top_k", "default top_k; 0: off", _number(int)),
    Flag(("--top-p",), "sampling.top_p", "default top_p; 1: off", _number(float, "P")),
    Flag(("--min-p",), "sampling.min_p", "default min_p; 0: off", _number(float, "P")),
    Flag(("--typical",), "sampling.typical_p", "default typical_p; 1: off", _number(float, "P")),
    Flag(("--top-nsigma",), "sampling.top_n_sigma", "default top_n_sigma; <= 0: off", _number(float)),
    Flag(("--repeat-penalty",), "sampling.repeat_penalty", "default repeat_penalty; 1: off", _number(float)),
    Flag(("--repeat-last-n",), "sampling.repeat_last_n", "default repeat_last_n; -1: all", _number(int)),
    Flag(("--presence-penalty",), "sampling.presence_penalty", "default presence_penalty", _number(float)),
    Flag(("--frequency-penalty",), "sampling.frequency_penalty", "default frequency_penalty", _number(float)),
    Flag(("--xtc-probability",), "sampling.xtc_probability", "default xtc_probability", _number(float, "P")),
    Flag(("--xtc-threshold",), "sampling.xtc_threshold", "default xtc_threshold", _number(float, "P")),
    Flag(("--dry-multiplier",), "sampling.dry_multiplier", "default dry_multiplier; 0: off", _number(float)),
    Flag(("--dry-base",), "sampling.dry_base", "default dry_base", _number(float)),
    Flag(("--dry-allowed-length",), "sampling.dry_allowed_length", "default dry_allowed_length", _number(int)),
    Flag(("--dry-penalty-last-n",), "sampling.dry_penalty_last_n", "default dry_penalty_last_n", _number(int)),
    Flag(("--dynatemp-range",), "sampling.dynatemp_range", "default dynatemp_range", _number(float)),
    Flag(("--dynatemp-exp",), "sampling.dynatemp_exponent", "default dynatemp_exponent", _number(float)),
    Flag(("--mirostat",), "sampling.mirostat", "default mirostat: 0, 1 or 2", _number(int)),
    Flag(("--mirostat-lr",), "sampling.mirostat_eta", "default mirostat_eta", _number(float)),
    Flag(("--mirostat-ent",), "sampling.mirostat_tau", "default mirostat_tau", _number(float)),
    Flag(
        ("--samplers",),
        "sampling.samplers",
        "the default sampler chain, names separated by ';' (penalties;dry;top_k;...)",
        {"type": _samplers(letters=False), "metavar": "NAMES"},
    ),
    Flag(
        ("--sampling-seq", "--sampler-seq"),
        "sampling.samplers",
        "the default sampler chain as letters (edskypmxt)",
        {"type": _samplers(letters=True), "metavar": "LETTERS"},
    ),
    Flag(("-s", "--seed"), "sampling.seed", "seed of requests that send none; -1: random", _number(int)),
    Flag(
        ("-n", "--n-predict", "--predict", "--max-tokens"),
        "sampling.n_predict",
        "default token limit; -1: none (--max-tokens: mlx_lm.server's)",
        _number(int),
    ),
]
SERVER_FLAGS = [
    Flag(
        ("--draft-max", "--draft", "--draft-n", "--num-draft-tokens"),
        "drafter.num_draft_tokens",
        "draft width k",
        _number(int),
    ),
    Flag(
        ("--draft-min", "--draft-n-min"),
        "drafter.min_draft_tokens",
        "shortest proposal verified (a request's speculative.n_min)",
        _number(int),
    ),
    Flag(("--draft-p-min",), "drafter.p_min", "draft model: stop drafting below this probability", _number(float, "P")),
    Flag(
        ("--governor-policy",),
        "governor.policy",
        "prompt lookup: when its governor pauses drafting",
        {"choices": get_args(GovernorPolicyName)},
    ),
    Flag(("--no-governor-adaptive",), "governor.adaptive", "prompt lookup: always propose the full block", _set(False)),
    Flag(("--host",), "server.host", "listen address", {}),
    Flag(("--port",), "server.port", "listen port", _number(int)),
    Flag(("--api-key",), "server.api_key", "require `Authorization: Bearer KEY`", {}),
    Flag(("--api-key-file",), "server.api_key_file", "accept each key of FILE, one per line, each a tenant", {}),
    Flag(
        ("-np", "--parallel", "--decode-concurrency"),
        "server.max_rows",
        "rows decoded concurrently (--decode-concurrency: mlx_lm.server's)",
        _number(int),
    ),
    Flag(("-a", "--alias"), "server.model_alias", "the model id clients see", {"metavar": "NAME"}),
    Flag(("--embeddings", "--embedding"), "server.embeddings", "serve /v1/embeddings and /embedding", _set(True)),
    Flag(
        ("--pooling",),
        "server.embeddings_pooling",
        "how an embedding pools the hidden states",
        {"choices": get_args(PoolingName)},
    ),
    Flag(("--chat-template-file",), "server.chat_template_file", "a Jinja chat template to use", {"metavar": "FILE"}),
    Flag(
        ("--chat-template",),
        "server.chat_template",
        f"a built-in chat template by name ({', '.join(BUILTIN_TEMPLATES)}), or a template's text "
        "(mlx_lm.server's); a template of your own from a file: --chat-template-file",
        {"metavar": "NAME"},
    ),
    Flag(
        ("--chat-template-kwargs", "--chat-template-args"),
        "server.chat_template_kwargs",
        "template variables as a JSON object, e.g. '{\"enable_thinking\": false}'; a request's own win "
        "(--chat-template-args: mlx_lm.server's)",
        {"type": _json_object, "metavar": "JSON"},
    ),
    Flag(
        ("--prompt-cache-size",),
        "server.prompt_cache_entries",
        "prompt prefixes kept in the prompt cache (mlx_lm.server's)",
        _number(int),
    ),
    Flag(
        ("--prompt-cache-bytes",),
        "server.prompt_cache_mb",
        "the prompt cache's budget: bytes, or with a unit (512MB, 2GB), read in MiB (mlx_lm.server's)",
        {"type": _mebibytes, "metavar": "SIZE"},
    ),
    Flag(
        ("--allowed-origins",),
        "server.cors_origins",
        "origins a browser may call from, comma-separated; * for any (mlx_lm.server's)",
        {"type": lambda value: [o.strip() for o in value.split(",") if o.strip()], "metavar": "LIST"},
    ),
    Flag(("--no-webui",), "server.web_ui", "no chat page at /", _set(False)),
    Flag(
        ("--reasoning-format",),
        "server.reasoning_format",
        "how chat answers' thinking blocks are parsed by default",
        {"choices": get_args(ReasoningFormatName)},
    ),
    Flag(
        ("--models-dir",),
        "router.models_dir",
        "serve every profile (*.toml) of DIR, each named by its file's name, chosen by a request's model",
        {"metavar": "DIR"},
    ),
    Flag(("--no-warmup",), "server.warmup", "skip the warm-up before ready", _set("off")),
    Flag(
        ("--hf-download",),
        "server.allow_model_download",
        "let a model named org/name that is not in the hub cache be downloaded",
        _set(True),
    ),
    Flag(("-v", "--verbose", "--log-verbose"), "logging.level", "log at debug level", _set("debug")),
    Flag(
        ("--log-level",),
        "logging.level",
        "debug, info, warning or error (mlx_lm.server's; any case, CRITICAL read as error)",
        {"type": _log_level, "metavar": "LEVEL"},
    ),
    Flag(("--log-file",), "logging.destination", "append the log to FILE", {"metavar": "FILE"}),
]
# llama-server's flags that have no setting here, accepted so its launch lines work unchanged:
# flag spellings -> (argparse options, why it changes nothing)
NO_OP_FLAGS = {
    ("-c", "--ctx-size"): ({"type": int, "metavar": "N"}, "the context is the checkpoint's (llama-server's -c 0)"),
    ("-cd", "--ctx-size-draft"): ({"type": int, "metavar": "N"}, "the drafter's context is its checkpoint's"),
    ("-ngl", "--gpu-layers", "--n-gpu-layers"): (
        {"metavar": "N"},
        "MLX keeps every layer on its one device (unified memory on Apple silicon)",
    ),
    ("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"): ({"metavar": "N"}, "the drafter runs on the same device"),
    ("-fa", "--flash-attn"): (
        {"nargs": "?", "metavar": "on|off|auto"},
        "attention is MLX's fused kernel, or the row-invariant one on a GPU (docs/gpu.md)",
    ),
    ("--mlock",): ({"action": "store_true"}, "the weights live in MLX's own buffers, which it does not lock into RAM"),
    ("--no-mmap",): ({"action": "store_true"}, "the weights are read into MLX's own buffers, as MLX decides"),
    ("-t", "--threads"): ({"type": int, "metavar": "N"}, "MLX schedules its own threads"),
    ("-tb", "--threads-batch"): ({"type": int, "metavar": "N"}, "MLX schedules its own threads"),
    ("--threads-http",): ({"type": int, "metavar": "N"}, "HTTP runs on one asyncio loop; the engine has its thread"),
    ("-b", "--batch-size"): (
        {"type": int, "metavar": "N"},
        "prefill goes in 128-token chunks (server.max_batch_tokens)",
    ),
    ("-ub", "--ubatch-size"): ({"type": int, "metavar": "N"}, "prefill goes in 128-token chunks"),
    ("-cb", "--cont-batching"): ({"action": "store_true"}, "rows are always batched continuously"),
    ("-ctk", "--cache-type-k"): ({"metavar": "TYPE"}, "the KV cache keeps the model's dtype"),
    ("-ctv", "--cache-type-v"): ({"metavar": "TYPE"}, "the KV cache keeps the model's dtype"),
    ("-dev", "--device"): ({"metavar": "LIST"}, "MLX runs on its default device (docs/gpu.md)"),
    ("-devd", "--device-draft"): ({"metavar": "LIST"}, "the drafter runs on the target's device"),
    ("-sm", "--split-mode"): ({"metavar": "MODE"}, "one device per process; target.parallel shards a target"),
    ("-ts", "--tensor-split"): ({"metavar": "SPLIT"}, "one device per process; target.parallel shards a target"),
    ("-mg", "--main-gpu"): ({"type": int, "metavar": "N"}, "MLX runs on its default device"),
    ("--numa",): ({"metavar": "TYPE"}, "MLX places its own memory"),
    ("-kvu", "--kv-unified"): ({"action": "store_true"}, "each row has its own KV cache"),
    ("--swa-full",): ({"action": "store_true"}, "sliding-window layers keep their window as mlx-lm does"),
    ("--cache-reuse",): ({"type": int, "metavar": "N"}, "the prompt cache reuses whole prefixes, never shifted chunks"),
    ("--no-context-shift",): ({"action": "store_true"}, "there is no context shift: a row stops at its limit"),
    ("--keep",): ({"type": int, "metavar": "N"}, "there is no context shift, so nothing to keep"),
    ("-to", "--timeout"): ({"type": int, "metavar": "N"}, "the HTTP limits are the server's own (docs/reliability.md)"),
    ("--no-slots",): ({"action": "store_true"}, "/slots is always served (other tenants' rows shown only as busy)"),
    ("--slots",): ({"action": "store_true"}, "/slots is always served"),
    ("--metrics",): ({"action": "store_true"}, "/metrics is always served"),
    ("--props",): ({"action": "store_true"}, "settings change by profile reload (SIGHUP), not POST /props"),
    ("--jinja",): ({"action": "store_true"}, "chat templates are always rendered with Jinja"),
    ("--no-perf",): ({"action": "store_true"}, "timings are always measured"),
    ("--log-colors",): ({"nargs": "?", "metavar": "on|off|auto"}, "logging.format chooses json or console"),
    ("--log-prefix",): ({"action": "store_true"}, "every log line is a structured event"),
    ("--log-timestamps",): ({"action": "store_true"}, "every log event carries its timestamp"),
    ("-lv", "--verbosity", "--log-verbosity"): ({"type": int, "metavar": "N"}, "logging.level (or -v) sets the level"),
    ("--prio",): ({"type": int, "metavar": "N"}, "the process keeps the priority it was started with"),
    ("--poll",): ({"type": int, "metavar": "N"}, "MLX waits on its device its own way"),
    # mlx_lm.server's
    ("--trust-remote-code",): (
        {"action": "store_true"},
        "no code shipped with a checkpoint is run: tokenizers load from their files, models from mlx-lm's own code",
    ),
    ("--prompt-concurrency",): ({"type": int, "metavar": "N"}, "every waiting row's prompt prefills, a chunk a tick"),
    ("--prefill-step-size",): ({"type": int, "metavar": "N"}, "prefill goes in 128-token chunks (exactness)"),
    ("--kv-bits",): ({"type": int, "metavar": "N"}, "the KV cache keeps the model's dtype"),
    ("--kv-group-size",): ({"type": int, "metavar": "N"}, "the KV cache keeps the model's dtype"),
    ("--quantized-kv-start",): ({"type": int, "metavar": "N"}, "the KV cache keeps the model's dtype"),
    ("--pipeline",): ({"action": "store_true"}, "one process serves; target.parallel shards a target"),
}
# Flags of llama-server or mlx_lm.server asking for what is not served: each refused with its equivalent
REFUSED_FLAGS = {
    ("--use-default-chat-template",): (
        {"nargs": 0},
        "the model's own chat template is used when it has one; for transformers' default (ChatML), pass "
        "--chat-template chatml",
    ),
}
FLAG_SPECS = SAMPLING_FLAGS + SERVER_FLAGS
FLAGS = {flag.dest: flag.key for flag in FLAG_SPECS} | {  # flag dest -> settings key (llama-server's spellings)
    "model": "target.model",
    "draft_model": "drafter.model",
    "draft_kind": "drafter.kind",
    "adapter_path": "target.adapter_path",  # --adapter-path, --lora, --lora-scaled (AdapterFlag)
    "adapter_scale": "target.adapter_scale",  # --lora-scaled
}
FLAG_NAMES = {
    "target.model": "--model",
    "drafter.model": "--draft-model",
    "drafter.kind": "--draft-kind",
    "target.adapter_path": "--adapter-path",
    "target.adapter_scale": "--lora-scaled",
}
for _flag in reversed(FLAG_SPECS):  # a key two flags set is named by the first of them
    FLAG_NAMES[_flag.key] = next(n for n in _flag.names if n.startswith("--"))
MODEL_KEYS = ("target.model", "drafter.model")  # paths, or Hugging Face repository ids
# `target = "DIR"` is short for `[target] model = "DIR"`; messages name the model key the short way.
SHORT_KEYS = {"target.model": "target"}
# dynaconf's `@int 8080`, `@jinja {{ ... }}`, `@format ...`: refused, never evaluated (see env_layer).
AT_CAST = re.compile(r"@[a-z_]+(\s|$)")
# What a browser sends as Origin: scheme://host[:port], no path. "*" inside one is Litestar's
# wildcard ("https://*.example.com"); "*" alone is any origin (answered "*", without credentials).
CORS_ORIGIN = re.compile(r"\*|https?://[^/\s?#]+")
# A Host header's name without its port: a DNS name ("*." first for its subdomains) or "*" for
# any. IP addresses need no entry: the Host check always serves them (app/server/hosts.py).
ALLOWED_HOST = re.compile(r"\*|(\*\.)?[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?", re.IGNORECASE)


# Keys other servers' configurations use for ours (a did-you-mean difflib would not find)
KEY_HINTS = {
    "model": ' (did you mean \'target\'? the served model is `target = "DIR"`, or `model = "DIR"` under [target])',
    "draft_model": " (did you mean 'drafter'? a draft model is `model = \"DIR\"` under [drafter])",
    "draft": " (did you mean 'drafter'? a draft model is `model = \"DIR\"` under [drafter])",
}


class ProfileError(Exception):
    """A profile that cannot be served. The message names the file, the key and the fix."""


@dataclass
class Resolved:
    settings: Settings
    sources: dict[str, str] = field(default_factory=dict)  # dotted key -> file | env | flag | default
    drafter_detected: bool = False  # the drafter kind was read from drafter.model's config.json (`settled`)
    named: bool = False  # the profile was named (--profile, MLXCEL_PROFILE), not taken by default


def profiles_dir() -> Path:
    return Path(os.environ.get("MLXCEL_PROFILES_DIR", PROFILES_DIR))


def profile_path(name_or_path: str) -> Path:
    """A shipped profile's name (`default`) or a path to a `.toml` file.

    Anything else is refused rather than read: a path to another kind of file (`mine.conf`,
    `/etc/passwd`) once loaded as no settings at all and served the built-in defaults.
    """
    candidate = Path(name_or_path).expanduser()
    is_path = candidate.suffix or os.sep in name_or_path
    path = candidate if is_path else profiles_dir() / f"{name_or_path}.toml"
    if path.is_dir():
        raise ProfileError(f"{path}: is a directory; a profile is a .toml file")
    if path.suffix != ".toml":
        raise ProfileError(f"{path}: not a .toml file; a profile is a TOML file named NAME.toml")
    if not path.is_file():
        if is_path:  # a path was given: say where it was looked for, not how to name one
            raise ProfileError(f"{name_or_path}: no such profile file ({path.resolve()})")
        known = ", ".join(shipped_profiles()) or "none"
        hint = _hint(name_or_path, shipped_profiles())
        raise ProfileError(
            f"{path}: profile not found{hint} (shipped profiles: {known}); pass --profile NAME or a path"
        )
    return path


def shipped_profiles() -> list[str]:
    return sorted(p.stem for p in profiles_dir().glob("*.toml") if p.stem != "template")


def file_layer(path: Path) -> dict[str, Any]:
    """The profile file as plain TOML.

    Read with tomllib rather than dynaconf: dynaconf evaluates `@format`/`@jinja` strings and
    follows `dynaconf_include`, which runs any `.py` file it names; a profile is data only.
    """
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read the profile: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{path}: not UTF-8 text; a profile is a TOML file") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from exc


def env_value(name: str, raw: str) -> Any:
    """One variable's value, parsed as a TOML value (`9000` an int, `true` a bool, `nan` a float),
    else kept as the string it is: dynaconf's convention, without its @-casts.

    A value spelled like a dynaconf cast (`@int 8080`, `@jinja ...`) is refused rather than taken
    as a string, so a deployment written for dynaconf fails loudly instead of serving the text.
    """
    if AT_CAST.match(raw):
        raise ProfileError(
            f"environment: {name}: {raw!r}: @-casts are not supported and values are never evaluated; "
            """write the plain value (a literal string starting with @ can be quoted: '"@..."')"""
        )
    try:
        return tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        return raw


def env_layer() -> dict[str, Any]:
    """MLXCEL_<KEY> and MLXCEL_<GROUP>__<KEY> variables that name settings (dynaconf's convention).

    Other MLXCEL_ variables (MLXCEL_LOG, MLXCEL_PROFILE, MLXCEL_SPECULATIVE_...) are switches,
    not settings, and are left alone; a nested name whose group does not exist is an error.
    """
    fields = set(Settings.__struct_fields__) - {"profile", "source"}
    out: dict[str, Any] = {}
    for name, raw in os.environ.items():
        if not name.startswith(f"{ENV_PREFIX}_"):
            continue
        key, nested, sub = name[len(ENV_PREFIX) + 1 :].partition("__")
        key = key.lower()
        if key not in fields:
            if nested:
                raise ProfileError(
                    f"environment: {ENV_PREFIX}_{key.upper()}__*: unknown settings group{_hint(key, fields)}"
                )
            continue
        value = env_value(name, raw)
        if not nested:
            out[key] = value
        elif isinstance(out.setdefault(key, {}), dict):
            # The env table's names are environment variables (upper case); settings keys are lower case.
            out[key][sub if key == "env" else sub.lower()] = value
    return out


def _hint(key: str, choices: set[str] | list[str]) -> str:
    close = difflib.get_close_matches(key, sorted(choices), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _struct_fields(struct_type: type) -> dict[str, Any]:
    return {f.name: f.type for f in msgspec.structs.fields(struct_type)}


def _label(where: str, dotted: str) -> str:
    """How a key is spelled where it came from: `drafter.kind` in a file, MLXCEL_DRAFTER__KIND in the env."""
    dotted = SHORT_KEYS.get(dotted, dotted)
    if where != "environment":
        return f"{where}: {dotted}"
    return f"environment: {ENV_PREFIX}_{dotted.replace('.', '__').upper()}"


def expand_short_keys(data: dict[str, Any]) -> None:
    """`target = "DIR"` (a file, MLXCEL_TARGET) becomes `[target] model = "DIR"`."""
    if "target" in data and not isinstance(data["target"], dict):
        data["target"] = {"model": data["target"]}


def check_keys(data: dict[str, Any], where: str) -> None:
    """Unknown keys, with a did-you-mean, before msgspec sees the data."""
    fields = _struct_fields(Settings)
    top = [f for f in fields if f not in ("profile", "source")]
    for key, value in data.items():
        if key not in top:
            hint = KEY_HINTS.get(key) or _hint(key, top)
            raise ProfileError(f"{_label(where, key)}: unknown key{hint}")
        if key == "env":
            if not isinstance(value, dict):
                raise ProfileError(f"{_label(where, key)}: expected a table ([env]), got {type(value).__name__}")
            for name in value:
                if name not in ENV_OVERRIDES:
                    raise ProfileError(
                        f"{_label(where, f'env.{name}')}: not an acceptance-rule override"
                        f"{_hint(name, ENV_OVERRIDES)}; allowed: {', '.join(ENV_OVERRIDES)}"
                    )
            continue
        group = fields[key]
        if isinstance(group, type) and issubclass(group, msgspec.Struct):
            if not isinstance(value, dict):
                raise ProfileError(f"{_label(where, key)}: expected a table ([{key}]), got {type(value).__name__}")
            known = _struct_fields(group)
            for sub in value:
                if sub not in known:
                    raise ProfileError(f"{_label(where, f'{key}.{sub}')}: unknown key{_hint(sub, list(known))}")


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def leaves(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and key != "env":
            out |= leaves(value, f"{dotted}.")
        else:
            out[dotted] = value
    return out


def set_key(data: dict[str, Any], dotted: str, value: Any) -> None:
    *groups, last = dotted.split(".")
    for group in groups:
        data = data.setdefault(group, {})
    data[last] = value


def _choices(dotted: str) -> tuple[str, ...]:
    """The allowed values of a Literal-typed setting (empty for other types)."""
    annotation: Any = Settings
    for part in dotted.split("."):
        annotation = _struct_fields(annotation).get(part) if isinstance(annotation, type) else None
    return get_args(annotation) if get_origin(annotation) is Literal else ()


def origin(dotted: str, sources: dict[str, str], path: Path) -> str:
    """Where the operator set a key: `FILE: key`, `environment: MLXCEL_...` or `flag --...`."""
    source = sources.get(dotted)
    if source == "flag":
        return f"flag {FLAG_NAMES[dotted]}"
    return _label("environment" if source == "env" else str(path), dotted)


def convert(data: dict[str, Any], sources: dict[str, str], path: Path) -> Settings:
    try:
        return msgspec.convert(data, Settings, strict=False)
    except msgspec.ValidationError as exc:
        message = str(exc)
        match = re.search(r"- at `\$\.(.+)`$", message)
        key = match.group(1) if match else "?"
        reason = message.split(" - at ")[0]
        choices = _choices(key)
        allowed = f" (allowed: {', '.join(choices)})" if choices else ""
        raise ProfileError(
            f"{origin(key, sources, path)}: {reason[0].lower()}{reason[1:]}{allowed}; "
            "fix the value (see profiles/template.toml)"
        ) from exc


def check_values(settings: Settings, sources: dict[str, str], path: Path) -> None:
    """What the types let through but nothing can serve.

    NaN and infinities (TOML spells them `nan`, `inf`; so may an environment value) once made
    every request return ''; an empty API key once turned auth off; a log file that cannot be
    opened once ended startup in a traceback.
    """
    for key, value in leaves(msgspec.to_builtins(settings)).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ProfileError(f"{origin(key, sources, path)}: {value} is not a finite number; give a finite one")
    check_api_keys(settings, sources, path)
    if settings.server.admin_reload and settings.server.api_key is None:
        raise ProfileError(
            f"{origin('server.admin_reload', sources, path)}: needs server.api_key (the server key guards POST "
            "/admin/reload, which no tenant's key of server.api_keys or api_key_file may call); set it, or reload "
            "with SIGHUP"
        )
    if settings.server.embeddings and settings.target.parallel != "none":
        raise ProfileError(
            f"{origin('server.embeddings', sources, path)}: not served with a tensor-parallel target (an embedding "
            "runs the target alone on the engine thread, outside the ranks' lockstep); set it false"
        )
    where = partial(origin, sources=sources, path=path)
    require_each(
        settings.server.cors_origins,
        CORS_ORIGIN,
        where("server.cors_origins"),
        'is not an origin; write scheme://host[:port] with no path (e.g. "https://app.example:8443"), or "*" for any '
        "origin",
    )
    if "*" in settings.server.cors_origins and len(settings.server.cors_origins) > 1:
        raise ProfileError(
            f'{origin("server.cors_origins", sources, path)}: "*" beside listed origins: "*" answers every '
            'origin without credentials, so the listed ones would lose theirs; write ["*"] or the list alone'
        )
    require_each(
        settings.server.allowed_hosts,
        ALLOWED_HOST,
        where("server.allowed_hosts"),
        'is not a host name; write a name as a Host header gives it, without the port ("mlxcel.example", '
        '"*.example"), or "*" for any',
    )
    check_parallel(settings, sources, path)
    reserved = sorted(set(settings.server.chat_template_kwargs) & RESERVED_TEMPLATE_KEYS)
    if reserved:
        raise ProfileError(
            f"{origin('server.chat_template_kwargs', sources, path)}: {reserved[0]!r} is not a template variable "
            "a profile may set: the server controls the rendering"
        )
    problem = destination_problem(settings.logging.destination)
    if problem:
        raise ProfileError(f"{origin('logging.destination', sources, path)}: {problem}")


def check_api_keys(settings: Settings, sources: dict[str, str], path: Path) -> None:
    """Every configured key is usable and the key file reads."""
    server = settings.server
    if server.api_key is not None and not server.api_key.strip():
        raise ProfileError(
            f"{origin('server.api_key', sources, path)}: empty API key; set a key, or leave server.api_key "
            "unset to serve without authentication"
        )
    if any(not key.strip() for key in server.api_keys):
        raise ProfileError(f"{origin('server.api_keys', sources, path)}: an empty API key; drop it from the list")
    if server.api_key_file is None:
        return
    where = origin("server.api_key_file", sources, path)
    try:
        keys = read_key_file(server.api_key_file)
    except OSError as exc:
        raise ProfileError(f"{where}: cannot read the key file {server.api_key_file}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{where}: {server.api_key_file} is not UTF-8 text; write one key per line") from exc
    if not keys:
        raise ProfileError(
            f"{where}: {server.api_key_file} holds no key (only blank lines and # comments); write one key per "
            "line, or leave server.api_key_file unset"
        )


def require_each(entries: list[str], pattern: re.Pattern[str], where: str, advice: str) -> None:
    """Every entry of a list setting matches `pattern`; else a ProfileError naming the entry."""
    for entry in entries:
        if not pattern.fullmatch(entry):
            raise ProfileError(f"{where}: {entry!r} {advice}")


def check_parallel(settings: Settings, sources: dict[str, str], path: Path) -> None:
    """`target.parallel` and `target.world_size` must agree."""
    target = settings.target
    if target.parallel == "tensor" and target.world_size < 2:
        raise ProfileError(
            f"{origin('target.world_size', sources, path)}: tensor parallel needs world_size >= 2 ranks "
            f'(got {target.world_size}); set target.world_size, or target.parallel = "none"'
        )
    if target.parallel == "none" and target.world_size != 1:
        raise ProfileError(
            f"{origin('target.world_size', sources, path)}: {target.world_size} ranks, but target.parallel is "
            '"none"; set target.parallel = "tensor" to shard the target, or drop world_size'
        )


def get_key(data: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


def anchor_paths(data: dict[str, Any], profile: Path) -> None:
    """Relative paths in a profile are relative to the profile file; a model named `org/name`
    that is no directory there is a Hugging Face repository id (hub_models resolves it)."""
    for key in PATH_KEYS:
        value = get_key(data, key)
        if not isinstance(value, str) or value in ("stdout", "stderr") or Path(value).expanduser().is_absolute():
            continue
        if key in MODEL_KEYS and (is_repo_id(value, profile.parent) or gguf.is_repo_tag(value)):
            continue
        set_key(data, key, str((profile.parent / value).resolve()))


def hub_models(settings: Settings, sources: dict[str, str], path: Path) -> Settings:
    """Target and drafter named as `org/name` repository ids, resolved to their snapshots in the
    Hugging Face cache (app/loading/hub.py); the target's id is the model's alias unless one is set.
    A GGUF file, named by its path or as `org/name:QUANT` (a file of a cached repository, as
    llama-server's `-hf` names one), or a repository holding GGUF files only, is converted once
    into a model directory (app/loading/gguf.py), which the key then names."""
    allow = settings.server.allow_model_download
    target, drafter, server = settings.target, settings.drafter, settings.server
    try:
        key, value = "target.model", target.model
        if is_repo_id(target.model) or gguf.is_repo_tag(target.model):
            server = msgspec.structs.replace(server, model_alias=server.model_alias or target.model)
        target = msgspec.structs.replace(target, model=local_model(target.model, allow))
        if drafter.model is not None:
            key, value = "drafter.model", drafter.model
            drafter = msgspec.structs.replace(drafter, model=local_model(drafter.model, allow))
    except gguf.GgufModelError as exc:
        raise ProfileError(f"{origin(key, sources, path)}: {exc}") from exc
    except ModelLoadError as exc:
        # both places a relative `org/name` is looked for: a directory, then the cache
        anchor, place = (path.parent, "next to the profile") if sources[key] == "file" else (Path.cwd(), "here")
        directory = f"no directory {(anchor / value).resolve()} {place}, and "
        raise ProfileError(f"{origin(key, sources, path)}: {directory}{exc}") from exc
    return msgspec.structs.replace(settings, target=target, drafter=drafter, server=server)


def local_model(value: str, allow_download: bool) -> str:
    """The directory a model value names: itself, a cached repository's snapshot, or the directory
    a GGUF file (by path, as `org/name:QUANT`, or a repository of GGUF files) was converted into."""
    if gguf.is_repo_tag(value):
        match = gguf.REPO_TAG.fullmatch(value)
        assert match is not None
        snapshot = cached_model(match["repo"], allow_download=allow_download)
        return str(gguf.served_directory(gguf.tagged_file(snapshot, match["repo"], match["tag"])))
    if is_repo_id(value):
        snapshot = cached_model(value, allow_download=allow_download)
        if not (snapshot / "config.json").exists() and any(snapshot.rglob("*.gguf")):
            return str(gguf.served_directory(gguf.tagged_file(snapshot, value, None)))
        return str(snapshot)
    if gguf.is_gguf_path(value):
        return str(gguf.served_directory(Path(value)))
    return value


def resolve(
    name_or_path: str | None = None, flags: dict[str, Any] | None = None, default: str = DEFAULT_PROFILE
) -> Resolved:
    """File < environment < flags, validated into Settings; the profile named, else MLXCEL_PROFILE's,
    else `default`."""
    named = name_or_path or os.environ.get("MLXCEL_PROFILE")
    path = profile_path(named or default)
    from_file = file_layer(path)
    expand_short_keys(from_file)
    check_keys(from_file, str(path))
    anchor_paths(from_file, path)
    from_env = env_layer()
    expand_short_keys(from_env)
    check_keys(from_env, "environment")
    data = merge(from_file, from_env)
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    for dest, value in flags.items():
        set_key(data, FLAGS[dest], value)
    data["env"] = {k: str(int(v)) if isinstance(v, bool) else str(v) for k, v in (data.get("env") or {}).items()}
    data["profile"], data["source"] = path.stem, str(path)
    sources = dict.fromkeys(leaves(msgspec.to_builtins(Settings())), "default")
    sources |= dict.fromkeys(leaves(from_file), "file")
    sources |= dict.fromkeys(leaves(from_env), "env")
    sources |= {FLAGS[dest]: "flag" for dest in flags}
    for key in ("profile", "source"):
        sources.pop(key, None)
    settings = hub_models(convert(data, sources, path), sources, path)
    check_values(settings, sources, path)
    return Resolved(settings, sources, named=bool(named))


def add_profile_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", help="profile name (profiles/NAME.toml) or path; env MLXCEL_PROFILE")
    parser.add_argument(
        "-m",
        "--model",
        "-hf",
        "--hf-repo",
        dest="model",
        help="target model directory, GGUF file (converted once: docs/bring-your-own-model.md), or Hugging Face "
        "repository id org/name (org/name:QUANT: that GGUF file of the repository), found in the local hub cache "
        "(target; -hf/--hf-repo as llama-server's); with a named profile (--profile, MLXCEL_PROFILE) served with "
        "its drafter, else with none unless a drafter flag names one",
    )
    parser.add_argument(
        "--draft-model",
        "-md",
        "--model-draft",
        "-hfd",
        "--hf-repo-draft",
        dest="draft_model",
        help="drafter model directory or repository id org/name (drafter.model; its kind read from config.json; "
        "-md/--model-draft and -hfd/--hf-repo-draft as llama-server's)",
    )
    parser.add_argument(
        "--draft-kind", choices=get_args(DrafterKindName), help="drafter kind (drafter.kind; none: no drafter)"
    )
    adapter = "an mlx-lm LoRA adapter directory, fused into the target at load (target.adapter_path"
    parser.add_argument("--adapter-path", dest="adapter_path", action=AdapterFlag, metavar="DIR",
                        help=f"{adapter}; mlx_lm.server's)")  # fmt: skip
    parser.add_argument("--lora", dest="adapter_path", action=AdapterFlag, metavar="DIR",
                        help=f"{adapter}; llama-server's takes a GGUF LoRA, which is refused)")  # fmt: skip
    parser.add_argument("--lora-scaled", dest="adapter_path", action=AdapterFlag, nargs="+", metavar="DIR",
                        help=f"{adapter}): DIR SCALE or DIR:SCALE, its delta times SCALE (target.adapter_scale; "
                        "llama-server's)")  # fmt: skip
    parser.set_defaults(adapter_scale=None)
    for flag in SERVER_FLAGS:
        parser.add_argument(*flag.names, dest=flag.dest, help=f"{flag.help} ({flag.key})", **flag.options)
    sampling = parser.add_argument_group("llama-server's sampler defaults ([sampling]; a request's fields win)")
    for flag in SAMPLING_FLAGS:
        sampling.add_argument(*flag.names, dest=flag.dest, help=f"{flag.help} ({flag.key})", **flag.options)
    no_ops = parser.add_argument_group("llama-server and mlx_lm.server flags accepted without effect")
    for names, (options, why) in NO_OP_FLAGS.items():
        no_ops.add_argument(
            *names, **options, dest="no_op_" + names[-1].lstrip("-").replace("-", "_"), help=f"no effect: {why}"
        )
    refused = parser.add_argument_group("llama-server and mlx_lm.server flags refused, each with its equivalent")
    for names, (options, why) in REFUSED_FLAGS.items():
        dest = "refused_" + names[0].lstrip("-").replace("-", "_")
        refused.add_argument(*names, **options, action=Refused, dest=dest, help=f"refused: {why}")


def flags_of(args: argparse.Namespace) -> dict[str, Any]:
    return {dest: getattr(args, dest, None) for dest in FLAGS}
