"""Chat templates (the model's own or the operator's) rendered in a sandbox, bounded in time and size.

A Jinja render cannot be interrupted from outside, so the limits are enforced from inside: every
`for` loop iterates through a deadline check, every call, filter and intercepted operator checks
the deadline and the sizes it is about to make, and the output is checked chunk by chunk.
Templates are compiled once per source text; the globals mirror transformers' chat environment.
"""

from __future__ import annotations

import functools
import json
import operator
import time
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.loading.builtin_templates import builtin_source

# Keys that steer apply_chat_template itself or name what the server passes to the template: neither a
# request's chat_template_kwargs nor the profile's server.chat_template_kwargs may set them. Others
# become template variables, as in llama-server (e.g. enable_thinking).
RESERVED_TEMPLATE_KEYS = frozenset({
    "chat_template", "tokenize", "return_tensors", "return_dict", "return_assistant_tokens_mask",
    "tokenizer_kwargs", "padding", "truncation", "max_length", "sanitize_control_tokens",
    "add_generation_prompt", "continue_final_message", "conversation", "messages", "tools", "documents",
})  # fmt: skip
MAX_POWER_BITS = 4096  # an `a ** b` over this many bits is refused: big-int powers run in C, unchecked


class TemplateLimitError(Exception):
    """A render ran past a profile limit; `key` names it (e.g. server.template_timeout_s)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Limits:
    timeout_s: float
    max_chars: int


@dataclass
class Budget:
    """One render's deadline and size cap, read by the environment's hooks."""

    limits: Limits
    deadline: float

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimitError(
                "server.template_timeout_s",
                f"the chat template ran longer than server.template_timeout_s ({self.limits.timeout_s:g} s)",
            )

    def check_size(self, size: int, what: str = "a value") -> None:
        if size > self.limits.max_chars:
            raise TemplateLimitError(
                "server.template_max_chars",
                f"the chat template made {what} larger than server.template_max_chars ({self.limits.max_chars})",
            )


_budget: ContextVar[Budget] = ContextVar("chat_template_budget")


def _sized(value: Any) -> int:
    return len(value) if isinstance(value, str | bytes | list | tuple | dict) else 0


def _check_arguments(budget: Budget, args: Iterable[Any]) -> None:
    """Integers size what str.center, indent, format widths and the like allocate in one C call."""
    budget.tick()
    for arg in args:
        if isinstance(arg, int) and not isinstance(arg, bool) and abs(arg) > budget.limits.max_chars:
            budget.check_size(abs(arg), "an argument")


def _checked_size(value: Any) -> Any:
    _budget.get().check_size(_sized(value))
    return value


def _guarded_iter(iterable: Iterable[Any]) -> Iterator[Any]:
    budget = _budget.get()
    for item in iterable:
        budget.tick()
        yield item


class _GuardedLoops(CodeGenerator):
    """Compiles `{% for x in xs %}` as a loop over `environment.guarded_iter(xs)`, and `a ~ b` as
    `environment.checked_size(a ~ b)`."""

    def visit_For(self, node: nodes.For, frame: Frame) -> None:  # noqa: N802 (jinja's visitor name)
        guarded = nodes.Call(nodes.EnvironmentAttribute("guarded_iter"), [node.iter], [], None, None)
        super().visit_For(nodes.For(node.target, guarded, node.body, node.else_, node.test, node.recursive), frame)

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:  # noqa: N802
        self.write("environment.checked_size(")
        super().visit_Concat(node, frame)
        self.write(")")


class _GenerationTag(Extension):
    """transformers' `{% generation %}` marks assistant text for training masks; here it renders as is."""

    tags = frozenset({"generation"})

    def parse(self, parser: jinja2.parser.Parser) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    code_generator_class = _GuardedLoops
    intercepted_binops = frozenset({"*", "**", "+"})

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _GenerationTag])
        self.guarded_iter = _guarded_iter
        self.checked_size = _checked_size
        self.filters = {name: _bounded_filter(f) for name, f in self.filters.items()}
        self.filters["tojson"] = _bounded_filter(tojson)
        self.globals |= {"raise_exception": raise_exception, "strftime_now": strftime_now}

    def call(self, context: jinja2.runtime.Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        budget = _budget.get()
        _check_arguments(budget, (*args, *kwargs.values()))
        result = super().call(context, obj, *args, **kwargs)
        budget.check_size(_sized(result))
        return result

    def call_binop(self, context: jinja2.runtime.Context, op: str, left: Any, right: Any) -> Any:
        budget = _budget.get()
        budget.tick()
        if op == "**":
            if (
                isinstance(left, int)
                and isinstance(right, int)
                and right * max(abs(left).bit_length(), 1) > MAX_POWER_BITS
            ):
                budget.check_size(budget.limits.max_chars + 1, "a power")
            return operator.pow(left, right)
        if op == "*":
            count = right if isinstance(right, int) else left if isinstance(left, int) else 1
            budget.check_size(max(_sized(left), _sized(right)) * max(count, 0))
            return operator.mul(left, right)
        budget.check_size(_sized(left) + _sized(right))
        return operator.add(left, right)


def _bounded_filter(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)  # keeps jinja's pass_context / pass_environment markers
    def bounded(*args: Any, **kwargs: Any) -> Any:
        budget = _budget.get()
        _check_arguments(budget, (*args[1:], *kwargs.values()))
        result = function(*args, **kwargs)
        budget.check_size(_sized(result))
        return result

    return bounded


def raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
           sort_keys: bool = False) -> str:  # fmt: skip
    """transformers' tojson: no HTML escaping (prompts are not HTML), and json.dumps's options."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


ENVIRONMENT = BoundedEnvironment()


@functools.lru_cache(maxsize=8)
def compile_template(source: str) -> jinja2.Template:
    """Raises jinja2.TemplateSyntaxError for a template that does not parse."""
    return ENVIRONMENT.from_string(source)


@functools.lru_cache(maxsize=4)
def read_template_file(path: str) -> str:
    """The operator's template file, read once (OSError)."""
    return Path(path).read_text(encoding="utf-8")


