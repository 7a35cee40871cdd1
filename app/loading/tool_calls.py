"""How a model's output spells tool calls: one or more `<tool_call>` blocks, as Hermes-style chat
templates (Qwen's, the embedded pair's) ask for, or one bare JSON object or array.

The chat pipeline reports calls from these values (app/server/chat/tools.py) and the load-time tool
probe asks the same question of the model's answer (app/engine/tool_probe.py), so what the probe
finds is what a request's `auto` would report.
"""

from __future__ import annotations

import json
import re
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
