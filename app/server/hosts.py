"""The Host check: a server bound to loopback answers only requests that name it by a loopback
name, an IP address, its own `server.host` or a name `server.allowed_hosts` lists; others get 400. So
does a request with more than one Host (a proxy may route by one and the app read the other).

DNS rebinding: a web page on attacker.example makes its own name resolve to 127.0.0.1, and the
browser, which sees one origin, lets the page read what the local server answers. The request
still carries `Host: attacker.example`, and that is what this check refuses. A name the browser
cannot be pointed elsewhere with (an IP literal, `localhost` and `*.localhost`, which browsers
resolve to loopback themselves) is always served; `server.allowed_hosts` adds names (a reverse
proxy's public name) and turns the check on for other binds too; ["*"] turns it off.

An ASGI layer around the Litestar app, so that CORS preflights and unrouted paths are checked
too; it reads the live profile, so `allowed_hosts` follows a reload.
"""

from __future__ import annotations

import ipaddress

from litestar import Litestar
from litestar.types import ASGIApp, Receive, Scope, Send

from app.profiles.schema import ServerSettings
from app.server.errors import envelope_body, quoted

LOOPBACK_NAME = "localhost"


def is_loopback(host: str) -> bool:
    """A bind address that only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == LOOPBACK_NAME:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name of a Host header, lower case, without its port or a final dot ("[::1]" kept bracketed)."""
    name = header.strip().lower()
    if name.startswith("["):
        return name.partition("]")[0] + "]"
    return name.partition(":")[0].removesuffix(".")


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def listed(name: str, entries: list[str]) -> bool:
    for entry in entries:
        entry = entry.lower().removesuffix(".")
        if entry == "*" or name == entry or (entry.startswith("*.") and name.endswith(entry[1:])):
            return True
    return False


def host_allowed(name: str, server: ServerSettings) -> bool:
    if not (is_loopback(server.host) or server.allowed_hosts):
        return True  # a public bind with no list: anyone may name it anything
    return (
        not name  # no Host at all (HTTP/1.0): nothing a browser sends
        or is_ip_literal(name)
        or name == LOOPBACK_NAME
        or name.endswith("." + LOOPBACK_NAME)
        or name == server.host.lower()
        or listed(name, server.allowed_hosts)
    )


class HostCheck:
    def __init__(self, app: Litestar, serve: ASGIApp | None = None) -> None:
        self.app = app  # read for the live profile
        self.serve = serve or app  # what an allowed request goes on to (the app, or a layer around it)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.serve(scope, receive, send)
            return
        hosts = [value.decode("latin-1") for name, value in scope["headers"] if name == b"host"]
        if len(hosts) > 1:  # which one a proxy routed by and which one the app reads could differ
            await refuse(send, f"the request names {len(hosts)} Host headers; HTTP/1.1 allows one")
            return
        header = hosts[0] if hosts else ""
        if host_allowed(host_name(header), self.app.state.settings.server):
            await self.serve(scope, receive, send)
            return
        await refuse(
            send,
            f"Host {quoted(header)} is not a name of this server; add it to server.allowed_hosts "
            "(a proxy's public name), or name the server by localhost or its IP address",
        )


async def refuse(send: Send, message: str) -> None:
    body = envelope_body(400, message)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": body})
