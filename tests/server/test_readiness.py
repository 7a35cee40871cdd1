"""The readiness guard: while the engine loads, guarded routes answer 503 in llama-server's envelope
(Ollama's routes in Ollama's, `{"error": "..."}`) and the introspection routes that need no model
still answer.

The engine is real but never started (the client runs no lifespan), so it stays LOADING.
"""

from __future__ import annotations

import pytest
from litestar.testing import TestClient

from app.profiles import resolve
from app.server.app import create_app
from app.server.engine_view import Engine

LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
OLLAMA_LOADING = {"error": "Loading model"}  # Ollama's routes answer every error in Ollama's shape
# the chat page at / is a static file: it loads, and says the server is loading, while models load
ANSWER_WHILE_LOADING = {"/", "/favicon.ico", "/props", "/models", "/v1/models", "/v1/models/{model_id:path}"}


APP = create_app(Engine(resolve("target-only").settings))


@pytest.fixture(scope="module")
def loading_client():
    return TestClient(APP)  # not entered: no lifespan, so the engine never starts


def guarded() -> list[str]:
    """Every route the app serves but the schema, the refusals (501) and those that answer anyway."""
    found = []
    for route in APP.routes:
        for method, (handler, _) in getattr(route, "route_handler_map", {}).items():
            skipped = route.path in ANSWER_WHILE_LOADING or route.path.startswith("/schema")
            if method not in ("HEAD", "OPTIONS") and handler.status_code != 501 and not skipped:
                found.append(f"{method} {route.path}")
    return sorted(found)


@pytest.mark.parametrize("route", guarded())
def test_guarded_routes_answer_503_while_loading(loading_client, route: str) -> None:
    method, path = route.split(" ")
    body = {"json": {"prompt": "x"}} if method == "POST" else {}
    response = loading_client.request(method, path, **body)
    assert response.status_code == 503, response.text
    assert response.json() == (OLLAMA_LOADING if path.startswith("/api/") else LOADING)


def test_props_and_models_answer_while_loading(loading_client) -> None:
    props = loading_client.get("/props").json()
    assert props["default_generation_settings"]["n_ctx"] is None and props["chat_template"] is None
    assert props["mlxcel"]["profile"] == "target-only"
    entry = loading_client.get("/v1/models").json()["data"][0]
    assert set(entry["meta"]) == {"path"}  # n_vocab and n_ctx_train appear once the model is loaded
    retrieved = loading_client.get(f"/v1/models/{entry['id']}").json()
    assert retrieved | {"created": 0} == entry | {"created": 0}  # created is the clock's second
