"""Wire types of the answers: llama-server's native shapes and OpenAI's, as msgspec Structs.

Litestar encodes them and derives the OpenAPI schema from them. Key order follows the
declaration. A field that is sometimes absent defaults to UNSET (left out of the JSON); one that
is sometimes null is typed `| None` and always written.
"""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import UNSET, UnsetType

from app import __version__
from app.profiles.schema import AdaptiveSettings, GovernorSettings
from app.server.engine_view import Timings

# --- health, models, tokens -------------------------------------------------------------------


class Health(msgspec.Struct, kw_only=True):
    status: Literal["ok"] = "ok"


class ModelMeta(msgspec.Struct, kw_only=True):
    path: str
    n_vocab: int | UnsetType = UNSET  # known once the model is loaded
    n_ctx_train: int | UnsetType = UNSET


class ModelEntry(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "mlxcel"
    meta: ModelMeta


class ModelName(msgspec.Struct, kw_only=True):
    name: str
    model: str


class ModelList(msgspec.Struct, kw_only=True):
    """OpenAI's list (`data`) and llama-server's (`models`) in one body."""

    object: Literal["list"] = "list"
    data: list[ModelEntry]
    models: list[ModelName]


class TokenIds(msgspec.Struct, kw_only=True):
    tokens: list[int]


class TokenPiece(msgspec.Struct, kw_only=True):
    id: int
    piece: str


class TokenPieces(msgspec.Struct, kw_only=True):
    tokens: list[TokenPiece]


class Detokenized(msgspec.Struct, kw_only=True):
    content: str


class TemplatePrompt(msgspec.Struct, kw_only=True):
    prompt: str


# --- sampling settings as /props, /slots and responses report them ----------------------------


class SamplerSettings(msgspec.Struct, kw_only=True):
    """The sampler's knobs (app.sampling.SamplingParams without its logit bias and tokenized breakers)."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repeat_penalty: float
    repeat_last_n: int
    presence_penalty: float
    frequency_penalty: float
    xtc_probability: float
    xtc_threshold: float
    dry_multiplier: float
    dry_base: float
    dry_allowed_length: int
    dry_penalty_last_n: int
    dry_sequence_breakers: list[str]
    top_n_sigma: float
    typical_p: float
    dynatemp_range: float
    dynatemp_exponent: float
    mirostat: int
    mirostat_tau: float
    mirostat_eta: float
    samplers: list[str]  # the chain that runs, in order (llama-server's names)


class LogitBiasEntry(msgspec.Struct, kw_only=True):
    """One token's bias as llama-server lists it; a ban (false, or ignore_eos on an
    end-of-generation token) is -inf, which JSON cannot spell: null, as llama-server writes it."""

    bias: float | None
    token: int


class GenerationSettings(SamplerSettings, kw_only=True):
    """What one request ran with: the seed actually used and the speculative limits."""

    logit_bias: list[LogitBiasEntry]
    model: str
    n_predict: int
    seed: int
    stop: list[str]
    ignore_eos: bool
    speculative_n_max: int = msgspec.field(name="speculative.n_max")
    speculative_n_min: int = msgspec.field(name="speculative.n_min")
    speculative_p_min: float = msgspec.field(name="speculative.p_min")


class SlotParams(SamplerSettings, kw_only=True):
    logit_bias: list[LogitBiasEntry]
    n_predict: int
    speculative_n_max: int = msgspec.field(name="speculative.n_max")
    speculative_n_min: int = msgspec.field(name="speculative.n_min")
    speculative_p_min: float = msgspec.field(name="speculative.p_min")


class DefaultParams(SlotParams, kw_only=True):
    """What a request that sets nothing runs with, as llama-server's /props `params`."""

    seed: int  # -1: each request draws its own


class DefaultGenerationSettings(SamplerSettings, kw_only=True):
    """The defaults at the top level (as this server has always listed them) and in `params`
    (as llama-server lists them)."""

    n_predict: int
    n_ctx: int | None  # null until the model is loaded
    speculative_n_max: int = msgspec.field(name="speculative.n_max")
    speculative_n_min: int = msgspec.field(name="speculative.n_min")
    speculative_p_min: float = msgspec.field(name="speculative.p_min")
    params: DefaultParams


# --- /props and /slots ------------------------------------------------------------------------


class DrafterSummary(msgspec.Struct, kw_only=True):
    kind: str
    model: str | None
    width: int
    p_min: float


