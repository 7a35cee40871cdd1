"""The typed settings object a profile resolves to. The rest of the app receives only this."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from app.loading.paths import EMBEDDED_TARGET
from app.sampling import chain
from app.sampling.params import SamplingParams

DrafterKindName = Literal["none", "draft-model", "prompt-lookup", "mtp", "dflash"]
ParallelName = Literal["none", "tensor"]
# whose prompt-cache entries a request may find: its own tenant's, or every tenant's
CacheScopeName = Literal["tenant", "global"]
WarmupName = Literal["auto", "on", "off"]
GovernorPolicyName = Literal["break-even", "graded", "gated"]  # app/drafters/governor.py
# the stages a chain may name (app/sampling/chain.py: pure Python, no MLX)
SamplerName = Literal[chain.DEFAULT]  # type: ignore[valid-type]
# how a chat answer's thinking block is parsed (app/server/chat/reasoning.py), llama-server's names
ReasoningFormatName = Literal["auto", "deepseek", "deepseek-legacy", "none"]
PoolingName = Literal["mean", "last", "cls", "none"]  # app/execution/embedding.py POOLINGS
# The block loops' (MTP, DFlash family) rule: the contract's biased argmax-against-argmax, or the
# classic loop's lossless rules over the drafters' proposal rows q.
BlockRuleName = Literal["argmax-against-argmax", "lossless"]
LOSSLESS_BLOCK_RULE = "lossless"
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
Probability = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
# The contract's acceptance switches: a profile's [env] table may set them (the loop plan reads them once).
STOCHASTIC_ACCEPT_ENV = "MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT"
ACCEPT_DIAG_ENV = "MLXCEL_SPECULATIVE_ACCEPT_DIAG"
ALLOW_INEXACT_ENV = "MLXCEL_MTP_ALLOW_INEXACT"
ENV_OVERRIDES = (STOCHASTIC_ACCEPT_ENV, ACCEPT_DIAG_ENV, ALLOW_INEXACT_ENV)
DEFAULT_DRAFT_TOKENS = 4  # the classic kinds' draft width k (drafter.num_draft_tokens; LoopPlan's too)
# What a request that sets no sampler field gets: llama-server's defaults, written once (app/sampling/params.py)
UNSET = SamplingParams()


class Group(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A settings table: unknown keys are errors, not silently ignored."""


class TargetSettings(Group):
    """The target model; `target = "DIR"` in a profile is short for `[target] model = "DIR"`."""

    model: str = str(EMBEDDED_TARGET)
    # "tensor": the target is sharded over `world_size` ranks under mlx.launch (app/execution/tensor_parallel.py)
    parallel: ParallelName = "none"
    world_size: Annotated[int, msgspec.Meta(ge=1, le=256)] = 1
    # an mlx-lm LoRA adapter directory, fused into the target's weights at load (app/execution/model.py)
    adapter_path: str | None = None
    # llama-server's --lora-scaled: the adapter's delta times this, on top of its own lora_parameters.scale
    adapter_scale: float = 1.0


class DrafterSettings(Group):
    kind: DrafterKindName = "none"
    model: str | None = None  # drafter directory (draft-model, mtp, dflash)
    num_draft_tokens: Annotated[int, msgspec.Meta(ge=1, le=32)] = DEFAULT_DRAFT_TOKENS  # draft width k
    # proposals shorter than this are retracted unverified: the default of a request's speculative.n_min
    min_draft_tokens: Annotated[int, msgspec.Meta(ge=0, le=32)] = 0
    block_size: Annotated[int, msgspec.Meta(ge=2, le=33)] | None = None  # DFlash verify width (bonus row included)
    p_min: Probability = 0.0  # draft-model: stop drafting below this drafter probability
    block_rule: BlockRuleName = "argmax-against-argmax"  # mtp, dflash: the acceptance rule at T > 0


class SpeculativeSettings(Group):
    # sampler-match drafts draw with the target's own keys of their positions (docs/acceptance-rules.md,
    # "Coupled drafts"); false: from the drafter's stream, for comparison. The output is the same either way.
    coupled: bool = True


