"""Whether the model answers a plainly tool-shaped request with a call: found once at load.

A chat template that renders tools (`TemplateCaps.supports_tools`) shows the model a request's
tools; whether the model then calls one is its own. The embedded pair's target, trained on code
only, answers a tool-shaped request with code, so under `tool_choice: "auto"` it never calls. The
probe renders one request that only a call answers well (a weather question and a `get_weather`
tool), decodes it greedily on the target alone through the server's own loop, and reads the answer
as `auto` reads a request's (app/loading/tool_calls.py): what it finds is what a client would get.
It stops as soon as the text can no longer become a call, so a model that answers in prose costs
its prefill and a token or two. The finding is reported, never acted on: `/props`
`model_calls_tools`, the startup event's key of that name, and the warning `model_ignores_tools`.
"""

from __future__ import annotations

from typing import Any

import jinja2

from app.decoding.builder import LoopBuilder, RowRequest
from app.loading import chat_template
from app.loading.tool_calls import call_objects, is_call, may_become_calls
from app.sampling import SamplingParams

NAME = "get_weather"
TOOL = {
    "type": "function",
    "function": {
        "name": NAME,
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name"}},
            "required": ["city"],
        },
    },
}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris right now?"}]
MAX_TOKENS = 64  # a call of this tool is about 25 tokens in the embedded vocabulary, fewer in larger ones


def calls_tools(
    builder: LoopBuilder, template: jinja2.Template, limits: chat_template.Limits, variables: dict[str, Any]
) -> bool | None:
    """Whether the target answers the probe request with a call of its tool (None: the template
    cannot render it). `variables` are the special tokens the template may read."""
    probe = variables | {
        "messages": MESSAGES,
        "tools": [TOOL],
        "documents": None,
        "add_generation_prompt": True,
        "enable_thinking": False,  # a call, not a thought first: the answer's opening is what is read
    }
    try:
        text = chat_template.render(template, limits, probe)
    except Exception:  # a template that cannot render the probe: nothing is known of the model
        return None
    prompt = list(builder.target.tokenizer.encode(text, add_special_tokens=False))
    if len(prompt) + MAX_TOKENS > builder.context_limit:
        return None
    request = RowRequest(prompt, SamplingParams(temperature=0.0), MAX_TOKENS, seed=0, n_max=0, cache_prompt=False)
    generation = builder.build(request)
    generation.prefill()
    while not generation.finished and may_become_calls(generation.text):
        generation.step()
    calls = call_objects(generation.text)
    return bool(calls) and all(is_call(call, (NAME,)) for call in calls)
