"""The router in process: the app over a real Router and real engines: idle models unloaded, a
slow load answered 503 with Retry-After, a reload of one model."""

from __future__ import annotations

import time
from pathlib import Path

from litestar.testing import TestClient

from app.engine.router import Router
from app.profiles import resolve
from app.profiles.routing import routed_profiles
from app.profiles.tenants import Tenants
from app.server.app import create_app
from tests.support.cli import write

IDLE = '[router]\nidle_unload_s = 0.3\n[[router.models]]\nprofile = "target-only"\n'


def router_of(tmp_path: Path, text: str) -> Router:
    resolved = resolve(str(write(tmp_path, "router", text)))
    return Router(routed_profiles(resolved), resolved.settings, Tenants.of(resolved.settings.server))


def status(client: TestClient) -> str:
    return client.get("/v1/models").json()["data"][0]["status"]["value"]


def test_an_idle_model_is_unloaded_and_loads_again_on_use(tmp_path: Path) -> None:
    with TestClient(create_app(router_of(tmp_path, IDLE)), timeout=60) as client:
        assert status(client) == "unloaded"  # nothing loads before a request names it
        body = {"model": "target-only", "prompt": "x", "n_predict": 1}
        assert client.post("/completion", json=body).status_code == 200
        deadline = time.monotonic() + 10
        while status(client) != "unloaded":
            assert time.monotonic() < deadline, "the idle model stayed loaded"
            time.sleep(0.05)
        again = client.post("/completion", json=body)
        assert again.status_code == 200, again.text
        assert status(client) == "loaded"


def test_a_load_past_its_wait_answers_503_with_retry_after(tmp_path: Path) -> None:
    text = '[router]\nload_wait_s = 0.001\n[[router.models]]\nprofile = "target-only"\n'
    with TestClient(create_app(router_of(tmp_path, text)), timeout=60) as client:
        body = {"prompt": "x", "n_predict": 1}  # no model: the first
        waited = client.post("/completion", json=body)
        assert waited.status_code == 503
        assert waited.headers["retry-after"] == "1"
        assert waited.json()["error"]["message"] == "model 'target-only' is loading; try again"
        assert status(client) == "loading"
        deadline = time.monotonic() + 30
        while status(client) != "loaded":
            assert time.monotonic() < deadline, "the model did not load"
            time.sleep(0.05)
        assert client.post("/completion", json=body).status_code == 200


def test_a_reload_swaps_the_named_model_alone(tmp_path: Path) -> None:
    models = "".join(f'[[router.models]]\nprofile = "target-only"\nname = "{name}"\n' for name in "ab")
    text = '[server]\napi_key = "k"\nadmin_reload = true\n' + models
    router = router_of(tmp_path, text)
    with TestClient(create_app(router), timeout=60) as client:
        client.headers["Authorization"] = "Bearer k"
        for model in ("a", "b"):
            assert client.post("/completion", json={"model": model, "prompt": "x", "n_predict": 1}).status_code == 200
        before = [route.switch.current for route in router.routes]
        reloaded = client.post("/admin/reload", json={"model": "b"})
        assert reloaded.status_code == 200, reloaded.text
        after = [route.switch.current for route in router.routes]
        assert after[0] is before[0] and after[1] is not before[1]
        assert client.post("/admin/reload", json={"model": "c"}).status_code == 404