class AdaptiveSettings(Group):
    enabled: bool = True  # adaptive verify width of the block loops
    under_load: bool = True  # the tick's goodput choice may narrow T = 0 rows (app/decoding/goodput.py)
    max_width: Annotated[int, msgspec.Meta(ge=2, le=33)] = 16


class ExecutionSettings(Group):
    """How forwards compute (app/execution/prepare.py decides the kernels from it)."""

    # true: batch-invariant kernels, a row's bits never depend on its batch-mates (T = 0 speculation
    # byte-identical to target-only); false: MLX's and mlx-lm's own kernels, as llama-server and vLLM
    # by default (faster on a GPU; a row's bits may depend on the others in its tick)
    exact: bool = True


class GovernorSettings(Group):
    floor: Annotated[float, msgspec.Meta(gt=1.0, le=64.0)] = 4.0  # break-even tokens per verify
    policy: GovernorPolicyName = "break-even"
    adaptive: bool = True  # false: always propose the full block, never pause


class SamplingDefaults(Group):
    """Defaults for requests that do not set a field (llama-server's own defaults, `UNSET`'s)."""

    temperature: Annotated[float, msgspec.Meta(ge=0.0)] = UNSET.temperature
    top_k: Annotated[int, msgspec.Meta(ge=0)] = UNSET.top_k
    top_p: Probability = UNSET.top_p
    min_p: Probability = UNSET.min_p
    repeat_penalty: Annotated[float, msgspec.Meta(gt=0.0)] = UNSET.repeat_penalty
    repeat_last_n: Annotated[int, msgspec.Meta(ge=-1)] = UNSET.repeat_last_n
    presence_penalty: float = UNSET.presence_penalty
    frequency_penalty: float = UNSET.frequency_penalty
    xtc_probability: Probability = UNSET.xtc_probability
    xtc_threshold: Probability = UNSET.xtc_threshold
    dry_multiplier: float = UNSET.dry_multiplier  # 0: DRY off
    dry_base: float = UNSET.dry_base
    dry_allowed_length: Annotated[int, msgspec.Meta(ge=0)] = UNSET.dry_allowed_length
    dry_penalty_last_n: Annotated[int, msgspec.Meta(ge=-1)] = UNSET.dry_penalty_last_n  # -1: the whole context
    dry_sequence_breakers: list[str] = msgspec.field(default_factory=lambda: list(UNSET.dry_sequence_breakers))
    top_n_sigma: float = UNSET.top_n_sigma  # <= 0: off
    typical_p: float = UNSET.typical_p  # >= 1: off
    dynatemp_range: float = UNSET.dynatemp_range  # <= 0: off
    dynatemp_exponent: float = UNSET.dynatemp_exponent
    mirostat: Literal[0, 1, 2] = UNSET.mirostat
    mirostat_tau: float = UNSET.mirostat_tau
    mirostat_eta: float = UNSET.mirostat_eta
    n_predict: Annotated[int, msgspec.Meta(ge=-1)] = -1
    seed: int = -1  # the seed of requests that send none (-1: each draws a random one), llama-server's --seed
    # the sampler chain of requests that send no `samplers` (app/sampling/chain.py), llama-server's --samplers
    samplers: list[SamplerName] = msgspec.field(default_factory=lambda: list(UNSET.samplers))

    def params(self) -> SamplingParams:
        """These defaults as the sampler parameters of a request that sets no field (DRY's
        breakers as their text: their tokens are the tokenizer's, app/sampling/dry.py `dry_breakers`)."""
        given = msgspec.structs.asdict(self)
        fields = {name: given[name] for name in SamplingParams.__struct_fields__ if name in given}
        return SamplingParams(
            **fields | {"dry_sequence_breakers": tuple(self.dry_sequence_breakers), "samplers": tuple(self.samplers)}
        )


