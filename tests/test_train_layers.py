"""train/ in layers (CPU, no execution: the source's ast): no import cycle among its modules, no function over
80 lines, and the model folder's writer (train/folder.py) importing nothing from train/."""
from __future__ import annotations

import ast
from pathlib import Path

TRAIN = Path(__file__).resolve().parent.parent / "train"
MAX_LINES = 80


def _train_imports(path: Path) -> set[str]:
    """The train/ modules one file imports (relative `from . import x`, `from .x import y`, and absolute
    perfmodel.train.x / train.x), wherever the statement is (function-level imports count)."""
    names = {p.stem for p in TRAIN.glob("*.py")}
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level == 1:
                parts = [mod.split(".")[0]] if mod else [a.name for a in node.names]
            elif mod.startswith(("perfmodel.train.", "train.")):
                parts = [mod.split(".")[2 if mod.startswith("perfmodel.") else 1]]
            elif mod in ("perfmodel.train", "train"):
                parts = [a.name for a in node.names]
            else:
                parts = []
            out |= {p for p in parts if p in names}
        elif isinstance(node, ast.Import):
            for a in node.names:
                for prefix in ("perfmodel.train.", "train."):
                    if a.name.startswith(prefix) and a.name[len(prefix):].split(".")[0] in names:
                        out.add(a.name[len(prefix):].split(".")[0])
    return out - {path.stem}


def import_graph() -> dict[str, set[str]]:
    return {p.stem: _train_imports(p) for p in sorted(TRAIN.glob("*.py"))}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of graph (its modules in order), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        state[n] = 2
        path.pop()
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_graph_is_read_from_the_source():
    g = import_graph()
    # known edges: a parser that found none would pass the cycle test without looking
    assert "folder" in g["pipeline"] and "metrics" in g["evaluate"] and "loop" in g["static_head"]
    assert "recipe" in g["cli"]  # a function-level import counts


def test_no_import_cycle_in_train():
    assert _cycle(import_graph()) is None, f"import cycle: {' -> '.join(_cycle(import_graph()))}"


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_folder_writer_imports_nothing_from_train():
    assert import_graph()["folder"] == set()
    assert import_graph()["metrics"] <= {"data"}  # the pure metric functions: numbers in, numbers out


def test_no_function_over_80_lines_in_train():
    long = []
    for path in sorted(TRAIN.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_LINES:
                    long.append(f"{path.name}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "functions over 80 lines: " + ", ".join(long)
