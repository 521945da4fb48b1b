"""benchmarks/ as a shelf: at most ten product benchmarks at its top, the one-question studies in benchmarks/studies/
with an index that names each of them (and nothing else), and no script that edits sys.path -- they run as modules
of the benchmarks package (`python -m benchmarks.NAME`, benchmarks/__init__.py)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
MAX_PRODUCT = 10


def _scripts(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")


def _sys_path_edits(path: Path) -> list[int]:
    """Lines of path that call sys.path.insert/append or assign sys.path (ast: comments and docstrings aside)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            target = target.value if isinstance(target, ast.Subscript) else target
        if (isinstance(target, ast.Attribute) and target.attr == "path" and isinstance(target.value, ast.Name)
                and target.value.id == "sys"):
            lines.append(node.lineno)
    return sorted(lines)


def test_no_benchmark_edits_sys_path():
    edits = {str(p.relative_to(BENCH)): n for p in sorted(BENCH.rglob("*.py")) if (n := _sys_path_edits(p))}
    assert not edits, f"sys.path edited (run as `python -m benchmarks...` instead): {edits}"


def test_the_check_finds_an_edit(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("import sys\nsys.path.insert(0, 'a')\nsys.path[:] = []\nsys.path += ['b']\nprint(sys.path)\n")
    assert _sys_path_edits(f) == [2, 3, 4]


def test_at_most_ten_product_benchmarks():
    product = _scripts(BENCH)
    assert 0 < len(product) <= MAX_PRODUCT, product


def test_studies_index_names_every_study():
    """Each studies/*.py has its row in studies/README.md (a table row starting with its file name), and each
    row's script exists."""
    studies = set(_scripts(BENCH / "studies"))
    rows = set(re.findall(r"^\| `(\w+)\.py` \|", (BENCH / "studies" / "README.md").read_text(), re.M))
    assert studies, "no study found"
    assert not studies - rows, f"studies missing from the index: {sorted(studies - rows)}"
    assert not rows - studies, f"index rows without a script: {sorted(rows - studies)}"
