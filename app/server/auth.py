"""The API key gate: with server.api_key set, every route but health needs `Bearer <key>`.

OPTIONS never needs it, as in llama-server: browsers send no Authorization header on a CORS
preflight, and the answer names only the allowed methods.
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
    scheme, _, token = connection.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise ApiError(401, "Invalid API Key", "authentication_error")
