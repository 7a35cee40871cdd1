"""`mlxcel profiles list | show NAME | check [NAME|PATH ...]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec

from app.cli.serve import listen_problem
from app.profiles import ProfileError, check_models, origin, resolve, shipped_profiles
from app.profiles.loader import leaves, profile_path
from app.profiles.routing import routed_profiles

MASKED = "********"


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("profiles", allow_abbrev=False, help="list, show or check deployment profiles")
    actions = p.add_subparsers(dest="action", required=True)
    actions.add_parser("list", allow_abbrev=False, help="the shipped profiles").set_defaults(handler=list_profiles)
    show = actions.add_parser("show", allow_abbrev=False, help="resolved settings and where each value came from")
    show.add_argument("name", nargs="?", default=None, help="name or path (default: MLXCEL_PROFILE or default)")
    show.set_defaults(handler=show_profile)
    check = actions.add_parser(
        "check", allow_abbrev=False, help="validate without serving; exit 2 on the first problem"
    )
    check.add_argument("names", nargs="*", help="names or paths (default: every shipped profile)")
    check.add_argument(
        "--strict",
        action="store_true",
        help="a port another process holds is an error too (by default a warning: a running server "
        "holds its own profile's port, and checking that profile before a reload must pass)",
    )
    check.set_defaults(handler=check_profiles)


def describe(name: str) -> str:
    """A profile's first comment line."""
    for line in profile_path(name).read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


def list_profiles(_: argparse.Namespace) -> int:
    for name in shipped_profiles():
        kind = resolve(name).settings.drafter.kind
        print(f"{name:16s} {kind:14s} {describe(name)}")
    return 0


def show_profile(args: argparse.Namespace) -> int:
    resolved = resolve(args.name)
    settings = resolved.settings
    print(f"# profile {settings.profile} ({settings.source})")
    values = leaves(msgspec.to_builtins(settings))
    width = max(len(k) for k in values)
    if values["server.api_key"] is not None:
        values["server.api_key"] = MASKED  # a secret: show that one is set and where, never the key
    values["server.api_keys"] = [MASKED for _ in values["server.api_keys"]]
    for key, value in values.items():
        if key in ("profile", "source"):
            continue
        print(f"{key:{width}s} = {msgspec.json.encode(value).decode()}    # {resolved.sources.get(key, 'default')}")
    return 0


def check_profiles(args: argparse.Namespace) -> int:
    names = args.names or shipped_profiles()
    listeners: dict[tuple[str, int], str] = {}
    for name in names:
        resolved = resolve(name)
        settings = resolved.settings
        check_models(settings, resolved.sources)
        routed_profiles(resolved)  # a router's models, each checked as serve checks them
        address = (settings.server.host, settings.server.port)
        if settings.server.port and address in listeners:
            raise ProfileError(
                f"{settings.source}: server.port: {address[0]}:{address[1]} is also used by {listeners[address]}; "
                "give each profile its own port"
            )
        listeners[address] = settings.source
        problem = listen_problem(*address)  # as `serve` would find it now: a port another process holds
        if problem:
            where = f"{origin(problem.key, resolved.sources, Path(settings.source))}: {problem.reason}"
            if not problem.taken or args.strict:
                raise ProfileError(where)
            print(f"warning: {where}; `serve` could not listen there now", file=sys.stderr)
        print(f"ok: {settings.profile} ({settings.source})")
    return 0
