"""Turning wire requests into row requests: defaults, aliases, tokenization and validation."""

from __future__ import annotations

import re
from typing import Any

import msgspec
from mlx_lm.tokenizer_utils import TokenizerWrapper

from app.decoding.builder import RowRequest
from app.profiles.schema import Settings
from app.sampling import SamplingParams, chain
from app.sampling.dry import MAX_BREAKERS, dry_breakers
from app.sampling.grammar import Grammar
from app.sampling.infill import with_infill
from app.sampling.logprobs import ProbsRequest
from app.sampling.rng import resolve_seed
from app.server.core.schemas import (
    LogitBias,
    ResponseFormat,
    SamplingFields,
)
from app.server.errors import ApiError

# What llama-server's strtol reads whole as a token id. ASCII only: str.isdigit() also takes
# "١٢" and "²", and int() refuses the second.
TOKEN_ID = re.compile(r"\s*[+-]?[0-9]+", re.ASCII)
# The sampler's parameters built here from other fields (breakers, biases, the chain, the infill
# stage's tables from the tokenizer); every other one is a knob a request sets by name, defaulted
# by the profile's `[sampling]`.
BUILT_APART = frozenset({"dry_sequence_breakers", "dry_breakers", "logit_bias", "samplers", "infill"})
SAMPLING_FIELDS = tuple(name for name in SamplingParams.__struct_fields__ if name not in BUILT_APART)


def requested_tokens(request: SamplingFields, settings: Settings) -> int:
    """n_predict, or its OpenAI aliases, or the profile's default; -1 means until EOS."""
    values = (request.n_predict, request.max_tokens, request.max_completion_tokens)
    value = next((v for v in values if v is not None), settings.sampling.n_predict)
    if value < -1:
        raise ApiError(400, f"n_predict must be -1 (until EOS) or >= 0, got {value}")
    return value


def max_tokens(request: SamplingFields, settings: Settings) -> int:
    """The tokens a row may decide: the requested number (-1: until EOS), capped by the server's limit."""
    value, cap = requested_tokens(request, settings), settings.server.max_tokens
    return cap if value == -1 else min(value, cap)


def logit_bias(raw: LogitBias | None, tokenizer: TokenizerWrapper) -> dict[int, float]:
    """llama-server's two spellings: {"id or text": bias} and [[id or text, bias], ...].

    A bias is a number, or false to ban the token (true is refused: it names no bias). As in
    llama-server, an object key of ASCII digits is a token id and any other key is text, whose
    tokens all get the bias; in the list spelling only a number is an id.
    """
    if not raw:
        return {}
    pairs = raw.items() if isinstance(raw, dict) else raw
    bias: dict[int, float] = {}
    for key, value in pairs:
        if value is True:
            raise ApiError(400, f"logit_bias: the bias for {key!r} must be a number or false (to ban), not true")
        amount = float("-inf") if value is False else value
        if isinstance(key, int):
            ids = [key]
        elif isinstance(raw, dict) and TOKEN_ID.fullmatch(key):
            ids = [int(key)]
        else:
            ids = tokenizer.encode(key, add_special_tokens=False)
        for token in ids:
            bias[token] = amount
    return bias


def sampling(
    request: SamplingFields, settings: Settings, tokenizer: TokenizerWrapper, vocab: int, tenant: str
) -> SamplingParams:
    defaults = msgspec.structs.asdict(settings.sampling)
    chosen: dict[str, Any] = {f: getattr(request, f) for f in SAMPLING_FIELDS if getattr(request, f) is not None}
    bias = logit_bias(request.logit_bias, tokenizer)
    if request.ignore_eos:  # llama-server's: every end-of-generation token banned, after the request's own biases
        bias |= dict.fromkeys(sorted(t for t in tokenizer.eos_token_ids if t < vocab), float("-inf"))
    stages = {"logit_bias": bias, "samplers": sampler_chain(request.samplers, settings)}
    params = SamplingParams(**{f: defaults[f] for f in SAMPLING_FIELDS} | chosen | stages)
    if params.has_dry:
        given = request.dry_sequence_breakers
        breakers = tuple(defaults["dry_sequence_breakers"] if given is None else given)
        if len(breakers) > MAX_BREAKERS:
            raise ApiError(400, f"dry_sequence_breakers: at most {MAX_BREAKERS} entries, got {len(breakers)}")
        params = msgspec.structs.replace(
            params, dry_sequence_breakers=breakers, dry_breakers=dry_breakers(tokenizer, breakers, tenant)
        )
    problems = params.problems(vocab)
    if problems:
        raise ApiError(400, "; ".join(problems))
    return with_infill(params, tokenizer)


