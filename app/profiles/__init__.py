"""Deployment profiles: TOML files resolved into one validated Settings object."""

from __future__ import annotations

import argparse
from pathlib import Path

import msgspec
import structlog

from app.drafters.kinds import DETECTED, DrafterKind
from app.loading import ModelLoadError, read_checkpoint
from app.profiles.checks import check_models
from app.profiles.loader import ProfileError, Resolved, add_profile_flags, flags_of, origin, resolve, shipped_profiles
from app.profiles.schema import Settings


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The profile named by --profile (or MLXCEL_PROFILE), with env and flag overrides, checked.

    A drafter model named with more authority than the kind (a flag over a profile file, say)
    gets the kind its config.json describes; a kind given alongside it wins (`check_models`
    refuses one that cannot drive the checkpoint).
    """
    resolved = resolve(args.profile, flags_of(args))
    settings = resolved.settings
    drafter = settings.drafter
    log = structlog.get_logger("mlxcel.profiles")
    rank = {"default": 0, "file": 1, "env": 2, "flag": 3}
    if drafter.model and rank[resolved.sources["drafter.model"]] > rank[resolved.sources["drafter.kind"]]:
        try:
            detected = str(DETECTED[read_checkpoint(drafter.model).kind])
        except ModelLoadError as exc:
            raise ProfileError(f"{origin('drafter.model', resolved.sources, Path(settings.source))}: {exc}") from exc
        log.info("drafter_kind_resolved", kind=detected, explicit=False, model=drafter.model)
        settings = msgspec.structs.replace(settings, drafter=msgspec.structs.replace(drafter, kind=detected))
    elif drafter.model and not DrafterKind(drafter.kind).needs_model:
        log.warning("drafter_model_ignored", kind=drafter.kind, model=drafter.model)
    check_models(settings, resolved.sources)
    return settings


__all__ = [
    "ProfileError",
    "Resolved",
    "Settings",
    "add_profile_flags",
    "check_models",
    "resolve",
    "settings_from_args",
    "shipped_profiles",
]
