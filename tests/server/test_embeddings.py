"""Embeddings: the target's pooled hidden states over /v1/embeddings (the OpenAI SDK) and /embedding,
off unless server.embeddings is on (then a 404 the SDK does not retry)."""

from __future__ import annotations

import base64
import json
import struct

import httpx
import mlx.core as mx
import openai
import pytest

from app.execution.embedding import CHUNK, embeddings
from app.execution.model import LoadedModel
from app.profiles import ProfileError, resolve
from tests.support.server import serve

TEXTS = ["hello world", "def merge_sorted(left, right):"]


def embedding(target: LoadedModel, tokens: list[int], pooling: str) -> list[list[float]]:
    """One prompt's rows (its vector, or with pooling `none` one per token), its chunks run back to
    back (as the engine runs them between ticks)."""
    steps = embeddings(target, [tokens], pooling)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value[0]


@pytest.fixture(scope="module")
def embedding_server(tmp_path_factory):
    env = {"MLXCEL_SERVER__EMBEDDINGS": "true"}
    with serve(tmp_path_factory.mktemp("embeddings"), "--profile", "default", env=env) as server:
        yield server


def sdk(server, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", **kw)


@pytest.mark.slow
def test_openai_sdk_embeddings_float_base64_lists_and_token_ids(embedding_server) -> None:
    client = sdk(embedding_server, max_retries=0)
    both = client.embeddings.create(model="target", input=TEXTS)  # the SDK asks for base64 and decodes it
    floats = client.embeddings.create(model="target", input=TEXTS, encoding_format="float")
    assert [d.index for d in both.data] == [0, 1]
    dimension = len(floats.data[0].embedding)
    assert dimension == 256  # the embedded target's hidden size
    for got, want in zip(both.data, floats.data, strict=True):
        assert got.embedding == pytest.approx(want.embedding, abs=1e-6)
        assert sum(v * v for v in want.embedding) == pytest.approx(1.0, abs=1e-5)  # normalised
    alone = [client.embeddings.create(model="target", input=t, encoding_format="float").data[0] for t in TEXTS]
    assert [a.embedding for a in alone] == [f.embedding for f in floats.data]  # a batch-mate changes nothing
    assert floats.data[0].embedding != floats.data[1].embedding
    with embedding_server.client() as http:
        ids = [http.post("/tokenize", json={"content": t, "add_special": True}).json()["tokens"] for t in TEXTS]
        raw = http.post("/v1/embeddings", json={"input": ids, "encoding_format": "base64"}).json()
        native = http.post("/embedding", json={"content": TEXTS[0]}).json()
    assert floats.usage.prompt_tokens == sum(map(len, ids))
    decoded = struct.unpack(f"<{dimension}f", base64.b64decode(raw["data"][1]["embedding"]))
    assert list(decoded) == pytest.approx(floats.data[1].embedding, abs=1e-6)
    assert native[0]["embedding"][0] == pytest.approx(floats.data[0].embedding, abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "needle"),
    [({}, "required"), ({"input": ""}, "Input content cannot be empty"), ({"input": []}, "must not be empty"),
     ({"input": "a", "dimensions": 8}, "dimensions"), ({"input": [10**9]}, "out of the vocabulary"),
     ({"input": {"content": "string"}}, "text parts"), ({"input": {"content": [{"type": "image_url"}]}}, "text"),
     ({"input": "def f(): pass\n" * 2000}, "is too large to process"),
     ({"input": [[5] * 150] * 2048}, "300160 positions by input[1875]")],  # 5 forwards each: minutes of them
)  # fmt: skip
def test_bad_inputs_are_400(embedding_server, body: dict, needle: str) -> None:
    answer = httpx.post(f"{embedding_server.url}/v1/embeddings", json=body, timeout=30)
    assert answer.status_code == 400 and needle in answer.json()["error"]["message"]