def sampler_chain(value: Any, settings: Settings) -> tuple[str, ...]:
    """The stages a request's `samplers` names, in its order; the profile's chain when it names none."""
    try:
        named = chain.parse(value)
    except chain.ChainError as exc:
        raise ApiError(400, f"samplers: not supported: {exc}") from exc
    return tuple(settings.sampling.samplers) if named is None else named


def check_token_ids(tokens: list[int], vocab: int) -> None:
    bad = [t for t in tokens if not 0 <= t < vocab]
    if bad:
        raise ApiError(400, f"token ids out of the vocabulary [0, {vocab}): {bad[:5]}")


def stop_strings(stop: str | list[str] | None, settings: Settings) -> tuple[str, ...]:
    """The non-empty stop strings, within server.max_stop_strings and server.max_stop_len."""
    if stop is None:
        return ()
    strings = (stop,) if isinstance(stop, str) else tuple(s for s in stop if s)
    limits = settings.server
    if len(strings) > limits.max_stop_strings:
        raise ApiError(
            400,
            f"stop: {len(strings)} strings; this server accepts {limits.max_stop_strings} (server.max_stop_strings)",
        )
    longest = max(map(len, strings), default=0)
    if longest > limits.max_stop_len:
        raise ApiError(
            400,
            f"stop: a string of {longest} characters; this server accepts {limits.max_stop_len} (server.max_stop_len)",
        )
    return strings


def grammar(request: SamplingFields, forced_call: dict[str, Any] | None = None) -> tuple[str, Any] | None:
    """The grammar the output must follow, uncompiled (app/server/core/grammars.py compiles it off
    the event loop): `json_schema`, `grammar`, OpenAI's `response_format` or a forced tool call
    (`forced_call`: its schema, the chat pipeline's: app/server/chat/tools.py), at most one of them."""
    chosen = requested_grammar(request, forced_call)
    if chosen is not None and request.ignore_eos:
        raise ApiError(400, "ignore_eos cannot be combined with a grammar: the output ends where the grammar does")
    return chosen


def requested_grammar(request: SamplingFields, forced_call: dict[str, Any] | None = None) -> tuple[str, Any] | None:
    """("grammar", GBNF text) or ("json_schema", schema or None for any JSON object), or None.
    An empty grammar is none, as llama-server reads it (SillyTavern sends `"grammar": ""`)."""
    chosen = [("grammar", request.grammar)] if request.grammar else []
    # llama-server reads json_schema only without a grammar field: an empty schema beside one (SillyTavern
    # sends `"json_schema": {}` with `"grammar": ""`) asks for nothing
    if request.json_schema is not None and not (request.json_schema == {} and request.grammar is not None):
        chosen.append(("json_schema", llama_schema(request.json_schema)))
    response_format: ResponseFormat | None = getattr(request, "response_format", None)
    if response_format is not None and response_format.type != "text":
        chosen.append(("json_schema", llama_schema(response_schema(response_format))))
    if forced_call is not None:  # a required or named call: decoded against its schema
        chosen.append(("json_schema", llama_schema(forced_call)))
    if len(chosen) > 1:
        raise ApiError(400, "give at most one of grammar, json_schema, response_format and a required tool call")
    return chosen[0] if chosen else None


# Where a JSON schema holds schemas: a map of them, one, or a list of them
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_ONES = ("additionalProperties", "items", "contains", "not", "if", "then", "else", "propertyNames")
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")


