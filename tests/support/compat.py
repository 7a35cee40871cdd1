"""The compat/ manifests, typed: which routes and fields we claim, and how (llama-server's, and
Ollama's routes in compat/ollama/)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

import msgspec

from tests.support import ROOT

MANIFEST = ROOT / "compat" / "llama-server" / "b10621"
OLLAMA = ROOT / "compat" / "ollama" / "v0.13.0"
State = Literal["supported", "aliased", "not_applicable", "deferred", "by_design"]


class ErrorShape(msgspec.Struct, forbid_unknown_fields=True):
    status: int
    type: str | None = None  # the envelope's type; Ollama's errors have none ({"error": "..."})


class RouteEntry(msgspec.Struct, forbid_unknown_fields=True):
    kind: Literal["route"]
    id: str
    method: Literal["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"]
    path: str
    state: State
    notes: str
    test: str | None = None
    error: ErrorShape | None = None
    served_as: str | None = None
    # the environment (profile keys) under which a route is served, as llama-server's --embeddings;
    # without it the default server answers `error`
    requires: dict[str, str] | None = None
    # what the served model must have for a route to answer (/infill: FIM tokens); without it the
    # default server answers `error`, and `test` shows the route served with such a model
    requires_model: str | None = None


class SpeculativeEntry(msgspec.Struct, forbid_unknown_fields=True):
    kind: Literal["request_field", "server_flag"]
    id: str
    state: State
    notes: str
    test: str | None = None
    served_as: str | None = None


class Routes(msgspec.Struct, forbid_unknown_fields=True):
    schema_version: Literal[1]
    entries: list[RouteEntry]


class Speculative(msgspec.Struct, forbid_unknown_fields=True):
    schema_version: Literal[1]
    entries: list[SpeculativeEntry]


def load(name: str, root: Path = MANIFEST) -> object:
    return json.loads((root / name).read_text())


def routes(root: Path = MANIFEST) -> list[RouteEntry]:
    return msgspec.convert(load("routes.json", root), Routes).entries


def claimed(states: set[str]) -> list[RouteEntry]:
    return [e for e in routes() if e.state in states]


def concrete(path: str) -> str:
    return re.sub(r":\w+", "0", path)
