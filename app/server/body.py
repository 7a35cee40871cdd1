"""Reading JSON bodies strictly: invalid UTF-8 and excessive nesting are the client's error (400).

Litestar decodes a body with msgspec, whose UnicodeDecodeError and RecursionError are not
decoding errors to Litestar and would surface as 500s. The nesting limit is
`server.max_json_depth`; msgspec itself gives up near Python's recursion limit.
"""

from __future__ import annotations

from typing import Any

from litestar import Request

from app.server.errors import ApiError


class StrictJsonRequest(Request):
    async def json(self) -> Any:
        limit = self.app.state.engine.settings.server.max_json_depth
        try:
            value = await super().json()
        except UnicodeDecodeError as exc:
            raise ApiError(400, f"the request body is not valid UTF-8 (byte {exc.start})") from exc
        except RecursionError as exc:
            raise ApiError(400, too_deep_message(limit)) from exc
        body = await self.body()
        # Brackets bound the depth from above, so most bodies skip the walk.
        if body.count(b"[") + body.count(b"{") > limit and deeper_than(value, limit):
            raise ApiError(400, too_deep_message(limit))
        return value


def too_deep_message(limit: int) -> str:
    return f"the JSON body nests deeper than {limit} levels (server.max_json_depth)"


def deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` levels (iterative: no recursion limit)."""
    stack = [(value, 1)] if isinstance(value, list | dict) else []
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, list | dict))
    return False
