"""A tiny model that calls the load-time tool probe's tool: a random tiny Qwen3 trained (in MLX, a
few seconds on the CPU) to answer the probe's own prompt with a `<tool_call>` block, so the probe
and `auto` have a model that really calls to find."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx_lm

from app.engine import tool_probe
from app.loading.chat_template import ENVIRONMENT, Limits, render
from ops.models.tiny import build_tiny_model
from tests.support.training import fit_and_save

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
STEPS = 100


def build_tool_caller(out: Path) -> Path:
    """A model directory whose greedy answer to the probe's request is a call of its tool."""
    build_tiny_model(out, hidden=64, layers=2, seed=7)
    model, tokenizer = mlx_lm.load(str(out))
    template = ENVIRONMENT.from_string((out / "chat_template.jinja").read_text())
    variables = {"messages": tool_probe.MESSAGES, "tools": [tool_probe.TOOL], "add_generation_prompt": True}
    prompt = tokenizer.encode(render(template, Limits(2.0, 1 << 20), variables), add_special_tokens=False)
    answer = tokenizer.encode(CALL + "<|im_end|>", add_special_tokens=False)
    tokens = mx.array([prompt + answer])
    start = len(prompt) - 1  # the answer's tokens are the only targets

    def loss(model: nn.Module) -> mx.array:
        logits = model(tokens[:, :-1])[:, start:]
        return nn.losses.cross_entropy(logits, tokens[:, start + 1 :]).mean()

    return fit_and_save(model, loss, out, STEPS, seed=7)