def test_off_by_default_a_404_the_sdk_does_not_retry(default_server) -> None:
    sent = []
    http = httpx.Client(event_hooks={"request": [sent.append]})
    with pytest.raises(openai.NotFoundError) as refused:
        sdk(default_server, http_client=http).embeddings.create(model="target", input="x")
    assert len(sent) == 1  # max_retries is the SDK's default (2): a 404 is not retried
    assert refused.value.response.json()["error"]["type"] == "not_supported_error"
    for path in ("/embedding", "/embeddings"):
        answer = httpx.post(f"{default_server.url}{path}", json={"content": "x"}, timeout=30)
        assert answer.status_code == 404 and "server.embeddings" in answer.json()["error"]["message"]


def test_poolings_read_the_causal_states_they_name(embedded_target) -> None:
    tokens = list(embedded_target.tokenizer.encode("def area(radius):\n    return"))
    (first,) = embedding(embedded_target, tokens[:1], "last")
    # a causal model's state at position 0 is the one-token prompt's: cls pools exactly that
    assert embedding(embedded_target, tokens, "cls")[0] == pytest.approx(first, abs=1e-5)
    assert embedding(embedded_target, tokens[:1], "mean")[0] == pytest.approx(first, abs=1e-5)
    (last,) = embedding(embedded_target, tokens, "last")
    (mean,) = embedding(embedded_target, tokens, "mean")
    assert last != pytest.approx(first, abs=1e-3) and mean != pytest.approx(last, abs=1e-3)
    states = embedded_target.model.model(mx.array([tokens]))[0].astype(mx.float32)
    want = states.mean(axis=0) / mx.linalg.norm(states.mean(axis=0))
    assert mean == pytest.approx(want.tolist(), abs=1e-5)
    per_token = embedding(embedded_target, tokens, "none")  # each position's state, not normalised
    assert len(per_token) == len(tokens)
    assert all(got == pytest.approx(want, abs=1e-5) for got, want in zip(per_token, states.tolist(), strict=True))


# llama.cpp's server tests' inputs: one prompt (a string, ids, ids mixed with strings, an object)
# or many (a list of those); each answers one vector
MIXED = [
    ("string", 1), ([12, 34, 56], 1), ([12, 34, "string", 56, 78], 1), (["string1", "string2"], 2),
    (["string1", [12, 34, 56]], 2), ([[12, 34, 56], [12, 34, 56]], 2), ([[12, 34, 56], [12, "string", 34, 56]], 2),
    ({"prompt_string": "string"}, 1), ({"content": [{"type": "text", "text": "string"}]}, 1),
    (["string1", {"prompt_string": "string2"}, {"content": [{"type": "text", "text": "string3"}]}], 3),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("given", "count"), MIXED)
def test_llama_servers_input_shapes_are_embedded(embedding_server, given, count: int) -> None:
    answer = httpx.post(f"{embedding_server.url}/v1/embeddings", json={"input": given}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["data"]) == count


@pytest.mark.slow
def test_text_parts_embed_as_their_joined_text(embedding_server) -> None:
    given = ["hello world", {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}]
    data = httpx.post(f"{embedding_server.url}/v1/embeddings", json={"input": given}, timeout=30).json()["data"]
    assert data[0]["embedding"] == data[1]["embedding"]


@pytest.mark.slow
def test_embeddings_is_llama_servers_native_route(embedding_server) -> None:
    """/embeddings answers as /embedding (llama-server's native list), /v1/embeddings OpenAI's."""
    with embedding_server.client() as http:
        native = http.post("/embeddings", json={"input": TEXTS}).json()
        also = http.post("/embedding", json={"content": TEXTS}).json()
        openai_shape = http.post("/v1/embeddings", json={"input": TEXTS}).json()
    assert native == also and [entry["index"] for entry in native] == [0, 1]
    assert native[1]["embedding"][0] == pytest.approx(openai_shape["data"][1]["embedding"], abs=1e-6)


