"""llama-server routes this server answers with a clear 501 (compat/ records why)."""

from __future__ import annotations

from litestar import Request, route

from app.server.errors import ApiError

NOT_APPLICABLE = {
    "/infill": "fill-in-the-middle needs a model trained with FIM tokens; use /completion",
    "/embedding": "this server runs generative checkpoints only; embeddings are not served",
    "/embeddings": "this server runs generative checkpoints only; embeddings are not served",
    "/v1/embeddings": "this server runs generative checkpoints only; embeddings are not served",
    "/rerank": "reranking needs a reranker checkpoint; not served",
    "/reranking": "reranking needs a reranker checkpoint; not served",
    "/v1/rerank": "reranking needs a reranker checkpoint; not served",
    "/v1/reranking": "reranking needs a reranker checkpoint; not served",
    "/slots/{id_slot:int}": "slot save/restore/erase is not supported: rows hold no reusable prompt cache",
}
LORA = "adapters are fused offline (mlx_lm.fuse) and selected by profile; they cannot be switched at run time"
BY_DESIGN = {
    "/models/load": "one server serves one profile; start another profile instead (docs/deployment.md)",
    "/models/unload": "one server serves one profile; stop its process instead (docs/deployment.md)",
}


def _refusal(path: str, reason: str, name: str) -> object:
    @route(path, http_method=["POST"], name=name)
    async def refuse(request: Request) -> None:
        raise ApiError(501, f"{request.url.path}: {reason}", "not_supported_error")

    return refuse


@route("/props", http_method=["POST"], name="props-update")
async def update_props(request: Request) -> None:
    raise ApiError(501, "/props: settings change per profile at startup, not at run time", "not_supported_error")


@route("/lora-adapters", http_method=["GET", "POST"], name="lora-adapters")
async def lora_adapters(request: Request) -> None:
    raise ApiError(501, f"/lora-adapters: {LORA}", "not_supported_error")


ROUTES = [
    *(_refusal(path, reason, f"not-applicable:{path}") for path, reason in NOT_APPLICABLE.items()),
    *(_refusal(path, reason, f"by-design:{path}") for path, reason in BY_DESIGN.items()),
    update_props,
    lora_adapters,
]
