"""The HTTP surface clients meet before any generation: the model object, CORS, the API key's
public routes and header spellings, the OpenAPI schema and its page, and the llama-server
details of chat streaming, chat history and ignore_eos. Real servers, httpx and the OpenAI SDK."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.support.server import API_KEY, sse_frames

PUBLIC = ("/health", "/v1/health", "/models", "/v1/models", "/schema", "/schema/openapi.json")
TWO_ASSISTANTS = "Cannot have 2 or more assistant messages at the end of the list."  # llama-server's words
ALLOWED_ORIGIN = "http://app.example"  # the keyed server's server.cors_origins (tests/conftest.py)


def preflight(http: httpx.Client, origin: str, path: str = "/v1/chat/completions") -> httpx.Response:
    headers = {"Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "x-api-key"}
    return http.options(path, headers=headers)


def test_models_retrieve_through_the_openai_sdk(default_server) -> None:
    client = openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused")
    listed = client.models.list().data[0]
    model = client.models.retrieve(listed.id)
    assert (model.id, model.object, model.owned_by) == (listed.id, "model", "mlxcel")
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("no-such-model")
    assert missing.value.body["type"] == "not_found_error"
    assert "'no-such-model' does not exist" in missing.value.body["message"]


def test_cors_answers_any_origin_with_a_star_and_no_credentials_by_default(default_server) -> None:
    origin = "https://anywhere.example:8443"
    with default_server.client() as http:
        answer = preflight(http, origin)
        assert answer.status_code == 200  # llama-server answers a preflight 200
        assert answer.headers["access-control-allow-origin"] == "*"
        assert "access-control-allow-credentials" not in answer.headers
        assert answer.headers["access-control-allow-methods"] == "GET, POST"
        simple = http.get("/v1/models", headers={"Origin": origin})
        assert simple.headers["access-control-allow-origin"] == "*"
        assert "access-control-allow-credentials" not in simple.headers


@pytest.mark.slow
def test_with_a_key_preflight_and_public_routes_need_none_and_x_api_key_is_accepted(keyed_server) -> None:
    with keyed_server.client() as http:
        answer = preflight(http, ALLOWED_ORIGIN)
        assert answer.status_code == 200, answer.text
        assert answer.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
        assert answer.headers["access-control-allow-credentials"] == "true"
        assert "x-api-key" in answer.headers["access-control-allow-headers"]
        model_id = http.get("/v1/models").json()["data"][0]["id"]
        for path in (*PUBLIC, f"/v1/models/{model_id}"):
            assert http.get(path).status_code == 200, path
        for headers in ({}, {"x-api-key": "wrong"}, {"Authorization": "Bearer wrong", "x-api-key": API_KEY}):
            assert http.get("/props", headers=headers).status_code == 401, headers
        assert http.get("/props", headers={"x-api-key": API_KEY}).status_code == 200
        assert http.get("/props", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200


@pytest.mark.slow
def test_origins_outside_the_profile_list_get_no_cors_headers(keyed_server) -> None:
    with keyed_server.client() as http:
        assert preflight(http, "https://sub.example.org").headers["access-control-allow-origin"] == (
            "https://sub.example.org"  # the list's "https://*.example.org"
        )
        assert preflight(http, "http://evil.example").status_code == 400
        simple = http.get("/health", headers={"Origin": "http://evil.example"})
        assert simple.status_code == 200 and "access-control-allow-origin" not in simple.headers


# Bodies read as any JSON and checked by hand, as llama-server reads them (app/server/core/adapters.py:
# an entry without a scale is scale 0, which a typed body would refuse)
READ_AS_LLAMA_SERVER_READS = {"POST /lora-adapters"}


def test_the_schema_page_and_every_route_typed(target_only_server) -> None:
    with target_only_server.client() as http:
        page = http.get("/schema")
        schema = http.get("/schema/openapi.json").json()
        assert http.get("/schema/oauth2-redirect.html").status_code == 200  # the Swagger plugin's page
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "swagger-ui" in page.text and '"title":"mlxcel"' in page.text  # Swagger UI over this schema
    envelope = {"$ref": "#/components/schemas/ErrorEnvelope"}
    ollama = {"$ref": "#/components/schemas/OllamaError"}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            where = f"{method.upper()} {path}"
            responses = operation["responses"]
            for code, response in responses.items():
                typed = response["content"]
                if code.startswith(("4", "5")):  # Ollama's routes answer Ollama's own {"error": "..."}
                    shape = ollama if path.startswith("/api/") else envelope
                    assert typed == {"application/json": {"schema": shape}}, (where, code)
                else:
                    assert all("$ref" in t["schema"] or "type" in t["schema"] or "oneOf" in t["schema"]
                               for t in typed.values()), (where, code)  # fmt: skip
            if "requestBody" in operation and where not in READ_AS_LLAMA_SERVER_READS:
                body = operation["requestBody"]["content"]["application/json"]["schema"]
                assert body["$ref"].endswith("Request"), where
    assert schema["paths"]["/v1/models/{model_id}"]["get"]["responses"]["200"]["content"]["application/json"] == {
        "schema": {"$ref": "#/components/schemas/ModelEntry"}
    }
    for route in ("/completion", "/v1/completions", "/v1/chat/completions", "/tokenize", "/apply-template"):
        assert "requestBody" in schema["paths"][route]["post"], route


def test_the_first_chat_chunk_has_null_content(default_server) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
    with default_server.client() as http, http.stream("POST", "/v1/chat/completions", json=body) as response:
        frames = sse_frames(response)
    assert frames[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert all("content" not in f["choices"][0]["delta"] or f["choices"][0]["delta"]["content"] is not None
               for f in frames[1:-1] if f["choices"])  # fmt: skip


def test_two_trailing_assistant_messages_get_400(default_server) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}]
    with default_server.client() as http:
        for route in ("/v1/chat/completions", "/apply-template"):
            refused = http.post(route, json={"messages": [*messages, {"role": "assistant", "content": "b"}]})
            assert refused.status_code == 400, route
            assert refused.json()["error"]["message"] == TWO_ASSISTANTS
        # one trailing assistant message is accepted, as by llama-server
        assert http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2}).status_code == 200


def test_ignore_eos_bans_every_end_token_and_shows_it_in_logit_bias(default_server) -> None:
    request = {"prompt": "x", "n_predict": 8, "temperature": 0, "return_tokens": True, "logit_bias": {"5": 1.5}}
    with default_server.client() as http:
        plain = http.post("/completion", json=request).json()
        ignoring = http.post("/completion", json={**request, "ignore_eos": True}).json()
        im_end = http.post("/tokenize", json={"content": "<|im_end|>"}).json()["tokens"]
    assert plain["generation_settings"]["logit_bias"] == [{"bias": 1.5, "token": 5}]
    own, *banned = ignoring["generation_settings"]["logit_bias"]
    assert own == {"bias": 1.5, "token": 5}  # the request's own first, then the end tokens, as llama-server
    assert banned and all(entry["bias"] is None for entry in banned)  # -inf, written null as llama-server does
    ends = {entry["token"] for entry in banned}
    assert set(im_end) <= ends
    assert len(ignoring["tokens"]) == 8 and not ends & set(ignoring["tokens"])
