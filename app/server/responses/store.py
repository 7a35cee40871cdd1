"""Stored responses: a stored response (`store`, the default) keeps its conversation, input and
output, in this process's memory, so a later request may continue it by `previous_response_id`;
each tenant has its own store, holding its last `server.responses_stored` responses within
`server.responses_store_mb` (its encoded conversations' bytes), so neither one tenant's traffic
evicts another's nor its size grows the server without bound."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import msgspec

from app.server.chat.request import ChatRequest
from app.server.errors import ApiError
from app.server.responses.requests import merged_calls
from app.server.responses.shapes import FunctionCallItem, OutputItem


class ResponseStore:
    """Stored conversations, encoded, by tenant and response id: each tenant's last `entries`
    within `max_bytes`, the oldest going first. A conversation larger than `max_bytes` alone is
    not kept (a later `previous_response_id` naming it is not found)."""

    def __init__(self, entries: int, max_bytes: int) -> None:
        self._entries = entries
        self._max_bytes = max_bytes
        self._held: dict[str, OrderedDict[str, bytes]] = {}
        self._bytes: dict[str, int] = {}
        self._lock = threading.Lock()

    def history(self, tenant: str, response_id: str | None) -> list[dict[str, Any]]:
        if response_id is None:
            return []
        with self._lock:
            found = self._held.get(tenant, {}).get(response_id)
        if found is None:
            raise ApiError(400, f"Previous response with id '{response_id}' not found (responses are kept in memory, "
                                f"each tenant's last {self._entries} within {self._max_bytes} bytes, and only when "
                                "stored)")  # fmt: skip
        return msgspec.json.decode(found)

    def keep(self, tenant: str, response_id: str, conversation: list[dict[str, Any]]) -> None:
        encoded = msgspec.json.encode(conversation)
        if len(encoded) > self._max_bytes:
            return
        with self._lock:
            held = self._held.setdefault(tenant, OrderedDict())
            held[response_id] = encoded
            self._bytes[tenant] = self._bytes.get(tenant, 0) + len(encoded)
            while len(held) > self._entries or self._bytes[tenant] > self._max_bytes:
                _, dropped = held.popitem(last=False)
                self._bytes[tenant] -= len(dropped)


def stored_conversation(data: ChatRequest, output: list[OutputItem]) -> list[dict[str, Any]]:
    """What a stored response continues from: its messages (not its instructions, which
    OpenAI does not carry over) and its output, as chat messages."""
    messages = [msgspec.to_builtins(m) for m in data.messages]
    if messages and messages[0]["role"] == "system":
        messages = messages[1:]  # instructions (input items' system messages are kept below)
    return merged_calls(messages + [output_message(item) for item in output])


def output_message(item: OutputItem) -> dict[str, Any]:
    if isinstance(item, FunctionCallItem):
        call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}
    return {"role": "assistant", "content": "".join(part.text for part in item.content)}
