"""Ollama's requests: /api/chat and /api/generate as the chat pipeline's request (a raw generate as
a prompt, as the native route reads one), `options` as the sampler's fields, /api/show and /api/embed.

`options` maps to the sampler field of the same name (`num_predict` is `n_predict`); `num_ctx` is
the row's context (a longer prompt 400, the answer stopped where it would pass it: no context
shift here), a no-op wherever it is at least the prompt and the token limit; `num_keep`, `tfs_z`,
`penalize_newline` and the load-time options (`num_gpu`, `num_thread`, `use_mmap`, ...) change
nothing here and are ignored, as Ollama ignores options a model does not use. `format` is
`"json"` (any JSON object) or a JSON schema, through the grammar engine; `think` is the chat
template's `enable_thinking` (and, as a level, its `reasoning_effort`); `keep_alive` is accepted
without effect (the model stays loaded). A generate request's `suffix` fills in the middle between
its prompt and the suffix with the model's fill-in-the-middle tokens (app/server/core/infill.py; 400
naming them where the model has none), as Ollama's FIM templates lay it out: no chat template, its
`system` unused. Images and a request's own `template` are refused with 400 (docs/other-apis.md).
"""

from __future__ import annotations

from typing import Any

import msgspec

from app.server.chat.conversation import translated
from app.server.chat.request import ChatRequest
from app.server.core.schemas import WireStruct
from app.server.errors import ApiError
from app.server.native.requests import CompletionRequest

TEXT_ONLY = "this server runs text-only checkpoints"
THINK_LEVELS = ("high", "medium", "low")
# options read as the sampler's field of the same name
SAMPLING = (
    "temperature", "top_k", "top_p", "min_p", "typical_p", "seed", "stop", "repeat_penalty", "repeat_last_n",
    "presence_penalty", "frequency_penalty", "mirostat", "mirostat_tau", "mirostat_eta",
)  # fmt: skip


class Options(WireStruct, kw_only=True):
    """The options this server reads; any other is ignored (load-time options, `num_keep`, `tfs_z`)."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    seed: int | None = None
    num_predict: int | None = None  # -1 (and Ollama's -2, fill the context): until the end, capped as n_predict is
    stop: str | list[str] | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    num_ctx: int | None = None  # requests.context_cap


class Message(WireStruct, kw_only=True):
    role: str
    content: str | None = None
    images: list[Any] | None = None
    thinking: str | None = None  # an assistant's past thinking
    tool_calls: list[dict[str, Any]] | None = None  # [{"function": {"name", "arguments": {...}}}]
    tool_name: str | None = None  # a tool message: the tool that answered
    tool_call_id: str | None = None  # LiteLLM's ollama_chat sends it


class Generation(WireStruct, kw_only=True):
    """What /api/chat and /api/generate share."""

    model: str | None = None  # any name: one model is served, and the answer names it (as the OpenAI routes)
    format: str | dict[str, Any] | None = None
    options: Options | None = None
    stream: bool = True
    keep_alive: str | int | float | None = None  # accepted without effect: the model stays loaded
    think: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class OllamaChatRequest(Generation, kw_only=True):
    """POST /api/chat."""

    messages: list[Message] | None = None  # none (or []): Ollama's "load the model" request
    tools: list[dict[str, Any]] | None = None


class OllamaGenerateRequest(Generation, kw_only=True):
    """POST /api/generate."""

    prompt: str | None = None  # none (or ""): Ollama's "load the model" request
    suffix: str | None = None
    images: list[Any] | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None  # an earlier answer's `context`: its tokens come first
    raw: bool = False  # the prompt as it is, without the chat template


class OllamaShowRequest(WireStruct, kw_only=True):
    """POST /api/show: `model`, or the older `name` (LiteLLM sends it)."""

    model: str | None = None
    name: str | None = None
    verbose: bool = False


class OllamaEmbedRequest(WireStruct, kw_only=True):
    """POST /api/embed (`input`) and the older /api/embeddings (`prompt`)."""

    model: str | None = None
    input: str | list[str] | None = None
    prompt: str | None = None
    truncate: bool = True
    dimensions: int | None = None
    options: Options | None = None
    keep_alive: str | int | float | None = None


def loads_only(data: OllamaChatRequest | OllamaGenerateRequest) -> bool:
    """Ollama's "load the model" request (no messages, no prompt): it is loaded already."""
    return not data.messages if isinstance(data, OllamaChatRequest) else not data.prompt


def unloads(keep_alive: str | int | float | None) -> bool:
    """`keep_alive: 0` with no prompt asks Ollama to unload the model (answered, nothing unloads here)."""
    if isinstance(keep_alive, str):
        return keep_alive.strip().rstrip("hms") in ("0", "0.0")
    return keep_alive is not None and keep_alive == 0


def chat_request(data: OllamaChatRequest) -> ChatRequest:
    """/api/chat as the chat route's request (tools, grammar, sampling and thinking included)."""
    messages = [chat_message(index, message) for index, message in enumerate(data.messages or [])]
    body = {"messages": messages, "tools": data.tools} | generation_fields(data)
    return translated(body, "Ollama chat")


