"""Pure-Python bounds on an untrusted grammar, checked before it reaches the compiler.

They are cheap (one pass over the text or the schema) and refuse what is known to be costly
before a worker spends its time limit on it: the size, GBNF's rule count (conversion time grows
about cubically with it), a JSON schema's `$ref` chains (llguidance recurses along them: a
thousand deep overflows its native stack), its definitions, its `anyOf`/`oneOf`/`enum` widths
and its property names. Each refusal names its [grammar] key.
"""

from __future__ import annotations

import re
from typing import Any

from app.sampling.grammar import GrammarError
from app.sampling.grammar_child import GrammarLimits

RULE = re.compile(r"::=")
LOCAL_REF = re.compile(r"#/(\$defs|definitions)/([^/]+)$")
ALTERNATIVES = ("anyOf", "oneOf", "enum")


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
    definitions: dict[str, Any] = {}
    for table in ("$defs", "definitions"):
        found = schema.get(table)
        if isinstance(found, dict):
            definitions |= {f"{table}/{name}": value for name, value in found.items()}
    if len(definitions) > limits.max_definitions:
        raise GrammarError(
            f"JSON schema: {len(definitions)} definitions; this server accepts "
            f"{limits.max_definitions} (grammar.max_definitions)"
        )
    refs = {name: set(_walk(value, limits)) for name, value in definitions.items()}
    root_refs = set(_walk({k: v for k, v in schema.items() if k not in ("$defs", "definitions")}, limits))
    depth = _ref_depth(root_refs, refs)
    if depth > limits.max_ref_depth:
        raise GrammarError(
            f"JSON schema: $ref chains {depth} definitions deep; this server accepts "
            f"{limits.max_ref_depth} (grammar.max_ref_depth)"
        )


def _walk(node: Any, limits: GrammarLimits) -> list[str]:
    """The local definitions `node` refers to, checking widths and property names on the way."""
    found: list[str] = []
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
            continue
        if not isinstance(item, dict):
            continue
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
        ref = item.get("$ref")
        if isinstance(ref, str) and (local := LOCAL_REF.match(ref)):
            found.append(f"{local[1]}/{local[2]}")
        stack.extend(value for key, value in item.items() if key != "$ref")
    return found


def _ref_depth(roots: set[str], refs: dict[str, set[str]]) -> int:
    """The longest chain of definitions reached from the root, iteratively (a chain may be
    thousands long); a cycle counts once (llguidance compiles recursion without unrolling it)."""
    depth: dict[str, int] = {}
    on_path: set[str] = set()
    deepest = 0
    for root in roots:
        stack: list[tuple[str, bool]] = [(root, False)]
        while stack:
            name, done = stack.pop()
            if done:
                on_path.discard(name)
                depth[name] = 1 + max((depth.get(c, 0) for c in refs.get(name, ()) if c not in on_path), default=0)
                continue
            if name in depth or name in on_path or name not in refs:
                continue
            on_path.add(name)
            stack.append((name, True))
            stack.extend((child, False) for child in refs[name] if child not in depth and child not in on_path)
        deepest = max(deepest, depth.get(root, 0))
    return deepest
