"""The API key gate: with server.api_key set, every route but the public ones needs the key.

As llama-server: health, the model list and the schema are public (handlers with
opt={"public": True}); the key comes as `Authorization: Bearer KEY` or, Anthropic's spelling,
`x-api-key: KEY`. OPTIONS never needs it: browsers send no key on a CORS preflight, and the
answer names only the allowed methods.
"""

from __future__ import annotations

import hmac

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from app.server.errors import ApiError


def require_api_key(connection: ASGIConnection, handler: BaseRouteHandler) -> None:
    key = connection.app.state.settings.server.api_key
    if not key or handler.opt.get("public") or connection.scope["method"] == "OPTIONS":
        return
    if not hmac.compare_digest(presented_key(connection).encode(), key.encode()):
        raise ApiError(401, "Invalid API Key", "authentication_error")


def presented_key(connection: ASGIConnection) -> str:
    """The Bearer token of Authorization; without that header (or with it empty), x-api-key, as
    llama-server reads them; else ""."""
    authorization = connection.headers.get("authorization", "").strip()
    if not authorization:
        return connection.headers.get("x-api-key", "").strip()
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""