class DrafterInfo(msgspec.Struct, kw_only=True):
    """mlxcel's own /props block: the profile, its drafter and the rules the plan decided."""

    profile: str
    profile_file: str
    drafter: DrafterSummary
    rule_at_temperature_0: str | None
    rule_at_temperature_above_0: str | None
    coupled_at_temperature_above_0: bool  # sampled requests' drafts draw with the target's keys
    adaptive: AdaptiveSettings
    block_widths: list[int] | None
    governor: GovernorSettings | None  # prompt lookup only
    env_overrides: dict[str, str]
    exact: bool  # execution.exact: batch-invariant kernels (false: MLX's own, a row may depend on its batch-mates)


class Modalities(msgspec.Struct, kw_only=True):
    vision: bool = False
    audio: bool = False


class InputTokens(msgspec.Struct, kw_only=True):
    """POST .../input_tokens: the prompt's tokens as the request would render them (OpenAI's shape)."""

    object: Literal["response.input_tokens"] = "response.input_tokens"
    input_tokens: int


class TemplateCaps(msgspec.Struct, kw_only=True):
    """What the chat template renders (llama-server's /props `chat_template_caps`); a template
    without `supports_tools` never shows a request's tools to the model, so it never calls one."""

    supports_system_role: bool
    supports_tools: bool
    supports_tool_calls: bool
    supports_parallel_tool_calls: bool


class Props(msgspec.Struct, kw_only=True):
    default_generation_settings: DefaultGenerationSettings
    total_slots: int
    model_path: str
    model_alias: str
    build_info: str
    chat_template: str | None
    chat_template_caps: TemplateCaps | None  # null until the model is loaded, and for a model with no template
    modalities: Modalities = msgspec.field(default_factory=Modalities)
    is_sleeping: bool = False
    mlxcel: DrafterInfo


class Reloaded(msgspec.Struct, kw_only=True):
    """POST /admin/reload's answer: the profile now serving new requests (as /props's `mlxcel`)."""

    status: Literal["reloaded"] = "reloaded"
    mlxcel: DrafterInfo


class NextToken(msgspec.Struct, kw_only=True):
    n_decoded: int
    has_next_token: bool


class SlotDraft(msgspec.Struct, kw_only=True):
    draft_n: int
    draft_n_accepted: int
    draft_rounds: int
    # mlxcel's: the proposals of the row's latest step as its width policy decided them (0: a plain
    # step; null: the row has not stepped yet)
    width: int | None


class Slot(msgspec.Struct, kw_only=True):
    """One of /slots; the request fields only while the slot is processing."""

    id: int
    id_task: int | str  # the request id; -1 when idle or another tenant's (is_processing tells them apart)
    is_processing: bool
    n_ctx: int
    # while processing, as llama-server names them: the prompt, its tokens prefilled, and restored from the prompt cache
    n_prompt_tokens: int | UnsetType = UNSET
    n_prompt_tokens_processed: int | UnsetType = UNSET
    n_prompt_tokens_cache: int | UnsetType = UNSET
    params: SlotParams | UnsetType = UNSET
    next_token: NextToken | UnsetType = UNSET
    draft: SlotDraft | UnsetType | None = UNSET  # null: the row runs no drafter


# --- completions ------------------------------------------------------------------------------


class TokenProbability(msgspec.Struct, kw_only=True):
    """llama-server's candidate: `logprob`, or `prob` with post_sampling_probs."""

    id: int
    token: str
    bytes: list[int]
    logprob: float | UnsetType = UNSET
    prob: float | UnsetType = UNSET


class CompletionProbability(TokenProbability, kw_only=True):
    """One decided token of llama-server's `completion_probabilities`, with its top candidates."""

    top_logprobs: list[TokenProbability] | UnsetType = UNSET
    top_probs: list[TokenProbability] | UnsetType = UNSET


class NativeCompletion(msgspec.Struct, kw_only=True):
    """llama-server's /completion body, and the last frame of its stream."""

    index: int = 0
    content: str
    tokens: list[int]
    id_slot: int = 0
    stop: bool = True
    model: str
    tokens_predicted: int
    tokens_evaluated: int
    generation_settings: GenerationSettings
    prompt: str
    has_new_line: bool
    truncated: bool = False
    stop_type: str
    stopping_word: str
    tokens_cached: int
    timings: Timings
    completion_probabilities: list[CompletionProbability] | UnsetType = UNSET  # with n_probs, unstreamed
    speculative_biased: bool | UnsetType = UNSET  # a drafter ran: did the stream follow the argmax at T > 0?


