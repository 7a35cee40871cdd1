"""What the server is and does: /props, /slots, /metrics, /apply-template."""

from __future__ import annotations

import asyncio
from importlib.metadata import version
from typing import Any

import msgspec
from litestar import Request, Response, get, post
from litestar.params import JSONBody

from app import __version__
from app.decoding.plan import SamplerClass
from app.engine.engine import Engine, EngineState
from app.server import requests
from app.server.schemas import ApplyTemplateRequest
from app.server.service import engine_of, model_alias, ready_engine

BUILD_INFO = f"mlxcel {__version__} (mlx {version('mlx')}, mlx-lm {version('mlx-lm')})"


def drafter_info(engine: Engine) -> dict[str, Any]:
    settings, plan = engine.settings, engine.plan
    return {
        "profile": settings.profile,
        "profile_file": settings.source,
        "drafter": {
            "kind": settings.drafter.kind,
            "model": settings.drafter.model,
            "width": plan.width,
            "p_min": settings.drafter.p_min,
        },
        "rule_at_temperature_0": plan.rules[SamplerClass.ARGMAX],
        "rule_at_temperature_above_0": plan.rules[SamplerClass.SAMPLED],
        "adaptive": msgspec.to_builtins(settings.adaptive),
        "block_widths": list(plan.block_widths) if plan.block_widths else None,
        "governor": msgspec.to_builtins(settings.governor) if settings.drafter.kind == "prompt-lookup" else None,
        "env_overrides": dict(settings.env),
    }


@get("/props", name="props")
async def props(request: Request) -> dict[str, Any]:
    engine = engine_of(request)
    settings = engine.settings
    defaults = msgspec.to_builtins(settings.sampling)
    ready = engine.state is EngineState.READY
    defaults |= {
        "n_ctx": engine.builder.context_limit if ready else None,
        "speculative.n_max": engine.plan.width,
        "speculative.n_min": 0,
        "speculative.p_min": settings.drafter.p_min,
    }
    return {
        "default_generation_settings": defaults,
        "total_slots": settings.server.max_rows,
        "model_path": settings.target,
        "model_alias": model_alias(settings),
        "build_info": BUILD_INFO,
        "chat_template": getattr(engine.target.tokenizer, "chat_template", None) if ready else None,
        "modalities": {"vision": False, "audio": False},
        "is_sleeping": False,
        "mlxcel": drafter_info(engine),
    }


@get("/slots", name="slots")
async def slots(request: Request) -> list[dict[str, Any]]:
    engine = ready_engine(request)
    rows = dict(engine.rows)
    width = engine.plan.width
    out = []
    for slot in range(engine.settings.server.max_rows):
        row = rows.get(slot)
        entry: dict[str, Any] = {
            "id": slot,
            "id_task": -1,
            "is_processing": row is not None,
            "n_ctx": engine.builder.context_limit,
        }
        if row is not None:
            generation, sampling = row.generation, row.job.request.sampling
            speculation = generation.loop.speculation
            stats = speculation.stats
            n_max = row.job.request.n_max if row.job.request.n_max is not None else width
            entry |= {
                "id_task": row.job.request_id,
                "params": {
                    **msgspec.to_builtins(sampling),
                    "n_predict": row.job.request.max_tokens,
                    "speculative.n_max": n_max,
                    "speculative.n_min": row.job.request.n_min,
                    "speculative.p_min": row.job.request.p_min,
                },
                "next_token": {
                    "n_decoded": len(generation.emitted),
                    "has_next_token": not generation.finished,
                },
                "draft": {
                    "draft_n": stats.proposed,
                    "draft_n_accepted": stats.accepted,
                    "draft_rounds": stats.rounds,
                }
                if speculation.drafting
                else None,
            }
        out.append(entry)
    return out


def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> list[str]:
    lines = [f"# HELP llamacpp:{name} {help_text}", f"# TYPE llamacpp:{name} {kind}"]
    lines += [f"llamacpp:{name}{labels} {value:g}" for labels, value in samples]
    return lines


@get("/metrics", name="metrics", media_type="text/plain; version=0.0.4")
async def metrics(request: Request) -> str:
    """Prometheus text with llama-server's metric names and the speculative counters."""
    m = ready_engine(request).metrics
    prompt_rate = m.prompt_tokens_total / m.prompt_seconds_total if m.prompt_seconds_total else 0.0
    predicted_rate = (
        m.tokens_predicted_total / m.tokens_predicted_seconds_total if m.tokens_predicted_seconds_total else 0.0
    )
    per_position = [(f'{{position="{i}"}}', float(n)) for i, n in enumerate(m.spec_accepted_per_position)]
    lines = [
        *metric(
            "prompt_tokens_total",
            "counter",
            "Number of prompt tokens processed.",
            [("", m.prompt_tokens_total)],
        ),
        *metric("prompt_seconds_total", "counter", "Prompt process time.", [("", m.prompt_seconds_total)]),
        *metric(
            "tokens_predicted_total",
            "counter",
            "Number of generation tokens processed.",
            [("", m.tokens_predicted_total)],
        ),
        *metric(
            "tokens_predicted_seconds_total",
            "counter",
            "Predict process time.",
            [("", m.tokens_predicted_seconds_total)],
        ),
        *metric("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.", [("", prompt_rate)]),
        *metric(
            "predicted_tokens_seconds",
            "gauge",
            "Average generation throughput in tokens/s.",
            [("", predicted_rate)],
        ),
        *metric("requests_processing", "gauge", "Number of requests processing.", [("", m.requests_processing)]),
        *metric("requests_deferred", "gauge", "Number of requests deferred.", [("", m.requests_deferred)]),
        *metric(
            "spec_decode_num_drafts_total",
            "counter",
            "Verify rounds run on drafted tokens.",
            [("", m.spec_drafts_total)],
        ),
        *metric(
            "spec_decode_num_draft_tokens_total",
            "counter",
            "Drafted tokens proposed for verification.",
            [("", m.spec_draft_tokens_total)],
        ),
        *metric(
            "spec_decode_num_accepted_tokens_total",
            "counter",
            "Drafted tokens accepted and emitted.",
            [("", m.spec_accepted_tokens_total)],
        ),
        *metric(
            "spec_decode_num_accepted_tokens_per_pos_total",
            "counter",
            "Drafted tokens accepted at each draft position (0 = first).",
            per_position,
        ),
    ]
    return "\n".join(lines) + "\n"


@post("/apply-template", status_code=200, name="apply-template")
async def apply_template(request: Request, data: JSONBody[ApplyTemplateRequest]) -> Response:
    """The prompt text the chat template makes of these messages."""
    engine = ready_engine(request)
    prompt = await asyncio.to_thread(
        requests.chat_prompt, data.messages, engine.target.tokenizer, None, engine.settings, tokenize=False
    )
    return Response({"prompt": prompt})


ROUTES = [props, slots, metrics, apply_template]
