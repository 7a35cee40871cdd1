"""Thinking blocks: a chat answer's `<think>...</think>` text as `reasoning_content`, as
llama-server's `reasoning_format` parses it.

`auto` (the default) and `deepseek` parse where the chat template has thinking tags; `none`
(or a template without them) leaves the text as generated. A prompt whose generation prompt
opens the block (a template that forces thinking) makes the answer start inside it. An answer
that never closes the block is all reasoning, as llama-server reports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from app.loading.chat_template import THINKING_TAGS
from app.profiles.schema import ReasoningFormatName
from app.server.errors import ApiError

OPEN, CLOSE = THINKING_TAGS
FORMATS = get_args(ReasoningFormatName)


@dataclass(frozen=True)
class Reasoning:
    opened: bool  # the prompt ends inside a thinking block


def reasoning_for(reasoning_format: str | None, has_tags: bool, prompt_tail: str) -> Reasoning | None:
    """How the answer is parsed (None: not at all); `prompt_tail` is the rendered prompt's end."""
    chosen = reasoning_format or "auto"
    if chosen not in FORMATS:
        raise ApiError(400, f"reasoning_format must be one of {', '.join(FORMATS)}, got {chosen!r}")
    if chosen == "none" or not has_tags:
        return None
    return Reasoning(opened=prompt_tail.rstrip().endswith(OPEN))


def split(reasoning: Reasoning, text: str) -> tuple[str | None, str]:
    """(reasoning_content or None, content) of a whole answer."""
    stream = ThinkingStream(reasoning)
    thought, content = stream.feed(text)
    rest_thought, rest_content = stream.finish()
    thought += rest_thought
    return (thought if stream.thought else None), content + rest_content


class ThinkingStream:
    """One streamed answer cut into reasoning and content as it arrives: text that may still
    be the start of `<think>` (before the block) or of `</think>` (inside it) is held back."""

    def __init__(self, reasoning: Reasoning) -> None:
        self._phase = "think" if reasoning.opened else "start"
        self._held = ""
        self.thought = reasoning.opened  # the answer has a thinking block
        self._thought_started = self._content_started = False

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, content) to send now."""
        self._held += text
        if self._phase == "start":
            body = self._held.lstrip()
            if body.startswith(OPEN):
                self._phase, self._held, self.thought = "think", body[len(OPEN) :], True
            elif OPEN.startswith(body):
                return "", ""  # still maybe the opening tag
            else:
                self._phase = "content"
        thought = ""
        if self._phase == "think":
            before, found, after = self._held.partition(CLOSE)
            if not found:
                cut = len(self._held) - _partial_suffix(self._held, CLOSE)
                before, self._held = self._held[:cut], self._held[cut:]
                return self._thinking(before), ""
            thought, self._held, self._phase = self._thinking(before), after, "content"
        content, self._held = self._held, ""
        if self.thought and not self._content_started:
            content = content.lstrip()  # the blank line after </think>
        self._content_started = self._content_started or bool(content)
        return thought, content

    def finish(self) -> tuple[str, str]:
        """What is still held when the answer ends: an unclosed block's tail is reasoning."""
        held, self._held = self._held, ""
        return (held, "") if self._phase == "think" else ("", held)

    def _thinking(self, text: str) -> str:
        if not self._thought_started:
            text = text.lstrip()  # the line break after <think>
            self._thought_started = bool(text)
        return text


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper start of `tag`."""
    return next((n for n in range(min(len(tag) - 1, len(text)), 0, -1) if text.endswith(tag[:n])), 0)
