"""What the server is and does: health, models, /props, /slots and /metrics."""

from __future__ import annotations

from litestar import Controller, get, post
from litestar.di import NamedDependency

from app.server import shaping
from app.server.engine_view import EngineView, require_ready
from app.server.errors import ApiError
from app.server.metrics import CONTENT_TYPE, exposition
from app.server.responses import Health, ModelList, Props, Slot


class IntrospectionController(Controller):
    tags = ("introspection",)

    @get(["/health", "/v1/health"], name="health", guards=[require_ready], opt={"public": True})
    async def health(self) -> Health:
        """200 {"status": "ok"} while serving; 503 in the error envelope while loading, draining or failed."""
        return Health()

    @get(["/v1/models", "/models"], name="models")
    async def models(self, engine: NamedDependency[EngineView]) -> ModelList:
        """The one model this server serves (its size facts once it is loaded)."""
        return shaping.model_list(engine)

    @get("/props", name="props")
    async def props(self, engine: NamedDependency[EngineView]) -> Props:
        """The profile, its drafter, the plan's rules and the sampling defaults (also while loading)."""
        return shaping.props(engine)

    @post("/props", status_code=501, name="props-update")
    async def update_props(self) -> None:
        """Refused (here, not with the other refusals: two controllers cannot share a path)."""
        raise ApiError(501, "/props: settings change per profile at startup, not at run time", "not_supported_error")

    @get("/slots", name="slots", guards=[require_ready])
    async def slots(self, engine: NamedDependency[EngineView]) -> list[Slot]:
        """One entry per row; a busy row shows its request's settings and drafting so far."""
        return shaping.slots(engine)

    @get("/metrics", name="metrics", guards=[require_ready], media_type=CONTENT_TYPE)
    async def metrics(self, engine: NamedDependency[EngineView]) -> bytes:
        """Prometheus text with llama-server's metric names and the speculative counters."""
        return exposition(engine.metrics)