@pytest.mark.slow
def test_pooling_none_answers_every_tokens_vector_on_the_native_routes(tmp_path) -> None:
    env = {"MLXCEL_SERVER__EMBEDDINGS": "true"}
    with serve(tmp_path, "-m", "models/target", "--pooling", "none", env=env) as server, server.client() as http:
        tokens = http.post("/tokenize", json={"content": "hello hello hello", "add_special": True}).json()["tokens"]
        native = http.post("/embeddings", json={"input": "hello hello hello"}).json()
        refused = http.post("/v1/embeddings", json={"input": "hello hello hello"})
    assert len(native[0]["embedding"]) == len(tokens)
    assert all(abs(sum(x * x for x in vector) - 1) > 1e-3 for vector in native[0]["embedding"])  # not normalised
    assert refused.status_code == 400 and "Pooling type 'none' is not OAI compatible" in refused.text


def test_a_long_prompt_embeds_in_chunks_as_in_one_forward(embedded_target) -> None:
    """Chunks over a KV cache (so rows decode between them) give the one forward's vector."""
    tokens = list(embedded_target.tokenizer.encode("def area(radius):\n    return 3.14159 * radius ** 2\n" * 12))
    assert len(tokens) > 3 * CHUNK
    states = embedded_target.model.model(mx.array([tokens]))[0].astype(mx.float32)
    for pooling, pooled in (("mean", states.mean(axis=0)), ("last", states[-1]), ("cls", states[0])):
        want = (pooled / mx.linalg.norm(pooled)).tolist()
        assert embedding(embedded_target, tokens, pooling)[0] == pytest.approx(want, abs=1e-4), pooling


def test_a_tensor_parallel_target_cannot_serve_embeddings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLXCEL_SERVER__EMBEDDINGS", "true")
    monkeypatch.setenv("MLXCEL_TARGET__PARALLEL", "tensor")
    monkeypatch.setenv("MLXCEL_TARGET__WORLD_SIZE", "2")
    with pytest.raises(ProfileError, match=r"^environment: MLXCEL_SERVER__EMBEDDINGS: not served with a tensor-par"):
        resolve("target-only")


@pytest.mark.slow
def test_embeddings_between_ticks_change_no_decoding_row(embedding_server) -> None:
    body = {"messages": [{"role": "user", "content": "Write a function"}], "max_tokens": 96, "temperature": 0}
    with embedding_server.client() as http:
        alone = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
        alone_vector = http.post("/v1/embeddings", json={"input": TEXTS[1]}).json()["data"][0]["embedding"]
        with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as stream:
            lines = stream.iter_lines()
            pieces, vectors = [], []
            for line in lines:
                if line.startswith("data: {"):
                    delta = json.loads(line[6:])["choices"][0]["delta"].get("content")
                    pieces.append(delta or "")
                    if len(vectors) < 3:  # embeddings computed while the row decodes
                        answer = httpx.post(
                            f"{embedding_server.url}/v1/embeddings", json={"input": TEXTS[1]}, timeout=60
                        )
                        vectors.append(answer.json()["data"][0]["embedding"])
    assert "".join(pieces) == alone
    assert all(vector == alone_vector for vector in vectors)


@pytest.mark.slow
def test_ollamas_embed_routes(embedding_server) -> None:
    """Ollama's /api/embed (a string or a list) and its older /api/embeddings: the vectors
    /v1/embeddings answers, in Ollama's shape, through Ollama's own client."""
    import ollama

    client = ollama.Client(host=embedding_server.url)
    openai_vectors = [e.embedding for e in sdk(embedding_server).embeddings.create(model="m", input=["hi", "def"]).data]
    embedded = client.embed(model="m", input=["hi", "def"])
    assert [list(v) for v in embedded.embeddings] == openai_vectors and embedded.model == "target"
    assert embedded.prompt_eval_count >= 2 and embedded.total_duration > 0
    assert [list(v) for v in client.embed(model="m", input="hi").embeddings] == openai_vectors[:1]
    assert list(client.embeddings(model="m", prompt="hi").embedding) == openai_vectors[0]
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model="m", input="hi", dimensions=8)
    assert refused.value.status_code == 400 and "dimensions" in refused.value.error
