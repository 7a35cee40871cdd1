"""A server with a LoRA adapter (llama-server's `--lora`): its answer is mlx-lm's own with the
adapter fused, and llama-server's `/lora-adapters` and `lora` field read the fused adapter's scale."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.lora import build_adapter, greedy_tokens, mlx_lm_fused
from tests.support.server import serve

PROMPT = "def merge_sorted(left, right):\n"


@pytest.mark.slow
def test_lora_adapters_over_http(tmp_path: Path) -> None:
    adapter = build_adapter(tmp_path / "adapter")
    model, tokenizer = mlx_lm_fused(adapter)
    prompt = list(tokenizer.encode(PROMPT))
    want = greedy_tokens(model, tokenizer, prompt, 48)
    with serve(tmp_path, "--profile", "default", "--lora", str(adapter)) as server, server.client() as http:
        listed = http.get("/lora-adapters").json()
        assert listed == [{"id": 0, "path": "adapter", "scale": 1.0, "task_name": "", "prompt_prefix": ""}]
        assert http.get("/props").json()["mlxcel"]["lora_adapters"] == listed
        assert http.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}]).json() == {"success": True}
        said = {}
        for asked in ([{"id": 0, "scale": 0.5}], [], [{"id": 1, "scale": 1.0}], {"id": 0}):
            refused = http.post("/lora-adapters", json=asked)
            assert refused.status_code == 400 and refused.json()["error"]["type"] == "invalid_request_error", asked
            said[str(asked)] = refused.json()["error"]["message"]
        assert "fused into the target's weights at load" in said["[{'id': 0, 'scale': 0.5}]"]
        assert "asked 0 (an adapter the list leaves out is asked 0)" in said["[]"]
        assert "invalid adapter id 1" in said["[{'id': 1, 'scale': 1.0}]"]

        body = {"prompt": prompt, "n_predict": 48, "temperature": 0, "return_tokens": True}
        answer = http.post("/completion", json=body | {"lora": [{"id": 0, "scale": 1.0}]})
        assert answer.status_code == 200, answer.text
        assert answer.json()["tokens"] == want and answer.json()["timings"]["draft_n"] > 0
        other = http.post("/completion", json=body | {"lora": [{"id": 0, "scale": 0.5}]})
        assert other.status_code == 400 and other.json()["error"]["message"].startswith("lora: not supported: ")