def generate_chat_request(data: OllamaGenerateRequest) -> ChatRequest:
    """/api/generate (not raw) as a chat request: its `system` and its prompt as the user's turn,
    through the model's chat template, as Ollama applies the model's template."""
    refuse_generate_fields(data)
    messages = ([{"role": "system", "content": data.system}] if data.system else []) + [
        {"role": "user", "content": data.prompt or ""}
    ]
    return translated({"messages": messages} | generation_fields(data), "Ollama generate")


def raw_request(data: OllamaGenerateRequest) -> CompletionRequest:
    """A raw /api/generate, or one with a `suffix`: the prompt as is (no chat template), as
    llama-server's native route reads one. A suffix's fill-in-the-middle layout has no place for
    `system`, and Ollama's FIM templates leave it out too."""
    refuse_generate_fields(data)
    if data.system and not data.suffix:
        raise ApiError(400, "system: a raw prompt has no template to put it in; write it into the prompt")
    body = {"prompt": data.prompt or ""} | generation_fields(data)
    if data.think is not None:
        raise ApiError(400, "think: a raw prompt has no template to steer; write the thinking tags into the prompt")
    body.pop("chat_template_kwargs", None)
    body.pop("reasoning_effort", None)
    if body.pop("response_format", None) is not None:  # "json": any JSON object, as the chat route reads it
        body["json_schema"] = {"type": "object"}
    body["n_probs"] = body.pop("top_logprobs", None) or (1 if body.pop("logprobs", False) else 0)
    try:
        return msgspec.convert(body, CompletionRequest)
    except msgspec.ValidationError as exc:
        raise ApiError(400, f"this Ollama generate request does not make a completion request: {exc}") from exc


def refuse_generate_fields(data: OllamaGenerateRequest) -> None:
    if data.images:
        raise ApiError(400, f"images: not supported: {TEXT_ONLY}")
    if data.template:
        raise ApiError(
            400,
            "template: not supported: the model's chat template (or the profile's) renders every prompt; a "
            "request cannot bring its own (send raw: true with the prompt written out)",
        )


def generation_fields(data: Generation) -> dict[str, Any]:
    """The chat or completion fields of what /api/chat and /api/generate share."""
    options = data.options or Options()
    fields: dict[str, Any] = {"model": data.model, "stream": data.stream}
    fields |= {name: getattr(options, name) for name in SAMPLING if getattr(options, name) is not None}
    if options.num_predict is not None:
        fields["n_predict"] = max(options.num_predict, -1)  # Ollama's -2 (fill the context) runs until the end too
    fields |= format_fields(data.format) | think_fields(data.think)
    if data.logprobs or data.top_logprobs:
        fields |= {"logprobs": True, "top_logprobs": data.top_logprobs or 0}
    return fields


def format_fields(format_: str | dict[str, Any] | None) -> dict[str, Any]:
    """`format`: "json" is any JSON object, an object is a JSON schema (both through the grammar engine)."""
    if format_ is None or format_ == "":
        return {}
    if format_ == "json":
        return {"response_format": {"type": "json_object"}}
    if isinstance(format_, dict):
        return {"json_schema": format_}
    raise ApiError(400, f'format: must be "json" or a JSON schema (an object), got {format_!r}')


def think_fields(think: bool | str | None) -> dict[str, Any]:
    """`think` as the chat template's variables: `enable_thinking`, and a level's `reasoning_effort`."""
    if think is None:
        return {}
    if isinstance(think, bool):
        return {"chat_template_kwargs": {"enable_thinking": think}}
    if think not in THINK_LEVELS:
        raise ApiError(400, f'think: must be true, false, "high", "medium" or "low", got {think!r}')
    return {"chat_template_kwargs": {"enable_thinking": True}, "reasoning_effort": think}


def chat_message(index: int, message: Message) -> dict[str, Any]:
    """One Ollama message as a chat message: a tool's answer names its tool, a past answer's
    thinking is its reasoning_content, its calls the template's tool calls."""
    if message.images:
        raise ApiError(400, f"messages[{index}].images: not supported: {TEXT_ONLY}")
    entry: dict[str, Any] = {"role": message.role, "content": message.content or ""}
    if message.tool_calls:
        entry["tool_calls"] = message.tool_calls  # read as every chat request's (chat/template.py history_call)
    if message.tool_name is not None:
        entry["name"] = message.tool_name
    if message.tool_call_id is not None:
        entry["tool_call_id"] = message.tool_call_id
    if message.thinking is not None:
        entry["reasoning_content"] = message.thinking
    return entry


def context_cap(num_ctx: int | None, prompt_tokens: int, asked: int) -> int:
    """The row's token limit under `num_ctx` (`asked`: the limit otherwise, -1 for none). Ollama's
    context holds the prompt and the answer; here nothing is shifted out of it, so a prompt that
    fills it is a 400 and the answer stops where it would pass it (done_reason "length")."""
    if num_ctx is None or num_ctx <= 0:
        return asked
    room = num_ctx - prompt_tokens
    if room <= 0:
        raise ApiError(400, f"options.num_ctx: the prompt is {prompt_tokens} tokens, which leaves no room in "
                            f"num_ctx {num_ctx}; Ollama would cut the prompt's start, this server cuts nothing: "
                            "raise num_ctx or leave it out")  # fmt: skip
    return room if asked < 0 else min(asked, room)
