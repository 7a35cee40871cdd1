"""Deployment profiles: TOML files resolved into one validated Settings object."""

from __future__ import annotations

import argparse

from app.profiles.checks import check_models
from app.profiles.loader import ProfileError, Resolved, add_profile_flags, flags_of, resolve, shipped_profiles
from app.profiles.schema import Settings


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The profile named by --profile (or MLXCEL_PROFILE), with env and flag overrides, checked."""
    resolved = resolve(args.profile, flags_of(args))
    check_models(resolved.settings)
    return resolved.settings


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