def llama_schema(schema: Any) -> Any:
    """The schema as llama.cpp's converter reads it: a (sub)schema without `type` but with `items`
    or `prefixItems` is an array's (llguidance would let any type through). Other schemas unchanged."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: llama_schema(sub) for name, sub in out[key].items()}
    for key in SCHEMA_ONES:
        if isinstance(out.get(key), dict):
            out[key] = llama_schema(out[key])
    for key in SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [llama_schema(sub) for sub in out[key]]
    if "type" not in out and ("items" in out or "prefixItems" in out):
        out["type"] = "array"
    return out


def response_schema(response_format: ResponseFormat) -> dict[str, Any] | None:
    """The schema an OpenAI response_format asks for (None: any JSON object)."""
    if response_format.type == "json_object":
        return response_format.schema
    if response_format.type == "json_schema":
        if response_format.json_schema is None or response_format.json_schema.schema is None:
            raise ApiError(400, "response_format json_schema needs json_schema.schema")
        return response_format.json_schema.schema
    raise ApiError(
        400, f"response_format type must be one of text, json_object, json_schema, but got: {response_format.type}"
    )


MAX_N_PROBS = 1000  # candidates per token: bounds the answer (each is an object per token)


def probs_request(request: SamplingFields, settings: Settings, rows: int = 1) -> ProbsRequest | None:
    """The log-probabilities a request asks for, in its route's spelling (`asked_logprobs`: OpenAI
    chat's `logprobs` with `top_logprobs`, OpenAI completions' `logprobs` as a count, llama-server's
    `n_probs` on any route, as llama-server reads it) and `post_sampling_probs`; None: none.
    Each of the request's `rows` gets an equal share of server.max_logprob_entries.
    """
    if not 0 <= request.n_probs <= MAX_N_PROBS:
        raise ApiError(400, f"n_probs must be within [0, {MAX_N_PROBS}], got {request.n_probs}")
    top, wanted = request.asked_logprobs()
    if request.post_sampling_probs and not wanted:
        raise ApiError(400, "post_sampling_probs needs n_probs > 0 (or logprobs) to report anything")
    if not wanted:
        return None
    probs = ProbsRequest(top, request.post_sampling_probs, settings.server.max_logprob_entries // rows)
    refuse_known_excess(probs, request, settings, rows)
    return probs


def refuse_known_excess(probs: ProbsRequest, request: SamplingFields, settings: Settings, rows: int) -> None:
    """A request that names its length is refused up front when a row's entries would pass its
    share (ProbsRequest.max_entries: the budget split evenly, so the rows together stay within
    it). One that runs until EOS usually ends far sooner than server.max_tokens, so it runs, and
    a row stops with a 400 only once it reaches its share (ProbsRequest.check_room)."""
    if requested_tokens(request, settings) == -1:
        return
    tokens, budget = max_tokens(request, settings), settings.server.max_logprob_entries
    wanted = rows * probs.entries(tokens)  # over the budget exactly when a row's pass its share
    if wanted > budget:
        raise ApiError(
            400,
            f"log-probabilities: {rows} row(s) x {tokens} tokens x {probs.top + 1} entries make {wanted}; "
            f"this server builds at most {budget} per request (server.max_logprob_entries)",
        )


def check_prompt_fits(tokens: list[int], settings: Settings, context_limit: int) -> None:
    """llama-server's `exceed_context_size_error` for a prompt that leaves no room to generate
    (as long as the context) or is longer than `server.max_prompt_tokens`; `n_ctx` is the
    prompt length from which prompts are refused, so a client can compare the two counts."""
    n_ctx = min(context_limit, settings.server.max_prompt_tokens + 1)
    if len(tokens) >= n_ctx:
        limit = (
            f"the context is {context_limit} tokens"
            if n_ctx == context_limit
            else f"this server accepts {settings.server.max_prompt_tokens} (server.max_prompt_tokens)"
        )
        raise ApiError(
            400,
            f"the request exceeds the available context size: the prompt has {len(tokens)} tokens; {limit}",
            "exceed_context_size_error",
            {"n_prompt_tokens": len(tokens), "n_ctx": n_ctx},
        )


def row_request(
    request: SamplingFields,
    tokens: list[int],
    settings: Settings,
    params: SamplingParams,
    choice: int = 0,
    grammar: Grammar | None = None,
    rows: int = 1,
    *,
    tenant: str,
) -> RowRequest:
    """Row `choice` of a prompt, one of the request's `rows`, for `tenant` (the one the API key
    identified); `grammar` is the request's (requests.grammar, built once for all its rows: each
    row gets its own matcher over it)."""
    n_max = request.speculative_n_max
    if n_max is not None and n_max < 0:
        raise ApiError(400, "speculative.n_max must be >= 0 (0 turns speculation off for this request)")
    p_min = request.speculative_p_min if request.speculative_p_min is not None else settings.drafter.p_min
    if not 0.0 <= p_min <= 1.0:
        raise ApiError(400, "speculative.p_min must be within [0, 1]")
    return RowRequest(
        prompt=tokens,
        sampling=params,
        max_tokens=max_tokens(request, settings),
        # the row's seed, resolved here only (the builder keys the row with it, generation_settings reports it);
        # the profile's (--seed) when the request has none
        seed=resolve_seed(settings.sampling.seed if request.seed is None else request.seed, choice),
        stop=stop_strings(request.stop, settings),
        ignore_eos=request.ignore_eos,
        n_indent=request.n_indent,
        t_max_predict_ms=request.t_max_predict_ms,
        n_max=n_max,  # the request's cap: the builder resolves the row's from the plan's (Finished.n_max)
        n_min=max(
            0, settings.drafter.min_draft_tokens if request.speculative_n_min is None else request.speculative_n_min
        ),
        p_min=p_min,
        probs=probs_request(request, settings, rows),
        grammar=grammar,
        cache_prompt=request.cache_prompt,
        tenant=tenant,
    )
