"""How a model's output spells tool calls: one or more `<tool_call>` blocks, as Hermes-style chat
templates (Qwen's, the embedded pair's) ask for, or one bare JSON object or array.

The chat pipeline reports calls from these values (app/server/chat/tools.py) and the load-time tool
probe asks the same question of the model's answer (app/engine/tool_probe.py), so what the probe
finds is what a request's `auto` would report.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

TAGS = ("<tool_call>", "</tool_call>")
TAGGED = re.compile(r"\s*<tool_call>(.*?)</tool_call>\s*", re.DOTALL)


def call_objects(text: str) -> list[Any] | None:
    """The JSON values the output spells: `<tool_call>` blocks, or one object or array (None:
    the text is not wholly such values)."""
    body = text.strip()
    if body.startswith(TAGS[0]):
        blocks = TAGGED.findall(body)
        if TAGGED.sub("", body):  # text outside the blocks: an answer that mentions calls
            return None
        values = [_json(block) for block in blocks]
        return None if any(value is None for value in values) else values
    value = _json(body)
    if isinstance(value, list):
        return value
    return None if value is None else [value]


def is_call(call: Any, names: tuple[str, ...]) -> bool:
    """Whether a value is a call `{"name", "arguments"}` of one of `names` with object arguments."""
    return (
        isinstance(call, dict)
        and set(call) == {"name", "arguments"}
        and call["name"] in names
        and isinstance(call["arguments"], dict)
    )


def may_become_calls(text: str) -> bool:
    """Whether text so far could still be the start of calls (`auto` holds it back until it cannot)."""
    body = text.lstrip()
    return not body or body[0] in "{[" or body.startswith(TAGS[0]) or TAGS[0].startswith(body)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


# --- a call cut by the token limit --------------------------------------------------------------

_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_LITERALS = {"true": True, "false": False, "null": None}
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class _CutError(Exception):
    """The text ends inside a value."""


@dataclass
class Member:
    """One member of an object read from a cut text: where its value starts and whether it ended."""

    start: int
    whole: bool


@dataclass
class PartialJson:
    """A JSON text that may stop anywhere, read as far as it goes: each value that began is kept
    as far as it got (a string's characters so far, an object's whole members and the one cut),
    a key or literal cut before its value began is dropped. `members[id(obj)]` says, for each key
    of an object read, where its value starts in the text and whether it was whole."""

    text: str
    at: int = 0
    members: dict[int, dict[str, Member]] = field(default_factory=dict)

    def value(self) -> tuple[Any, bool]:
        """(the value so far, whether it was whole); _CutError when none began, ValueError when not JSON."""
        self._space()
        if self.at >= len(self.text):
            raise _CutError
        head = self.text[self.at]
        if head == "{":
            return self._object()
        if head == "[":
            return self._array()
        if head == '"':
            return self._string()
        match = _NUMBER.match(self.text, self.at)
        if match and match.end() < len(self.text):
            self.at = match.end()
            return json.loads(match.group()), True
        if match or self.text[self.at :] == "-":
            raise _CutError  # a number may go on: only its whole digits would count, and none are known whole
        for word, literal in _LITERALS.items():
            if self.text.startswith(word, self.at):
                self.at += len(word)
                return literal, True
            if word.startswith(self.text[self.at :]):
                raise _CutError
        raise ValueError(f"not JSON at {self.at}")

    def _space(self) -> None:
        while self.at < len(self.text) and self.text[self.at] in " \t\r\n":
            self.at += 1

    def _string(self) -> tuple[str, bool]:
        self.at += 1
        out = []
        while self.at < len(self.text):
            char = self.text[self.at]
            if char == '"':
                self.at += 1
                return "".join(out), True
            if char == "\\":
                escape = self.text[self.at + 1 : self.at + 2]
                if escape == "u":
                    digits = self.text[self.at + 2 : self.at + 6]
                    if len(digits) < 4:
                        break
                    out.append(chr(int(digits, 16)))
                    self.at += 6
                    continue
                if not escape:
                    break
                out.append(_ESCAPES[escape])
                self.at += 2
                continue
            out.append(char)
            self.at += 1
        self.at = len(self.text)
        return "".join(out), False

    def _object(self) -> tuple[dict[str, Any], bool]:
        self.at += 1
        found: dict[str, Any] = {}
        members = self.members.setdefault(id(found), {})
        while True:
            self._space()
            if self.at >= len(self.text):
                return found, False
            if self.text[self.at] == "}" and not found:
                self.at += 1
                return found, True
            if self.text[self.at] != '"':
                raise ValueError(f"not JSON at {self.at}")
            key, whole = self._string()
            self._space()
            if not whole or self.at >= len(self.text):
                return found, False  # a key cut before its value began
            if self.text[self.at] != ":":
                raise ValueError(f"not JSON at {self.at}")
            self.at += 1
            self._space()
            start = self.at
            try:
                found[key], whole = self.value()
            except _CutError:
                return found, False
            members[key] = Member(start, whole)
            if not whole:
                return found, False
            self._space()
            if self.at >= len(self.text):
                return found, False
            if self.text[self.at] == "}":
                self.at += 1
                return found, True
            if self.text[self.at] != ",":
                raise ValueError(f"not JSON at {self.at}")
            self.at += 1

    def _array(self) -> tuple[list[Any], bool]:
        self.at += 1
        found: list[Any] = []
        while True:
            self._space()
            if self.at >= len(self.text):
                return found, False
            if self.text[self.at] == "]" and not found:
                self.at += 1
                return found, True
            try:
                item, whole = self.value()
            except _CutError:
                return found, False
            found.append(item)
            if not whole:
                return found, False
            self._space()
            if self.at >= len(self.text):
                return found, False
            if self.text[self.at] == "]":
                self.at += 1
                return found, True
            if self.text[self.at] != ",":
                raise ValueError(f"not JSON at {self.at}")
            self.at += 1


def partial_json(text: str) -> Any:
    """A JSON text cut anywhere, as far as it got (`PartialJson`); None where no value began or
    the text is not the start of JSON."""
    try:
        return PartialJson(text).value()[0]
    except (_CutError, ValueError):
        return None


@dataclass(frozen=True)
class BegunCall:
    """A call read from an output its token limit cut: its tool's name and its arguments so far,
    as an object (`arguments`) and as the text the model wrote (`text`, cut where the output was)."""

    name: str
    arguments: dict[str, Any]
    text: str


def begun_calls(text: str, names: tuple[str, ...], known_name: bool = False) -> list[BegunCall] | None:
    """The calls an output cut by its token limit had written or begun: whole `<tool_call>` blocks
    or array items and the one cut, each a call `{"name", "arguments"}` of one of `names`. A call
    cut before its name is whole is that of the one tool whose name starts so; with `known_name`
    (a forced call of one tool) a call cut before its name began is that tool's. None: the output
    had begun no call (it is text, or JSON that is no call)."""
    body = text.lstrip()
    if body.startswith(TAGS[0]):
        pieces = body.split(TAGS[0])[1:]
        found = [_begun(piece.split(TAGS[1])[0], names, known_name) for piece in pieces]
        after = [piece.split(TAGS[1], 1)[1].strip() for piece in pieces if TAGS[1] in piece]
        if any(rest and not (rest is after[-1] and TAGS[0].startswith(rest)) for rest in after):
            return None  # text after a block (but the start of the next one): an answer that mentions calls
    else:
        reader = PartialJson(body)
        try:
            value, _ = reader.value()
        except (_CutError, ValueError):
            value = None
        if isinstance(value, list) and body.startswith("["):
            found = [_read(reader, item, names, known_name) for item in value] or [_named(names, known_name)]
        elif isinstance(value, dict):
            found = [_read(reader, value, names, known_name)]
        else:
            found = [_named(names, known_name) if not body else None]
    calls = [call for call in found if call is not None]
    return calls if calls and len(calls) == len(found) else None


def _begun(piece: str, names: tuple[str, ...], known_name: bool) -> BegunCall | None:
    reader = PartialJson(piece)
    try:
        value, _ = reader.value()
    except (_CutError, ValueError):
        return _named(names, known_name)
    return _read(reader, value, names, known_name)


def _named(names: tuple[str, ...], known_name: bool) -> BegunCall | None:
    """A call cut before anything of it: only a forced call of one tool is known."""
    return BegunCall(names[0], {}, "") if known_name and len(names) == 1 else None


def _read(reader: PartialJson, value: Any, names: tuple[str, ...], known_name: bool) -> BegunCall | None:
    if not isinstance(value, dict) or not set(value) <= {"name", "arguments"}:
        return None
    members = reader.members.get(id(value), {})
    name = value.get("name")
    if name is None:
        if not known_name or len(names) != 1:
            return None
        name = names[0]
    elif not isinstance(name, str):
        return None
    elif not members["name"].whole:
        matching = [known for known in names if known.startswith(name)]
        if len(matching) != 1:
            return None
        name = matching[0]
    if name not in names:
        return None
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict):
        return None
    where = members.get("arguments")
    if where is None:
        written = ""
    elif where.whole:
        written = json.dumps(arguments, ensure_ascii=False)
    else:
        written = reader.text[where.start :]
    return BegunCall(name, arguments, written)