class ServerSettings(Group):
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8080
    # API keys, each a tenant (app/profiles/tenants.py): one key, a list, and a file of keys, together
    api_key: str | None = None
    api_keys: list[str] = msgspec.field(default_factory=list)
    api_key_file: str | None = None  # one key per line; blank lines and `#` comments skipped
    max_rows: Annotated[int, msgspec.Meta(ge=1, le=256)] = 8  # rows decoded concurrently; more wait
    max_queue: Annotated[int, msgspec.Meta(ge=0)] = 64  # requests waiting beyond max_rows (then 503)
    # target positions one tick forwards (prefill chunks and verify widths); rows over it go first next tick
    max_batch_tokens: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)] = 1024
    # while rows decode, the most of the engine's time heavy work takes: embedding chunks and the
    # ticks of grammar rows whose masks are costly (app/engine/share.py); 1 turns the throttle off
    heavy_work_share: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] = 0.33
    # run every batch size and draft width once before /health turns 200 (app/decoding/warmup.py):
    # "auto" where kernels compile on first use (a GPU), "on" and "off" everywhere
    warmup: WarmupName = "auto"
    max_tokens: PositiveInt = 4096  # cap on n_predict / max_tokens (-1 means up to this)
    max_prompt_tokens: PositiveInt = 4096
    model_alias: str | None = None  # the model id clients see (default: the target's directory name)
    drain_timeout_s: Annotated[float, msgspec.Meta(ge=0.0, le=3600.0)] = 30.0  # SIGTERM: finish rows this long
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 16 * 1024 * 1024  # larger bodies get 413
    # the listener (app/server/protocol.py): connections at once (lowered below the descriptor limit at
    # startup; past it the oldest idle one closes, or 503), a request's head (431 past either), and
    # the time its head, its body and an idle keep-alive connection may take (408, or closed); an
    # answer whose client takes none of its unsent bytes for write_timeout_s is aborted, and past
    # max_unsent_bytes unsent over every connection the longest stalled are aborted
    max_connections: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)] = 1024
    max_header_bytes: Annotated[int, msgspec.Meta(ge=1024, le=1 << 24)] = 64 * 1024
    max_headers: Annotated[int, msgspec.Meta(ge=8, le=100_000)] = 100
    header_timeout_s: Annotated[float, msgspec.Meta(gt=0.0, le=3600.0)] = 10.0
    body_timeout_s: Annotated[float, msgspec.Meta(gt=0.0, le=3600.0)] = 60.0
    keep_alive_timeout_s: Annotated[float, msgspec.Meta(gt=0.0, le=3600.0)] = 5.0
    write_timeout_s: Annotated[float, msgspec.Meta(gt=0.0, le=3600.0)] = 30.0
    max_unsent_bytes: Annotated[int, msgspec.Meta(ge=1 << 20)] = 256 * 1024 * 1024
    max_json_depth: Annotated[int, msgspec.Meta(ge=4, le=512)] = 64  # deeper JSON bodies get 400
    max_stop_strings: Annotated[int, msgspec.Meta(ge=0, le=1024)] = 16  # more `stop` entries get 400
    max_stop_len: Annotated[int, msgspec.Meta(ge=1, le=65536)] = 256  # longer stop strings get 400
    chat_template_file: str | None = None  # operator's Jinja chat template (sandboxed); default: the model's
    # a built-in template's name (chatml, llama3, ...: app/loading/builtin_templates.py) or a template's
    # text (mlx_lm.server's --chat-template); never beside chat_template_file (checks.py)
    chat_template: str | None = None
    # template variables every chat request gets (mlx_lm.server's --chat-template-args); a request's
    # chat_template_kwargs win over them
    chat_template_kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    template_timeout_s: Annotated[float, msgspec.Meta(gt=0.0, le=60.0)] = 2.0  # a render running longer: 400
    template_max_chars: Annotated[int, msgspec.Meta(ge=1024)] = 4 * 1024 * 1024  # a larger rendered prompt: 400
    # What one request may make the server build (docs/reliability.md, "Limits"): log-probability
    # entries (a token's own and each alternative, over all its rows: 4096 tokens x 32 by default,
    # so one row of OpenAI's top_logprobs 20 at max_tokens fits) and a non-streamed body's bytes.
    max_logprob_entries: Annotated[int, msgspec.Meta(ge=1)] = 131_072
    max_response_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 32 * 1024 * 1024
    # the prompt cache (app/execution/prompt_cache.py): its budget in MiB (0 turns it off) and entries
    prompt_cache_mb: Annotated[int, msgspec.Meta(ge=0, le=1 << 20)] = 512
    prompt_cache_entries: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 64
    # /v1/responses kept for previous_response_id, per tenant: the last this many, within this many MiB
    responses_stored: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)] = 256
    responses_store_mb: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)] = 64
    # "tenant": a request finds only its own tenant's prefixes; "global": every tenant's (a timing side channel)
    prompt_cache_scope: CacheScopeName = "tenant"
    # browser origins CORS lets call: ["*"] answers any origin with "*" and no credentials; listed
    # origins are reflected with credentials; [] turns CORS off
    cors_origins: list[str] = msgspec.field(default_factory=lambda: ["*"])
    # Host names served beside loopback names and IP literals (app/server/hosts.py): checked on a
    # loopback bind, and on any bind once the list is set; ["*"] allows any Host
    allowed_hosts: list[str] = msgspec.field(default_factory=list)
    # "token": one stream frame per token, a verify round's tokens as consecutive frames (llama-server's);
    # "round": one frame per round (fewer frames, each with several tokens)
    stream_frames: Literal["token", "round"] = "token"
    # /v1/embeddings and /embedding (llama-server's --embeddings): the target's pooled hidden states
    embeddings: bool = False
    embeddings_pooling: PoolingName = "mean"
    # positions one embeddings request may embed: its forwards of 32 (app/execution/embedding.py `Plan`:
    # short inputs packed into one, a long one in chunks), so this bounds the engine time; past it, 400.
    # OpenAI's per-request token limit, so clients' default batches (LangChain's 1,000 inputs) pass
    max_embedding_tokens: PositiveInt = 300_000
    web_ui: bool = True  # the chat page at / (app/server/web/index.html)
    # chat answers' thinking parsed as this when a request names no reasoning_format (--reasoning-format)
    reasoning_format: ReasoningFormatName = "auto"
    # a model named org/name that is not in the Hugging Face cache may be downloaded (flag --hf-download)
    allow_model_download: bool = False
    props_show_paths: bool = False  # /props and /v1/models show filesystem paths, not just their last part
    # POST /admin/reload (hot profile reload); needs server.api_key, the server key, which alone may call it
    # (a tenant's key of api_keys or api_key_file may not). SIGHUP reloads regardless.
    admin_reload: bool = False
    # a reload may change the keys that say who may call (app/engine/reload.py ACCESS_KEYS)
    reload_may_change_auth: bool = False


