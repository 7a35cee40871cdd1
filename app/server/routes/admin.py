"""POST /admin/reload: hot profile reload over HTTP (mlxcel's own route; off unless the profile
turns it on with `server.admin_reload`, which needs `server.api_key`: the key guards it)."""

from __future__ import annotations

import asyncio

from litestar import Controller, post
from litestar.datastructures import State

from app.server import shaping
from app.server.engine_view import EngineView, ReloadRefusedError, require_ready
from app.server.errors import ApiError
from app.server.openapi import error
from app.server.responses import Reloaded


class AdminController(Controller):
    tags = ("admin",)

    @post(
        "/admin/reload",
        name="admin-reload",
        status_code=200,
        guards=[require_ready],
        responses={
            403: error("server.admin_reload is off in the serving profile"),
            409: error("refused: the old profile goes on serving; the message is the one-line reason"),
        },
    )
    async def reload(self, state: State) -> Reloaded:
        """Re-read the profile (file, environment, flags), build its engine beside the serving one,
        then send new requests to it; in-flight requests finish on the old one. Answers when done."""
        reloader = state.reloader
        if reloader is None or not state.settings.server.admin_reload:
            raise ApiError(
                403,
                "reload over HTTP is off: set server.admin_reload = true (with server.api_key), or send SIGHUP",
                "permission_error",
            )
        try:
            engine = await asyncio.to_thread(reloader.reload, "http")
        except ReloadRefusedError as exc:
            raise ApiError(409, f"reload refused: {exc}", "invalid_request_error") from exc
        return shaping.reloaded(EngineView(engine))
