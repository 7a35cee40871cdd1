"""Checks a resolved profile must pass before anything loads: models exist and fit together."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import jinja2

from app.drafters.kinds import DETECTED, DrafterKind
from app.loading import Checkpoint, CheckpointKind, ModelLoadError, read_checkpoint
from app.loading.adapter import AdapterError, fit_problem, read_adapter
from app.loading.builtin_templates import builtin_source
from app.loading.chat_template import compile_template, load_template_file
from app.loading.pairing import TokenizerFileError, pairing_problem, tokenizer_vocab
from app.profiles.loader import ProfileError, origin
from app.profiles.schema import LOSSLESS_BLOCK_RULE, Settings


def check_chat_template(settings: Settings, where: str, where_named: str = "server.chat_template") -> None:
    """The operator's chat template must read and compile (it is loaded once, here). `where`
    names the key as it was set (file and key, environment variable or flag); `where_named`
    the built-in name's or template text's (server.chat_template)."""
    path, named = settings.server.chat_template_file, settings.server.chat_template
    if named is not None:
        if path:
            raise ProfileError(f"{where_named}: beside {where}: give one chat template, a file or a built-in one")
        try:
            compile_template(builtin_source(named))
        except ValueError as exc:
            raise ProfileError(f"{where_named}: {exc}") from exc
        except jinja2.TemplateSyntaxError as exc:
            raise ProfileError(f"{where_named}: the template's text, line {exc.lineno}: {exc.message}") from exc
    if not path:
        return
    try:
        load_template_file(path)
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ProfileError(f"{where}: cannot read {path}: {reason}") from exc
    except jinja2.TemplateSyntaxError as exc:
        raise ProfileError(f"{where}: {path}, line {exc.lineno}: {exc.message}") from exc


SHARDED_SIZES = ("num_attention_heads", "num_key_value_heads", "intermediate_size")


def check_shardable(config: dict, world_size: int, where: str) -> None:
    """Tensor parallelism splits attention heads and the MLP's hidden size evenly over the ranks."""
    for key in SHARDED_SIZES:
        size = config.get(key, config.get("text_config", {}).get(key))
        if world_size > 1 and isinstance(size, int) and size % world_size:
            raise ProfileError(
                f"{where}: the target's {key} ({size}) does not split evenly over {world_size} ranks; "
                "choose a world_size that divides it"
            )


def check_adapter(settings: Settings, target: Checkpoint, at: Callable[[str], str]) -> None:
    """The target's adapter (target.adapter_path) is an mlx-lm adapter directory whose LoRA
    matrices fit the target's layers; `target.adapter_scale` scales one that is set."""
    path, scale = settings.target.adapter_path, settings.target.adapter_scale
    if path is None:
        if scale != 1.0:
            raise ProfileError(f"{at('target.adapter_scale')}: scales an adapter, but target.adapter_path is unset")
        return
    if settings.target.parallel == "tensor":
        raise ProfileError(
            f"{at('target.adapter_path')}: not applied to a tensor-parallel target; fuse it offline "
            "(mlx_lm.fuse --model MODEL --adapter-path ADAPTER --save-path FUSED) and serve FUSED"
        )
    try:
        adapter = read_adapter(path)
    except AdapterError as exc:
        raise ProfileError(f"{at('target.adapter_path')}: {exc}") from exc
    if adapter.fine_tune_type == "full" and scale != 1.0:
        raise ProfileError(
            f"{at('target.adapter_scale')}: {adapter.path} is a full fine-tune (its weights replace the "
            "target's), which has no LoRA delta to scale; drop the scale"
        )
    problem = fit_problem(adapter, target)
    if problem is not None:
        raise ProfileError(
            f"{at('target.adapter_path')}: {adapter.path} cannot be applied to the target {target.path} "
            f"({at('target.model')}): {problem}"
        )


def check_models(settings: Settings, sources: dict[str, str] | None = None) -> None:
    """`sources` (from `resolve`) lets each message name where the key was set; without it, the file."""

    def at(key: str) -> str:
        return origin(key, sources or {}, Path(settings.source))

    check_chat_template(settings, at("server.chat_template_file"), at("server.chat_template"))
    try:
        target = read_checkpoint(settings.target.model)
    except ModelLoadError as exc:
        raise ProfileError(f"{at('target.model')}: {exc}; point target at an mlx-lm model directory") from exc
    if not target.is_standalone:
        raise ProfileError(
            f"{at('target.model')}: {target.path} is a {target.kind} drafter, not a standalone model; "
            "set target to the model it drafts for and put it under drafter.model"
        )
    try:
        tokenizer_vocab(target.path)
    except TokenizerFileError as exc:
        raise ProfileError(f"{at('target.model')}: {exc}") from exc
    check_shardable(target.config, settings.target.world_size, at("target.world_size"))
    check_adapter(settings, target, at)
    drafter = settings.drafter
    if not DrafterKind(drafter.kind).needs_model:
        return
    if not drafter.model:
        raise ProfileError(
            f'{at("drafter.model")}: required for drafter.kind = "{drafter.kind}"; set it to a model directory'
        )
    try:
        checkpoint = read_checkpoint(drafter.model)
    except ModelLoadError as exc:
        raise ProfileError(f"{at('drafter.model')}: {exc}") from exc
    detected = DETECTED[checkpoint.kind]
    if detected != drafter.kind:
        raise ProfileError(
            f'{at("drafter.kind")}: "{drafter.kind}" cannot drive {checkpoint.path}, which is a '
            f'{checkpoint.kind} checkpoint; set drafter.kind = "{detected}"'
        )
    try:
        problem = pairing_problem(target, checkpoint)
    except TokenizerFileError as exc:
        raise ProfileError(f"{at('drafter.model')}: {exc}") from exc
    if problem is not None:  # both named: a profile's drafter may meet a target set elsewhere (-m)
        raise ProfileError(
            f"{at('drafter.model')}: {checkpoint.path} cannot draft for the target {target.path} "
            f"({at('target.model')}): {problem}"
        )
    sampling = settings.sampling
    greedy_only = checkpoint.kind is CheckpointKind.DSPARK and drafter.block_rule != LOSSLESS_BLOCK_RULE
    if greedy_only and sampling.temperature > 0 and sampling.top_k != 1:
        raise ProfileError(
            f"{at('sampling.temperature')}: the DSpark drafter is greedy-only under "
            f'drafter.block_rule = "{drafter.block_rule}", but requests default to temperature '
            f"{sampling.temperature}; set sampling.temperature = 0 (or sampling.top_k = 1), or "
            'drafter.block_rule = "lossless"'
        )