MAX_GRAMMAR_QUEUE = 256  # grammar.max_queue's ceiling: the server keeps a thread for each waiting request


class GrammarSettings(Group):
    """What an untrusted grammar (json_schema, grammar, response_format, tools) may cost; the
    fields are app/sampling/grammar_child.py's GrammarLimits (docs/structured-output.md says why
    each default)."""

    # checked in pure Python before compiling (400s naming the key)
    max_bytes: Annotated[int, msgspec.Meta(ge=1024, le=64 << 20)] = 256 * 1024  # the grammar or schema text
    max_rules: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 1000  # GBNF rules
    max_ref_depth: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 128  # $ref chain (about 1000 overflow llguidance)
    max_definitions: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 2000  # $defs / definitions entries
    max_alternatives: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 1000  # one anyOf / oneOf / enum
    max_property_name: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)] = 1024  # characters
    check_timeout_s: Annotated[float, msgspec.Meta(gt=0.0, le=600.0)] = 1.0  # wall time of those checks together
    max_tools: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 128  # tools in one chat request
    # the worker process that compiles them
    compile_timeout_s: Annotated[float, msgspec.Meta(gt=0.0, le=600.0)] = 2.0  # CPU seconds (wall: 10 times)
    compile_memory_mb: Annotated[int, msgspec.Meta(ge=256, le=1 << 20)] = 2048
    max_queue: Annotated[int, msgspec.Meta(ge=1, le=MAX_GRAMMAR_QUEUE)] = 16  # waiting for the worker (then 503)
    cache_entries: Annotated[int, msgspec.Meta(ge=1, le=1 << 16)] = 256  # checked grammars kept by hash
    # per row, per token: the CPU time one mask may take (the row then ends with a 400-type error)
    mask_budget_ms: Annotated[float, msgspec.Meta(gt=0.0, le=60_000.0)] = 100.0
    # per row: its masks' CPU time on average (after one mask_budget_ms of slack); past it the row ends (400)
    mask_mean_ms: Annotated[float, msgspec.Meta(gt=0.0, le=60_000.0)] = 2.0
    # per row: building its matcher and first mask (checked in the worker; the engine thread does it for every row)
    matcher_budget_ms: Annotated[float, msgspec.Meta(gt=0.0, le=60_000.0)] = 500.0
    # llguidance's own limits (LLParserLimits), for the compile and for every mask
    max_items_in_row: Annotated[int, msgspec.Meta(ge=1)] = 2000
    initial_lexer_fuel: Annotated[int, msgspec.Meta(ge=1)] = 1_000_000
    step_lexer_fuel: Annotated[int, msgspec.Meta(ge=1)] = 200_000
    step_max_items: Annotated[int, msgspec.Meta(ge=1)] = 20_000
    max_lexer_states: Annotated[int, msgspec.Meta(ge=1)] = 50_000
    max_grammar_size: Annotated[int, msgspec.Meta(ge=1)] = 200_000