class PromptProgress(msgspec.Struct, kw_only=True):
    """llama-server's `prompt_progress` (return_progress): prompt tokens in all, restored from the
    prompt cache, in the cache so far (those included), and milliseconds since the prefill began."""

    total: int
    cache: int
    processed: int
    time_ms: int


class NativeChunk(msgspec.Struct, kw_only=True):
    """One /completion stream frame before the last; timings with `timings_per_token`; a
    prefill progress frame (no content, no tokens) carries `prompt_progress`."""

    index: int = 0
    content: str
    tokens: list[int]
    stop: bool = False
    id_slot: int = 0
    tokens_predicted: int = 0
    tokens_evaluated: int = 0
    timings: Timings | UnsetType = UNSET
    completion_probabilities: list[CompletionProbability] | UnsetType = UNSET  # this frame's tokens'
    prompt_progress: PromptProgress | UnsetType = UNSET


class PromptTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int  # prompt tokens restored from the prompt cache


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class TextLogprobs(msgspec.Struct, kw_only=True):
    """OpenAI's completion log-probabilities: parallel lists, one entry per token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class TextChoice(msgspec.Struct, kw_only=True):
    text: str
    index: int = 0
    logprobs: TextLogprobs | None = None
    finish_reason: str | None


SYSTEM_FINGERPRINT = f"mlxcel-{__version__}"


class OpenAIObject(msgspec.Struct, kw_only=True):
    """What every OpenAI body and chunk starts with (subclasses fix `object`, keeping its place)."""

    id: str
    object: str
    created: int
    model: str
    # the server build that answered, as llama-server sends its build (OpenAI: the backend configuration)
    system_fingerprint: str = SYSTEM_FINGERPRINT


class TextCompletion(OpenAIObject, kw_only=True):
    """OpenAI's text completion; as a stream chunk, usage only on the finish chunk."""

    object: Literal["text_completion"] = "text_completion"
    choices: list[TextChoice]
    usage: Usage | UnsetType = UNSET
    timings: Timings | UnsetType = UNSET
    speculative_biased: bool | UnsetType = UNSET  # a drafter ran: did the stream follow the argmax at T > 0?
    prompt_progress: PromptProgress | UnsetType = UNSET  # a stream's prefill progress chunk


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(msgspec.Struct, kw_only=True):
    role: Literal["assistant"] = "assistant"
    content: str | None  # None when the answer is tool calls
    reasoning_content: str | UnsetType = UNSET  # the answer's thinking block (reasoning_format)
    tool_calls: list[ToolCall] | UnsetType = UNSET


class TopLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob, kw_only=True):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(msgspec.Struct, kw_only=True):
    """OpenAI's chat log-probabilities: one entry per token of the message (or of the chunk)."""

    content: list[ChatTokenLogprob]
    refusal: None = None


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str


class ChatCompletion(OpenAIObject, kw_only=True):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage
    timings: Timings | UnsetType = UNSET  # left out when the body holds several rows (n > 1)
    speculative_biased: bool | UnsetType = UNSET  # a drafter ran: did the stream follow the argmax at T > 0?


class FunctionCallDelta(msgspec.Struct, kw_only=True):
    name: str | UnsetType = UNSET  # on a call's first chunk
    arguments: str  # a fragment of the arguments' JSON text ("" on the first chunk)


class ToolCallDelta(msgspec.Struct, kw_only=True):
    """A streamed call's piece: `index` ties the pieces of one call; id and type come first."""

    index: int
    id: str | UnsetType = UNSET
    type: Literal["function"] | UnsetType = UNSET
    function: FunctionCallDelta


class ChatDelta(msgspec.Struct, kw_only=True):
    """The role on the first chunk (content null, as llama-server), text or call pieces on the
    next ones, nothing on the finish chunk."""

    role: Literal["assistant"] | UnsetType = UNSET
    content: str | UnsetType | None = UNSET
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[ToolCallDelta] | UnsetType = UNSET


class ChatChunkChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None


class ChatCompletionChunk(OpenAIObject, kw_only=True):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Usage | UnsetType = UNSET
    timings: Timings | UnsetType = UNSET
    speculative_biased: bool | UnsetType = UNSET  # a drafter ran: did the stream follow the argmax at T > 0?
    prompt_progress: PromptProgress | UnsetType = UNSET  # a prefill progress chunk
