"""The API key gate: with keys configured, every route but the public ones needs one of them,
and the key a request presents says which tenant it is (app/profiles/tenants.py).

As llama-server: health, the model list, the schema and the chat page are public (handlers with
opt={"public": True}); the key comes as `Authorization: Bearer KEY` or, Anthropic's spelling,
`x-api-key: KEY`. OPTIONS never needs it: browsers send no key on a CORS preflight, and the
answer names only the allowed methods. Without keys every request is the anonymous tenant's; so
is a request without a valid key on a public route, which starts no rows and shows no slots.
The admin routes take the server key alone (`require_server_key`).
"""

from __future__ import annotations

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from app.profiles.tenants import ANONYMOUS, Tenants
from app.server.errors import ApiError


def require_api_key(connection: ASGIConnection, handler: BaseRouteHandler) -> None:
    tenants: Tenants = connection.app.state.tenants
    tenant = None if tenants.open else tenants.identify(presented_key(connection))
    connection.state.tenant = tenant or ANONYMOUS
    if tenant or tenants.open or handler.opt.get("public") or connection.scope["method"] == "OPTIONS":
        return
    raise ApiError(401, "Invalid API Key", "authentication_error")


def require_server_key(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """The admin routes' guard, after require_api_key's: the server key (`server.api_key`) only.
    A tenant's key (`server.api_keys`, the key file) is a client of the API, not of the server:
    a valid key without the right, so 403 (OpenAI's `permission_error`); no key or a wrong one
    was already a 401."""
    if tenant_of(connection) != connection.app.state.tenants.server:
        message = "this route needs the server key (server.api_key); a tenant's key may not call it"
        raise ApiError(403, message, "permission_error")


def tenant_of(connection: ASGIConnection) -> str:
    """The tenant the guard identified for this request."""
    return connection.state.tenant


def presented_key(connection: ASGIConnection) -> str:
    """The Bearer token of Authorization; without that header (or with it empty), x-api-key, as
    llama-server reads them; else ""."""
    authorization = connection.headers.get("authorization", "").strip()
    if not authorization:
        return connection.headers.get("x-api-key", "").strip()
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""
