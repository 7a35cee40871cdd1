"""Deployment profiles: TOML files resolved into one validated Settings object."""

from __future__ import annotations

import argparse
from pathlib import Path

import msgspec

from app.drafters.kinds import DETECTED, DrafterKind
from app.events import profiles as events
from app.loading import ModelLoadError, read_checkpoint
from app.profiles.checks import check_models
from app.profiles.loader import ProfileError, Resolved, add_profile_flags, flags_of, origin, resolve, shipped_profiles
from app.profiles.schema import DrafterSettings, Settings

RANK = {"default": 0, "file": 1, "env": 2, "flag": 3}  # how much authority each source of a key has


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The profile named by --profile (or MLXCEL_PROFILE), with env and flag overrides, its
    drafter settled (`settle_drafter`), checked."""
    return settled(resolve(args.profile, flags_of(args))).settings


def settled(resolved: Resolved) -> Resolved:
    """A resolved profile with its drafter settled (`settle_drafter`) and its models checked."""
    drafter, detected = settle_drafter(resolved.settings, resolved.sources, resolved.named)
    settings = msgspec.structs.replace(resolved.settings, drafter=drafter)
    check_models(settings, resolved.sources)
    return Resolved(settings, resolved.sources, drafter_detected=detected, named=resolved.named)


def settle_drafter(settings: Settings, sources: dict[str, str], named: bool = False) -> tuple[DrafterSettings, bool]:
    """The drafter the settings mean, each drafter key weighed against the keys set with more
    authority, and whether its kind was read from the model's config.json.

    - A drafter key of a named profile's file (`--profile`, MLXCEL_PROFILE) is kept whatever sets
      the target: the operator asked for that profile, drafter included, so `--profile mtp -m DIR`
      serves DIR with the profile's MTP head, and `check_models` refuses a drafter that cannot
      pair with DIR, naming both. Served silently without it, a drafting profile measured
      target-only (issue 46).
    - Otherwise a drafter key set with less authority than the target is dropped: the default
      profile's drafter belongs to the target it was paired with, so `-m DIR` alone (no profile
      named) serves DIR without it.
    - A drafter model set with more authority than the kind (`--draft-model` over a profile file)
      gets the kind its config.json describes; a kind given alongside it wins (`check_models`
      refuses one that cannot drive the checkpoint).
    - A model under a kind that needs none is dropped silently when the kind outranks it
      (`--draft-kind none` over a profile's drafter), and warned about when set together.
    """
    drafter = settings.drafter
    rank = {key: RANK[sources[key]] for key in ("target.model", "drafter.kind", "drafter.model")}
    kept = {
        key: (named and sources[key] == "file") or rank[key] >= rank["target.model"]
        for key in ("drafter.kind", "drafter.model")
    }
    kind = drafter.kind if kept["drafter.kind"] else "none"
    model = drafter.model if kept["drafter.model"] else None
    detected = bool(model) and rank["drafter.model"] > rank["drafter.kind"]
    if detected:
        try:
            kind = str(DETECTED[read_checkpoint(model).kind])
        except ModelLoadError as exc:
            raise ProfileError(f"{origin('drafter.model', sources, Path(settings.source))}: {exc}") from exc
        events.drafter_kind_resolved(kind=kind, explicit=False, model=model)
    elif model and not DrafterKind(kind).needs_model:
        if rank["drafter.model"] >= rank["drafter.kind"]:
            events.drafter_model_ignored(kind=kind, model=model)
        model = None
    return msgspec.structs.replace(drafter, kind=kind, model=model), detected


__all__ = [
    "ProfileError",
    "Resolved",
    "Settings",
    "add_profile_flags",
    "check_models",
    "origin",
    "resolve",
    "settings_from_args",
    "settled",
    "shipped_profiles",
]
