"""Pure-Python bounds on an untrusted grammar, checked before it reaches the compiler.

They are cheap (a pass over the text or the schema) and refuse what is known to be costly
before a worker spends its time limit on it: the size, GBNF's rule count (conversion time grows
about cubically with it), a JSON schema's `$ref` chains (llguidance recurses along them: a
thousand deep overflows its native stack), its definitions, its `anyOf`/`oneOf`/`enum` widths
and its property names. Each refusal names its [grammar] key.

A numeric bound (`minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`) beyond 2**53 is
refused too: llguidance reads bounds as 64-bit floats and an integer's through int64, saturating,
so such a bound moves (a `minimum` of 1.23e29 became int64's largest and answered it, against the
schema); within 2**53 every integer bound and every float bound is exact.

Each node a `$ref` names is walked once however many references name it (2,000 anchor
references once walked the whole schema 2,000 times: minutes per request), and the walks
together stop at `grammar.check_timeout_s` of wall time.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from app.sampling.grammar import GrammarError
from app.sampling.grammar_child import GrammarLimits

RULE = re.compile(r"::=")
CLOCK_EVERY = 1024  # nodes walked between two looks at the clock
DEFINITIONS = ("$defs", "definitions")
ALTERNATIVES = ("anyOf", "oneOf", "enum")
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
EXACT_BOUND = 2**53  # the largest magnitude below which every integer is a 64-bit float


def check_size(what: str, text: str, limits: GrammarLimits) -> None:
    size = len(text.encode())
    if size > limits.max_bytes:
        raise GrammarError(f"{what}: {size} bytes; this server accepts {limits.max_bytes} (grammar.max_bytes)")


def check_gbnf(text: str, limits: GrammarLimits) -> None:
    check_size("grammar", text, limits)
    rules = len(RULE.findall(text))
    if rules > limits.max_rules:
        raise GrammarError(f"grammar: {rules} rules; this server accepts {limits.max_rules} (grammar.max_rules)")


def check_schema(schema: dict[str, Any], text: str, limits: GrammarLimits) -> None:
    """`text` is the schema as JSON (what the compiler gets)."""
    check_size("JSON schema", text, limits)
    definitions = sum(len(found) for table in DEFINITIONS if isinstance(found := schema.get(table), dict))
    if definitions > limits.max_definitions:
        raise GrammarError(
            f"JSON schema: {definitions} definitions; this server accepts "
            f"{limits.max_definitions} (grammar.max_definitions)"
        )
    walk = Walk(limits)
    walk(schema)  # the widths and names everywhere, referred to or not; the anchors
    roots = walk({key: value for key, value in schema.items() if key not in DEFINITIONS})
    by_pointer: dict[str, list[str]] = {}
    by_node: dict[int, list[str]] = {}  # by the node's identity: many pointers may name one node

    def refs(pointer: str) -> list[str]:
        if pointer not in by_pointer:
            node = _resolved(schema, pointer, walk.anchors)
            if id(node) not in by_node:
                by_node[id(node)] = walk(node)
            by_pointer[pointer] = by_node[id(node)]
        return by_pointer[pointer]

    depth = _ref_depth(roots, refs)
    if depth > limits.max_ref_depth:
        raise GrammarError(
            f"JSON schema: $ref chains {depth} deep; this server accepts {limits.max_ref_depth} (grammar.max_ref_depth)"
        )


class Walk:
    """Walks over one schema: each gives the local `$ref` pointers under a node, checking widths
    and property names on the way, and notes the `$anchor`s; all of them share one deadline."""

    def __init__(self, limits: GrammarLimits) -> None:
        self.limits = limits
        self.anchors: dict[str, Any] = {}
        self._deadline = time.monotonic() + limits.check_timeout_s
        self._nodes = 0

    def __call__(self, node: Any) -> list[str]:
        return _walk(node, self.limits, self._tick)

    def _tick(self, item: dict[str, Any]) -> None:
        anchor = item.get("$anchor")
        if isinstance(anchor, str):
            self.anchors.setdefault(anchor, item)
        self._nodes += 1
        if self._nodes % CLOCK_EVERY == 0 and time.monotonic() > self._deadline:
            raise GrammarError(
                f"JSON schema: checking its bounds took longer than {self.limits.check_timeout_s:g} s "
                "(grammar.check_timeout_s)"
            )


def _walk(node: Any, limits: GrammarLimits, visit: Callable[[dict[str, Any]], None]) -> list[str]:
    """The local `$ref` pointers in `node`, checking widths and property names on the way;
    `visit` sees every object."""
    found: list[str] = []
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
            continue
        if not isinstance(item, dict):
            continue
        visit(item)
        for key in ALTERNATIVES:
            options = item.get(key)
            if isinstance(options, list) and len(options) > limits.max_alternatives:
                raise GrammarError(
                    f"JSON schema: {key} with {len(options)} alternatives; this server accepts "
                    f"{limits.max_alternatives} (grammar.max_alternatives)"
                )
        properties = item.get("properties")
        if isinstance(properties, dict):
            longest = max(map(len, properties), default=0)
            if longest > limits.max_property_name:
                raise GrammarError(
                    f"JSON schema: a property name of {longest} characters; this server accepts "
                    f"{limits.max_property_name} (grammar.max_property_name)"
                )
        _check_bounds(item)
        ref = item.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            found.append(ref[1:])
        stack.extend(value for key, value in item.items() if key != "$ref")
    return found


def _check_bounds(item: dict[str, Any]) -> None:
    for key in BOUNDS:
        value = item.get(key)
        if isinstance(value, int | float) and abs(value) > EXACT_BOUND:
            raise GrammarError(
                f"JSON schema: {key} {value!r} is beyond what the grammar engine represents exactly; "
                f"numeric bounds must lie within -{EXACT_BOUND} and {EXACT_BOUND}"
            )


def _resolved(schema: Any, pointer: str, anchors: dict[str, Any]) -> Any:
    """The node a JSON pointer (`/$defs/a`) or an anchor's name (`a`, a `$anchor`) names in
    `schema`, or None."""
    if pointer and not pointer.startswith("/"):
        return anchors.get(pointer)
    node = schema
    for part in pointer.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _ref_depth(roots: list[str], refs: Callable[[str], list[str]]) -> int:
    """The longest chain of `$ref`s from the root, iteratively (a chain may be thousands long);
    a cycle counts once (llguidance compiles recursion without unrolling it)."""
    depth: dict[str, int] = {}
    on_path: set[str] = set()
    deepest = 0
    for root in roots:
        stack: list[tuple[str, bool]] = [(root, False)]
        while stack:
            name, done = stack.pop()
            if done:
                on_path.discard(name)
                depth[name] = 1 + max((depth.get(c, 0) for c in refs(name) if c not in on_path), default=0)
                continue
            if name in depth or name in on_path:
                continue
            on_path.add(name)
            stack.append((name, True))
            stack.extend((child, False) for child in refs(name) if child not in depth and child not in on_path)
        deepest = max(deepest, depth.get(root, 0))
    return deepest
