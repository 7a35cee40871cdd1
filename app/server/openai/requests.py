"""OpenAI's text completion request (its chat request is the chat pipeline's: app/server/chat/request.py)."""

from __future__ import annotations

from typing import Any

from app.server.core import field_policy
from app.server.core.schemas import PromptInput, ResponseFormat, SamplingFields, with_unhonoured
from app.server.errors import ApiError

MAX_COMPLETION_LOGPROBS = 5  # OpenAI's limit for /v1/completions `logprobs`
# OpenAI answers echo + logprobs with the prompt tokens' log-probabilities too; this server
# computes log-probabilities only for decided tokens, so it refuses rather than leave them out.
NO_ECHO_LOGPROBS = (
    "echo with logprobs is not supported: this server does not compute the prompt tokens' log-probabilities"
)


class OpenAICompletionRequest(
    with_unhonoured("OpenAICompletionFields", field_policy.OPENAI_COMPLETION, SamplingFields), kw_only=True
):
    """POST /v1/completions."""

    prompt: PromptInput
    suffix: str | None = None  # fill in the middle up to this text ("" or null: a plain completion)
    model: str | None = None
    n: int = 1
    echo: bool = False
    logprobs: int | None = None  # OpenAI: the top candidates per token, 0..5
    stream_options: dict[str, Any] | None = None
    response_format: ResponseFormat | None = None

    def asked_logprobs(self) -> tuple[int, bool]:
        """OpenAI completions' spelling: `logprobs` as a count; without it, llama-server's."""
        if self.logprobs is None:
            top, wanted = super().asked_logprobs()
        else:
            top, wanted = self.logprobs, True
            if not 0 <= top <= MAX_COMPLETION_LOGPROBS:
                raise ApiError(400, f"logprobs must be within [0, {MAX_COMPLETION_LOGPROBS}], got {top}")
        if wanted and self.echo:
            raise ApiError(400, NO_ECHO_LOGPROBS)
        return top, wanted
