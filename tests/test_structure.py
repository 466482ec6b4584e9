"""The house stays readable: rooms of at most a dozen modules, modules of at most 400 lines, functions of at
most 80 lines, and no import circle anywhere in the package (function-level imports count: grimp sees them,
as import-linter does). The layer contracts themselves are `lint-imports` in `make test` (pyproject.toml).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "isocompute"
MAX_MODULES, MAX_MODULE_LINES, MAX_FUNCTION_LINES = 12, 400, 80


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_room_holds_more_than_a_dozen_modules():
    rooms: dict[Path, list[str]] = {}
    for p in modules():
        if p.name != "__init__.py":
            rooms.setdefault(p.parent, []).append(p.name)
    crowded = {str(d.relative_to(PACKAGE.parent)): len(m) for d, m in rooms.items() if len(m) > MAX_MODULES}
    assert not crowded, f"rooms with more than {MAX_MODULES} modules (make a subpackage by concept): {crowded}"


def test_no_module_is_longer_than_400_lines():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in modules()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split by concept): {long}"


def long_functions(source: str, name: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_FUNCTION_LINES:
                out.append(f"{name}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_no_function_is_longer_than_80_lines():
    long = [f for p in modules() for f in long_functions(p.read_text(encoding="utf-8"), str(p.relative_to(PACKAGE.parent)))]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (extract helpers): {long}"


def test_the_function_length_check_counts_decorators_out_and_bodies_in():
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    assert long_functions(f"def f():\n{body}\n", "m") == ["m:1 f (81 lines)"]
    assert long_functions(f"def f():\n{body[: body.rindex(chr(10))]}\n", "m") == []


def import_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_a_three_module_circle_and_nothing_in_a_chain():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circle():
    grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter (the dev extra)")
    graph = grimp.build_graph("isocompute")
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    cycles = import_cycles(edges)
    assert not cycles, f"import circles (move the shared part into a module both import): {cycles}"
