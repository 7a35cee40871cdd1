"""OpenAI's Responses API answers: the response object, its output items and the stream's events."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from app.sampling import SamplingParams
from app.server.chat.tools import ToolPlan, tool_calls, uncalled_text
from app.server.core.shaping import speculative_biased
from app.server.engine_view import Finished, Timings
from app.server.responses.requests import ResponsesRequest


class OutputText(msgspec.Struct, kw_only=True, tag_field="type", tag="output_text"):
    text: str
    annotations: list[Any] = msgspec.field(default_factory=list)


class MessageItem(msgspec.Struct, kw_only=True, tag_field="type", tag="message"):
    id: str
    status: str
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionCallItem(msgspec.Struct, kw_only=True, tag_field="type", tag="function_call"):
    id: str
    call_id: str
    name: str
    arguments: str
    status: str


OutputItem = MessageItem | FunctionCallItem


class InputTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int
    cache_write_tokens: int = 0


class OutputTokensDetails(msgspec.Struct, kw_only=True):
    reasoning_tokens: int = 0


class ResponsesUsage(msgspec.Struct, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(msgspec.Struct, kw_only=True):
    reason: str


class ResponseBody(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: str
    error: None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    store: bool
    temperature: float
    top_p: float
    text: dict[str, Any]
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    usage: ResponsesUsage | None
    timings: Timings | UnsetType = UNSET  # this server's own, as on the chat route
    speculative_biased: bool | UnsetType = UNSET


def response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def output(result: Finished, plan: ToolPlan | None, item_id: str) -> list[OutputItem]:
    """The answer's items: the function calls its whole output is (several where
    parallel_tool_calls allows), or one message of its text."""
    cut = result.stop_type == "limit"
    calls = tool_calls(plan, result.text, cut) if plan is not None else None
    if calls:  # a call the token limit cut: its arguments as far as they got, the item incomplete
        done = "incomplete" if cut else "completed"
        return [FunctionCallItem(id=f"fc_{item_id}" + (f"_{i}" if i else ""), call_id=call.id,
                                 name=call.function.name, arguments=call.function.arguments, status=done)
                for i, call in enumerate(calls)]  # fmt: skip
    return [
        MessageItem(
            id=f"msg_{item_id}", status=status(result), content=[OutputText(text=uncalled_text(plan, result.text))]
        )
    ]


def status(result: Finished | None) -> str:
    if result is None:
        return "in_progress"
    return "incomplete" if result.stop_type == "limit" else "completed"


def usage(result: Finished) -> ResponsesUsage:
    output_n = len(result.tokens)
    return ResponsesUsage(
        input_tokens=result.prompt_n,
        input_tokens_details=InputTokensDetails(cached_tokens=result.timings.cache_n),
        output_tokens=output_n,
        output_tokens_details=OutputTokensDetails(),
        total_tokens=result.prompt_n + output_n,
    )


def body(
    rid: str,
    request: ResponsesRequest,
    model: str,
    ran: SamplingParams,
    created: int,
    result: Finished | None,
    items: list[OutputItem],
) -> ResponseBody:
    """The response object: in progress (no result yet) or done, with its output and usage."""
    incomplete = result is not None and result.stop_type == "limit"
    text_format = (
        {"type": "text"}
        if request.text is None or request.text.format is None
        else msgspec.to_builtins(request.text.format)
    )
    return ResponseBody(
        id=rid,
        created_at=created,
        status=status(result),
        incomplete_details=IncompleteDetails(reason="max_output_tokens") if incomplete else None,
        instructions=request.instructions,
        max_output_tokens=request.max_output_tokens,
        model=model,
        output=items,
        parallel_tool_calls=request.parallel_tool_calls if request.parallel_tool_calls is not None else True,
        previous_response_id=request.previous_response_id,
        store=request.store,
        temperature=ran.temperature,  # as the row ran: the profile's default where the request left it out
        top_p=ran.top_p,
        text={"format": text_format},
        tool_choice=request.tool_choice if request.tool_choice is not None else "auto",
        tools=request.tools or [],
        usage=usage(result) if result is not None else None,
        timings=result.timings if result is not None else UNSET,
        speculative_biased=speculative_biased([result]) if result is not None else UNSET,
    )


def now() -> int:
    return int(time.time())


# --- stream events ------------------------------------------------------------------------------


class Events:
    """The numbered events of one streamed response (the SDK checks `sequence_number` order)."""

    def __init__(self) -> None:
        self.sequence = 0

    def event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode(payload) + b"\n\n"

    def text_start(self, item_id: str) -> list[bytes]:
        item = MessageItem(id=f"msg_{item_id}", status="in_progress", content=[])
        return [
            self.event("response.output_item.added", output_index=0, item=item),
            self.event("response.content_part.added", item_id=item.id, output_index=0, content_index=0,
                       part=OutputText(text="")),
        ]  # fmt: skip

    def text_delta(self, item_id: str, text: str) -> bytes:
        return self.event("response.output_text.delta", item_id=f"msg_{item_id}", output_index=0, content_index=0,
                          delta=text, logprobs=[])  # fmt: skip

    def item_done(self, item: OutputItem, index: int = 0) -> list[bytes]:
        """A message's closing events, or a (held-back) function call's whole events, as output item `index`."""
        if isinstance(item, MessageItem):
            part = item.content[0]
            return [
                self.event("response.output_text.done", item_id=item.id, output_index=0, content_index=0,
                           text=part.text, logprobs=[]),
                self.event("response.content_part.done", item_id=item.id, output_index=0, content_index=0, part=part),
                self.event("response.output_item.done", output_index=0, item=item),
            ]  # fmt: skip
        started = msgspec.structs.replace(item, arguments="", status="in_progress")
        return [
            self.event("response.output_item.added", output_index=index, item=started),
            self.event("response.function_call_arguments.delta", item_id=item.id, output_index=index,
                       delta=item.arguments),
            self.event("response.function_call_arguments.done", item_id=item.id, output_index=index,
                       arguments=item.arguments),
            self.event("response.output_item.done", output_index=index, item=item),
        ]  # fmt: skip

    def error(self, code: int, message: str, kind: str) -> bytes:
        return self.event("error", code=kind, message=message, param=None, status=code)
