"""A tick waits for the device once per phase: the round loops, drafters and rules read arrays on
the host only after a served `Evaluate` (app/execution/steps.py), which evaluates every waiting
row's arrays in one `mx.eval`. A `.item()`, `.tolist()` or `mx.eval` anywhere else in those
packages would wait once per row (the sampled rows' cost the tick issue measured on the GPU).

Read from the source: within a function, a host read must come after a `yield Evaluate(...)` of
that function (the generator step reads what the tick evaluated), or be one of the load-time
waits below, each with its reason. `mx.async_eval` is allowed anywhere: it waits for nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

from app.loading.paths import REPO_ROOT

PACKAGES = ("app/decoding", "app/drafters", "app/acceptance")
HOST_READS = {"item", "tolist"}
# (file, function): why it may wait outside a tick
AT_LOAD = {
    ("app/decoding/exactness.py", "probe_width"): "the startup probe of a block drafter's exact width, before serving",
    ("app/drafters/block.py", "load_block_drafter"): "a drafter's weights, evaluated once as it loads",
}


def host_reads() -> list[tuple[str, str, int, bool]]:
    """(file, function, line, after an Evaluate) of every host read in PACKAGES."""
    found = []
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            name = str(path.relative_to(REPO_ROOT))
            for function in ast.walk(ast.parse(path.read_text())):
                if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                served = [node.lineno for node in ast.walk(function) if _yields_evaluate(node)]
                for node in ast.walk(function):
                    if _reads_host(node):
                        found.append((name, function.name, node.lineno, any(line < node.lineno for line in served)))
    return found


def _yields_evaluate(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Yield)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "Evaluate"
    )


def _reads_host(node: ast.AST) -> bool:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    if node.func.attr in HOST_READS:
        return True
    return node.func.attr == "eval" and isinstance(node.func.value, ast.Name) and node.func.value.id == "mx"


def test_host_reads_in_the_round_loops_drafters_and_rules_follow_an_evaluate() -> None:
    reads = host_reads()
    assert len(reads) >= 8  # the scan finds the reads it is meant to judge
    stray = [f"{file}:{line} in {function}" for file, function, line, served in reads
             if not served and (file, function) not in AT_LOAD]  # fmt: skip
    assert stray == [], "host reads outside the tick's Evaluate (a wait per row):\n" + "\n".join(stray)


def test_the_scan_catches_a_read_before_the_evaluate(tmp_path: Path) -> None:
    """It can fail: a read placed before the step's Evaluate is not taken as served."""
    source = "def step(x):\n    x.tolist()\n    yield Evaluate((x,))\n    return x.item()\n"
    function = ast.parse(source).body[0]
    served = [node.lineno for node in ast.walk(function) if _yields_evaluate(node)]
    reads = [node.lineno for node in ast.walk(function) if _reads_host(node)]
    assert [any(line < read for line in served) for read in sorted(reads)] == [False, True]
