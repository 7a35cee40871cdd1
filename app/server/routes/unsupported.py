"""llama-server routes this server answers with a clear 501 (compat/ records why)."""

from __future__ import annotations

from litestar import Controller, Request, route

from app.server.errors import ApiError

NO_RERANKER = "reranking needs a reranker checkpoint; not served"
REASONS = {
    "/infill": "fill-in-the-middle needs a model trained with FIM tokens; use /completion",
    "/rerank": NO_RERANKER,
    "/reranking": NO_RERANKER,
    "/v1/rerank": NO_RERANKER,
    "/v1/reranking": NO_RERANKER,
    # by design: one process, one profile
    "/models/load": "one server serves one profile; start another profile instead (docs/deployment.md)",
    "/models/unload": "one server serves one profile; stop its process instead (docs/deployment.md)",
}
SLOT_ACTIONS = "slot save/restore/erase is not supported: rows hold no reusable prompt cache"
LORA = "adapters are fused offline (mlx_lm.fuse) and selected by profile; they cannot be switched at run time"


def refuse(request: Request, reason: str) -> ApiError:
    return ApiError(501, f"{request.url.path}: {reason}", "not_supported_error")


class UnsupportedController(Controller):
    tags = ("unsupported",)

    @route(list(REASONS), http_method=["POST"], status_code=501, name="unsupported")
    async def unsupported(self, request: Request) -> None:
        raise refuse(request, REASONS[request.scope["path_template"]])

    @route("/slots/{id_slot:int}", http_method=["POST"], status_code=501, name="slot-actions")
    async def slot_actions(self, request: Request) -> None:
        raise refuse(request, SLOT_ACTIONS)

    @route("/lora-adapters", http_method=["GET", "POST"], status_code=501, name="lora-adapters")
    async def lora_adapters(self, request: Request) -> None:
        raise refuse(request, LORA)
