"""docs/log-events.md and app/events/ list the same events, each with the same keys and level: the
documented keys are the emitting function's keyword arguments, and what it logs is those keys."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import types
import typing
from collections.abc import Callable

from structlog.testing import capture_logs

import app.events
from tests.support import ROOT

DOC = ROOT / "docs" / "log-events.md"
LINE_KEYS = {"event", "log_level"}  # every line's own (`level` once rendered)


def backticked(text: str) -> set[str]:
    return set(re.findall(r"`([a-z_0-9]+)`", text))


def outside_parentheses(text: str) -> str:
    while (inner := re.sub(r"\([^()]*\)", "", text)) != text:
        text = inner
    return text


def documented() -> dict[str, tuple[set[str], str]]:
    """Each event the page documents: its keys and its level. A section titled with events has a
    table of keys; a table with an `event` column has a row per event (`level`, `keys`), whose
    keys are named outside parentheses, or `as `other``."""
    events: dict[str, tuple[set[str], str]] = {}
    for section in re.split(r"^## ", DOC.read_text(), flags=re.MULTILINE)[1:]:
        heading, _, body = section.partition("\n")
        table = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in body.splitlines()]
        table = [row for row in table if len(row) > 1]
        if not table:
            continue
        header, rows = table[0], table[2:]  # the second is the |---| line
        if header[0] == "key":
            keys = set().union(*(backticked(row[0]) for row in rows))
            events |= dict.fromkeys(backticked(heading.partition("(")[0]), (keys, "info"))
            continue
        column = {name: i for i, name in enumerate(header)}
        for row in rows:
            (name,) = backticked(row[column["event"]])
            cell = row[column["keys"]]
            same = re.fullmatch(r"as `([a-z_0-9]+)`", cell)
            keys = events[same[1]][0] if same else backticked(outside_parentheses(cell))
            events[name] = (keys, row[column["level"]].split()[0])
    return events


def emitters() -> dict[str, Callable[..., None]]:
    """Every public function of the package's modules, by name (the event it emits)."""
    found = {}
    for info in pkgutil.iter_modules(app.events.__path__):
        module = importlib.import_module(f"app.events.{info.name}")
        for name, function in inspect.getmembers(module, inspect.isfunction):
            if function.__module__ == module.__name__ and not name.startswith("_"):
                found[name] = function
    return found


def keys_of(function: Callable[..., None]) -> dict[str, typing.Any]:
    """The function's keys and their types: its keyword-only arguments but `level`, and the fields
    of a `**fields: Unpack[TypedDict]`."""
    hints = typing.get_type_hints(function)
    keys = {}
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind is parameter.VAR_KEYWORD:
            (typed,) = typing.get_args(hints[parameter.name])
            keys |= typing.get_type_hints(typed)
        else:
            assert parameter.kind is parameter.KEYWORD_ONLY, (function.__name__, parameter.name)
            if parameter.name != "level":
                keys[parameter.name] = hints[parameter.name]
    return keys


def sample(hint: typing.Any) -> object:
    """A value of the type (never None, so optional keys appear too)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return sample(next(arg for arg in args if arg is not type(None)))
    if origin is typing.Literal:
        return args[0]
    if origin in (list, dict):
        return origin()
    if hint is BaseException:
        return RuntimeError("sampled")
    return {str: "x", int: 1, float: 1.0, bool: True}[hint]


def test_the_page_and_the_package_list_the_same_events() -> None:
    assert sorted(documented()) == sorted(emitters())


def test_each_event_has_the_documented_keys_and_level() -> None:
    pages = documented()
    for name, function in emitters().items():
        keys, level = pages[name]
        assert set(keys_of(function)) == keys, name
        with capture_logs() as logs:
            function(**{key: sample(hint) for key, hint in keys_of(function).items()})
        (line,) = logs
        assert line["event"] == name and line["log_level"] == level, (name, line)
        logged = {"exception" if key == "exc_info" else key for key in line} - LINE_KEYS
        assert logged == keys, name
