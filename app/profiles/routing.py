"""The profiles one server routes requests to (`[router]`, `--models-dir`), each read and checked
at startup as `serve` checks its own, so a bad one stops startup naming the router's key.

A routed profile brings its model keys (target, drafter, rule, sampling, limits); the server-level
keys (listener, keys and tenants, CORS, logging) are the router profile's. Its `model` in answers
and listings is the name the router gives it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import msgspec

from app.profiles import settled
from app.profiles.loader import ProfileError, Resolved, origin, resolve
from app.profiles.schema import Settings


@dataclass(frozen=True)
class RoutedProfile:
    name: str  # what a request's `model` says to reach it
    aliases: tuple[str, ...]
    path: Path  # its profile file
    settings: Settings  # as read at startup; its server.model_alias is `name`

    def resolve(self) -> Resolved:
        """The profile as its file reads now (a reload's), named as at startup."""
        return named(settled(resolve(str(self.path))), self.name)


def named(resolved: Resolved, name: str) -> Resolved:
    server = msgspec.structs.replace(resolved.settings.server, model_alias=name)
    settings = msgspec.structs.replace(resolved.settings, server=server)
    return Resolved(settings, resolved.sources, resolved.drafter_detected, resolved.named)


def routing(settings: Settings) -> bool:
    return bool(settings.router.models or settings.router.models_dir)


def routed_profiles(resolved: Resolved) -> list[RoutedProfile]:
    """The router profile's models in order (the first serves requests that name none); [] if it routes none."""
    settings, here = resolved.settings, Path(resolved.settings.source)
    models = settings.router.models
    entries = [(f"router.models[{i}]", m.profile, m.name, tuple(m.aliases)) for i, m in enumerate(models)]
    entries += [("router.models_dir", str(file), None, ()) for file in models_dir(resolved)]
    profiles: list[RoutedProfile] = []
    taken: set[str] = set()
    for key, profile, name, aliases in entries:
        where = origin(key if key == "router.models_dir" else f"{key}.profile", resolved.sources, here)
        path = relative_to(profile, here.parent)
        try:
            found = settled(resolve(path))
        except ProfileError as exc:
            raise ProfileError(f"{where}: {exc}") from exc
        if routing(found.settings):
            raise ProfileError(f"{where}: {path} has a [router] table of its own; a routed profile serves one model")
        name = name or Path(found.settings.source).stem
        for each in (name, *aliases):
            if not each or each in taken:
                problem = "an empty name" if not each else f"{each!r} names two models"
                raise ProfileError(f"{origin(key, resolved.sources, here)}: {problem}; give each model its own name")
            taken.add(each)
        profiles.append(RoutedProfile(name, aliases, Path(found.settings.source), named(found, name).settings))
    return profiles


def models_dir(resolved: Resolved) -> list[Path]:
    directory = resolved.settings.router.models_dir
    if directory is None:
        return []
    where = origin("router.models_dir", resolved.sources, Path(resolved.settings.source))
    files = sorted(Path(directory).glob("*.toml")) if Path(directory).is_dir() else None
    if not files:
        problem = "is not a directory" if files is None else "holds no profile (*.toml)"
        raise ProfileError(f"{where}: {directory} {problem}; name a directory of profiles")
    return files


def relative_to(profile: str, directory: Path) -> str:
    """A path as the router profile wrote it (relative to its file), or a shipped profile's name."""
    candidate = Path(profile).expanduser()
    if not (candidate.suffix or os.sep in profile) or candidate.is_absolute():
        return profile
    return str((directory / candidate).resolve())
