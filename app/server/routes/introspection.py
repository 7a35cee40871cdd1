"""What the server is and does: health, models, /props, /slots and /metrics."""

from __future__ import annotations

from litestar import Controller, Request, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath

from app.server import shaping
from app.server.auth import tenant_of
from app.server.engine_view import EngineView, require_ready
from app.server.errors import ApiError
from app.server.metrics import CONTENT_TYPE, exposition
from app.server.openapi import error
from app.server.responses import Health, ModelEntry, ModelList, Props, Slot


class IntrospectionController(Controller):
    tags = ("introspection",)

    @get(["/health", "/v1/health"], name="health", guards=[require_ready], opt={"public": True})
    async def health(self) -> Health:
        """200 {"status": "ok"} while serving; 503 in the error envelope while loading, draining or failed."""
        return Health()

    # public, as in llama-server: a client may list the model before it has the key
    @get(["/v1/models", "/models"], name="models", opt={"public": True})
    async def models(self, engine: NamedDependency[EngineView]) -> ModelList:
        """The one model this server serves (its size facts once it is loaded)."""
        return shaping.model_list(engine)

    @get(
        "/v1/models/{model_id:path}",
        name="model",
        opt={"public": True},
        responses={404: error("an id other than the served model's")},
    )
    async def model(self, engine: NamedDependency[EngineView], model_id: FromPath[str]) -> ModelEntry:
        """OpenAI's models.retrieve: the served model by its id; any other id is a 404."""
        entry = shaping.model_entry(engine)
        wanted = model_id.removeprefix("/")
        if wanted != entry.id:
            raise ApiError(404, f"The model {wanted!r} does not exist; this server serves {entry.id!r}")
        return entry

    @get("/props", name="props")
    async def props(self, engine: NamedDependency[EngineView]) -> Props:
        """The profile, its drafter, the plan's rules and the sampling defaults (also while loading)."""
        return shaping.props(engine)

    @post("/props", status_code=501, name="props-update")
    async def update_props(self) -> None:
        """Refused (here, not with the other refusals: two controllers cannot share a path)."""
        raise ApiError(501, "/props: settings change per profile at startup, not at run time", "not_supported_error")

    @get("/slots", name="slots", guards=[require_ready])
    async def slots(self, request: Request, engine: NamedDependency[EngineView]) -> list[Slot]:
        """One entry per row; a busy row of the caller's tenant shows its request's settings and
        drafting so far, another tenant's only that it is busy."""
        return shaping.slots(engine, tenant_of(request))

    @get("/metrics", name="metrics", guards=[require_ready], media_type=CONTENT_TYPE)
    async def metrics(self, request: Request, engine: NamedDependency[EngineView]) -> bytes:
        """Prometheus text: llama-server's metric names, the speculative counters, latency
        histograms, requests by route and status, process metrics (docs/operations.md)."""
        return exposition(engine.metrics, request.app.state.http_metrics)