def load_template_file(path: str) -> jinja2.Template:
    """The operator's template, compiled (OSError, TemplateSyntaxError); both steps are cached."""
    return compile_template(read_template_file(path))


def chosen_source(tokenizer: Any, operator_file: str | None, named: str | None = None) -> str | None:
    """The source of the template in use: the operator's when the profile names one (a file,
    or `named`: a built-in template's name or a template's text, builtin_templates.builtin_source),
    else the model's own (None: it has none)."""
    if operator_file:
        return read_template_file(operator_file)
    if named:
        return builtin_source(named)
    source = getattr(tokenizer, "chat_template", None)
    if isinstance(source, dict):  # named templates; "default" is the chat one
        source = source.get("default")
    return source if isinstance(source, str) and source else None


def chosen(tokenizer: Any, operator_file: str | None, named: str | None = None) -> jinja2.Template | None:
    """The template in use, compiled (None: the model has none)."""
    source = chosen_source(tokenizer, operator_file, named)
    return compile_template(source) if source else None


THINKING_TAGS = ("<think>", "</think>")  # what llama-server's reasoning_format parses


def writes_thinking(source: str | None) -> bool:
    """Whether a template writes thinking blocks (both tags appear in it)."""
    return source is not None and all(tag in source for tag in THINKING_TAGS)


def render(template: jinja2.Template, limits: Limits, variables: dict[str, Any]) -> str:
    """The rendered text; TemplateLimitError past a limit, jinja2 errors for a failing template."""
    budget = Budget(limits, time.monotonic() + limits.timeout_s)
    token = _budget.set(budget)
    try:
        chunks, size = [], 0
        for chunk in template.generate(variables):
            size += len(chunk)
            budget.check_size(size, "a prompt")
            budget.tick()
            chunks.append(chunk)
        return "".join(chunks)
    finally:
        _budget.reset(token)


@dataclass(frozen=True)
class TemplateCaps:
    """What a chat template renders, as llama-server's /props `chat_template_caps` names it: found
    by rendering probe conversations and looking for their marks in the text (a template that
    raises on a probe does not support it)."""

    supports_system_role: bool
    supports_tools: bool  # the request's `tools` reach the prompt (else the model never sees them)
    supports_tool_calls: bool  # an assistant's past calls reach the prompt
    supports_parallel_tool_calls: bool  # ... two of them in one message


PROBE = "mlxcel_probe"


def _probe_call(index: int) -> dict[str, Any]:
    function = {"name": f"{PROBE}_call_{index}", "arguments": {"arg": "value"}}
    return {"id": f"call{index}", "type": "function", "function": function}


def capabilities(template: jinja2.Template, limits: Limits, variables: dict[str, Any]) -> TemplateCaps:
    """The template's capabilities; `variables` are the special tokens it may read."""

    def renders(marks: tuple[str, ...], messages: list[dict[str, Any]], tools: list[Any] | None = None) -> bool:
        probe = variables | {"messages": messages, "tools": tools, "documents": None, "add_generation_prompt": True}
        try:
            text = render(template, limits, probe)
        except Exception:  # a template that cannot render the probe does not support it
            return False
        return all(mark in text for mark in marks)

    user = {"role": "user", "content": "Hi"}
    tool = {"type": "function", "function": {"name": f"{PROBE}_tool", "parameters": {"type": "object"}}}
    calls = [_probe_call(1), _probe_call(2)]
    history = [user, {"role": "assistant", "content": "", "tool_calls": calls}]
    history += [{"role": "tool", "content": "Tool response", "tool_call_id": "call1"}, user]
    return TemplateCaps(
        supports_system_role=renders((f"{PROBE}_system",), [{"role": "system", "content": f"{PROBE}_system"}, user]),
        supports_tools=renders((f"{PROBE}_tool",), [user], [tool]),
        supports_tool_calls=renders((f"{PROBE}_call_1",), history, [tool]),
        supports_parallel_tool_calls=renders((f"{PROBE}_call_1", f"{PROBE}_call_2"), history, [tool]),
    )