LogLevelName = Literal["debug", "info", "warning", "error"]


class LoggingSettings(Group):
    level: LogLevelName = "info"
    format: Literal["json", "console"] = "json"
    destination: str = "stdout"  # stdout, stderr, or a file path (appended)


class RoutedModel(Group):
    profile: str  # a shipped profile's name, or a path to a .toml file (relative to this profile's)
    name: str | None = None  # the `model` requests send to reach it (default: the profile's file name)
    aliases: list[str] = msgspec.field(default_factory=list)  # other names for it


class RouterSettings(Group):
    """Many profiles behind one server (app/engine/router.py); off while `models` and `models_dir` are unset."""

    models: list[RoutedModel] = msgspec.field(default_factory=list)
    models_dir: str | None = None  # every *.toml of this directory too, each named by its file's name
    memory_budget_mb: Annotated[int, msgspec.Meta(ge=0)] = 0  # the models' weights on disk, at most; 0: no bound
    idle_unload_s: Annotated[float, msgspec.Meta(ge=0.0)] = 0.0  # unload a model unused this long; 0: never
    # a request waits this long for its model to load, then gets 503 with Retry-After
    load_wait_s: Annotated[float, msgspec.Meta(gt=0.0, le=3600.0)] = 60.0


class Settings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything that says what a server is. `profile` and `source` describe where it came from."""

    target: TargetSettings = msgspec.field(default_factory=TargetSettings)
    drafter: DrafterSettings = msgspec.field(default_factory=DrafterSettings)
    speculative: SpeculativeSettings = msgspec.field(default_factory=SpeculativeSettings)
    adaptive: AdaptiveSettings = msgspec.field(default_factory=AdaptiveSettings)
    execution: ExecutionSettings = msgspec.field(default_factory=ExecutionSettings)
    governor: GovernorSettings = msgspec.field(default_factory=GovernorSettings)
    sampling: SamplingDefaults = msgspec.field(default_factory=SamplingDefaults)
    env: dict[str, str] = msgspec.field(default_factory=dict)
    server: ServerSettings = msgspec.field(default_factory=ServerSettings)
    grammar: GrammarSettings = msgspec.field(default_factory=GrammarSettings)
    logging: LoggingSettings = msgspec.field(default_factory=LoggingSettings)
    router: RouterSettings = msgspec.field(default_factory=RouterSettings)
    profile: str = "flags"
    source: str = "command line"
