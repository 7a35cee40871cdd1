"""The quick loop (`pytest -m "not slow"`) stays quick: a test that starts a server of its own or
runs a statistical check carries `@pytest.mark.slow` (or its module's `pytestmark` does).

Read from the source, not run: a test is heavy when it, a module function it calls or a module
fixture it takes uses one of HEAVY. The session servers (`default_server`, `target_only_server`)
are shared and cheap per test; a refused `mlxcel serve` (exit 2, no model loaded) is a CLI test.
"""

from __future__ import annotations

import ast

from tests.support import ROOT

HEAVY = {
    "serve": "starts its own server",
    "profile_server": "starts a server for a profile other than the session's two",
    "keyed_server": "starts a server behind an API key",
    "Server": "runs a uvicorn server in process",
    "chi_square": "a statistical test",
    "sample_count": "a statistical test",
}


def used_names(node: ast.AST) -> set[str]:
    """Names, attributes and parameters a function refers to; `app serve` argv lists count as serve."""
    names: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            names.add(child.id)
        elif isinstance(child, ast.Attribute):
            names.add(child.attr)
        elif isinstance(child, ast.arg):
            names.add(child.arg)
        elif isinstance(child, ast.List | ast.Tuple):
            words = {e.value for e in child.elts if isinstance(e, ast.Constant)}
            if {"app", "serve"} <= words:
                names.add("serve")
    return names


def is_slow(decorators: list[ast.expr]) -> bool:
    return any("slow" in used_names(d) and "mark" in used_names(d) for d in decorators)


def unmarked_heavy_tests(source: str) -> list[str]:
    tree = ast.parse(source)
    module_slow = any(
        isinstance(n, ast.Assign)
        and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
        and is_slow([n.value])
        for n in tree.body
    )
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    uses = {name: used_names(f) - {name} for name, f in functions.items()}
    heavy = {name for name, names in uses.items() if names & HEAVY.keys()}
    while grown := {name for name, names in uses.items() if names & heavy} - heavy:
        heavy |= grown
    return [
        name
        for name in sorted(heavy)
        if name.startswith("test_") and not module_slow and not is_slow(functions[name].decorator_list)
    ]


def test_tests_that_start_servers_or_run_statistics_are_marked_slow() -> None:
    unmarked = [
        f"{path.relative_to(ROOT)}::{test}"
        for path in sorted((ROOT / "tests").rglob("test_*.py"))
        for test in unmarked_heavy_tests(path.read_text())
    ]
    assert unmarked == [], "mark these @pytest.mark.slow (see docs/architecture.md, Testing):\n" + "\n".join(unmarked)


def test_the_check_sees_servers_fixtures_and_statistics() -> None:
    source = (
        "import pytest\n"
        "@pytest.fixture\ndef own(tmp_path):\n    with serve(tmp_path) as s:\n        yield s\n"
        "def test_a(own): ...\n"
        "def helper(): return chi_square([], [], [])\n"
        "def test_b(): helper()\n"
        "def test_c(): subprocess.run([sys.executable, '-m', 'app', 'serve'])\n"
        "@pytest.mark.slow\ndef test_d(own): ...\n"
        "def test_e(default_server): ...\n"
    )
    assert unmarked_heavy_tests(source) == ["test_a", "test_b", "test_c"]
    assert unmarked_heavy_tests("import pytest\npytestmark = pytest.mark.slow\n" + source) == []
