"""Chat templates: a chat request's messages (and tools) rendered into the prompt, as llama-server
renders them (the template itself runs in app/loading/chat_template.py's bounded sandbox)."""

from __future__ import annotations

import json
from typing import Any

from mlx_lm.tokenizer_utils import TokenizerWrapper

from app.loading import chat_template
from app.loading.chat_template import RESERVED_TEMPLATE_KEYS, Limits, TemplateLimitError
from app.profiles.schema import Settings
from app.server.chat.request import ChatMessage, ChatRequest
from app.server.errors import ApiError


def template_kwargs(request: ChatRequest) -> dict[str, Any] | None:
    """The request's chat_template_kwargs, with OpenAI's `reasoning_effort` as the template variable
    of that name, as llama-server passes it (templates that know it read it; others ignore it).
    A `reasoning_effort` in chat_template_kwargs itself wins."""
    if request.reasoning_effort is None:
        return request.chat_template_kwargs
    return {"reasoning_effort": request.reasoning_effort, **(request.chat_template_kwargs or {})}


def template_variables(extra: dict[str, Any] | None, tokenizer: TokenizerWrapper) -> dict[str, Any]:
    """The special tokens (bos_token, eos_token, ...) and the request's chat_template_kwargs."""
    special = dict(getattr(tokenizer, "special_tokens_map", {}))
    variables = special | {"enable_thinking": bool(getattr(tokenizer, "has_thinking", False))}  # mlx-lm's default
    for key, value in (extra or {}).items():
        if key in RESERVED_TEMPLATE_KEYS or key in special:
            raise ApiError(400, f"chat_template_kwargs.{key}: not accepted; the server controls the rendering")
        if key == "enable_thinking" and not isinstance(value, bool):
            raise ApiError(400, "chat_template_kwargs.enable_thinking: expected a boolean")
        variables[key] = value
    return variables


def chat_messages(messages: list[ChatMessage], allow_empty: bool = False) -> list[dict[str, Any]]:
    if not messages and not allow_empty:
        raise ApiError(400, "messages must not be empty")
    if len(messages) > 1 and messages[-1].role == messages[-2].role == "assistant":
        # llama-server's own check and words: one trailing assistant message at most
        raise ApiError(400, "Cannot have 2 or more assistant messages at the end of the list.")
    plain = []
    for message in messages:
        content = message.content
        if isinstance(content, list):
            if any(part.type != "text" for part in content):
                raise ApiError(400, "only text content parts are supported")
            content = "".join(part.text or "" for part in content)
        entry: dict[str, Any] = {"role": message.role, "content": content or ""}
        if message.tool_calls:
            entry["tool_calls"] = [history_call(call) for call in message.tool_calls]
        if message.tool_call_id is not None:
            entry["tool_call_id"] = message.tool_call_id
        if message.name is not None:
            entry["name"] = message.name
        if message.reasoning_content is not None:
            entry["reasoning_content"] = message.reasoning_content
        plain.append(entry)
    return plain


def history_call(call: dict[str, Any]) -> dict[str, Any]:
    """An assistant's past call as chat templates read it: arguments as a mapping."""
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ApiError(400, "messages: a tool call needs function.name")
    arguments = function.get("arguments", "{}")
    try:
        arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError as exc:
        raise ApiError(400, f"messages: tool call arguments are not JSON: {exc}") from exc
    return {**call, "type": "function", "function": {"name": function["name"], "arguments": arguments}}


def continues_final_message(messages: list[ChatMessage], asked: bool | None = None) -> bool:
    """Whether the answer continues the last message instead of starting a new turn: llama-server's
    assistant prefill, on whenever the last message is the assistant's (Anthropic's Messages work
    the same way). `continue_final_message` (vLLM's and transformers' name) asks for it (true:
    the last message must then be the assistant's) or turns it off (false: a new turn after it)."""
    last_is_assistant = bool(messages) and messages[-1].role == "assistant"
    if asked and not last_is_assistant:
        raise ApiError(400, "continue_final_message: the last message must be the assistant's, to be continued")
    return last_is_assistant if asked is None else asked


def chat_prompt(
    messages: list[ChatMessage],
    tokenizer: TokenizerWrapper,
    extra: dict[str, Any] | None,
    settings: Settings,
    *,
    tokenize: bool = True,
    tools: list[dict[str, Any]] | None = None,
    prefill: bool = False,
    generation_prompt: bool = True,
    allow_empty: bool = False,
) -> Any:
    """The chat template applied to the messages: token ids, or the text when `tokenize` is false.

    `prefill` (continues_final_message): as llama-server, the messages before the last are
    rendered with the generation prompt and the last one's text follows it unclosed, so the answer
    goes on from there. Blocking (a render may take up to server.template_timeout_s): call it off
    the event loop.
    """
    plain = chat_messages(messages, allow_empty)
    server = settings.server
    # the profile's kwargs (mlx_lm.server's --chat-template-args), the request's winning over them
    variables = template_variables({**server.chat_template_kwargs, **(extra or {})}, tokenizer)
    prefix = ""
    if prefill:
        prefix = plain.pop()["content"]
        if (extra or {}).get("enable_thinking") is True:  # llama-server's check and words
            raise ApiError(400, "Assistant response prefill is incompatible with enable_thinking.")
        variables["enable_thinking"] = False  # the answer goes on in the message, not in a new thinking block
    variables |= {
        "messages": plain,
        "add_generation_prompt": generation_prompt or prefill,
        "tools": tools,  # None as transformers passes it: templates test `tools is not none`
        "documents": None,
    }
    limits = Limits(server.template_timeout_s, server.template_max_chars)
    try:
        template = chat_template.chosen(tokenizer, server.chat_template_file, server.chat_template)
        text = None if template is None else chat_template.render(template, limits, variables)
    except TemplateLimitError as exc:
        raise ApiError(400, str(exc)) from exc
    except Exception as exc:  # jinja errors surface as a bad request, not a crash
        raise ApiError(400, f"the chat template could not render these messages: {exc}") from exc
    if text is None:
        raise ApiError(400, "this model has no chat template; use /completion")
    text += prefix
    return list(tokenizer.encode(text, add_special_tokens=False)) if tokenize else text
