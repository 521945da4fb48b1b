"""The docs stay true: README.md's Python snippets run, and every file the README and docs/*.md name exists.

Snippets: every ```python fence of README.md runs on the CPU, in order, each in a fresh namespace. A fence
whose first line is the comment `# gpu` needs a CUDA GPU: it is only compiled here (a syntax check),
and run by the gpu-marked test where a GPU is visible. Mark a new GPU snippet the same way.

Paths: markdown link targets and `code spans` that look like repo paths (they start with one of the repo's
top-level folders, or are a top-level file) must exist; a glob (`*`) must match something. Paths in
docs/*.md may be written relative to docs/ (e.g. img/x.png).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("perfmodel", "serve", "train", "data_gen", "data", "models", "benchmarks", "docs", "tests", ".ci")
# Files linked before they exist (written on another branch); empty once merged.
PENDING: set[str] = set()
GPU_MARK = "# gpu"

_FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
_CODE = re.compile(r"`([^`\s]+)`")


def _snippets() -> list[tuple[int, str]]:
    text = (ROOT / "README.md").read_text()
    return [(text[:m.start()].count("\n") + 1, m.group(1)) for m in _FENCE.finditer(text)]


def _is_gpu(code: str) -> bool:
    return code.lstrip().splitlines()[0].strip() == GPU_MARK


def test_readme_has_snippets_of_each_kind():
    snippets = _snippets()
    assert any(not _is_gpu(c) for _, c in snippets), "no CPU snippet in README.md"
    assert any(_is_gpu(c) for _, c in snippets), "no GPU snippet in README.md"


@pytest.mark.parametrize("line,code", [s for s in _snippets() if not _is_gpu(s[1])], ids=lambda v: str(v)[:20])
def test_readme_cpu_snippet_runs(line, code, capsys):
    exec(compile(code, f"README.md:{line}", "exec"), {"__name__": "__readme__"})
    assert capsys.readouterr().out, f"README.md:{line}: the snippet printed nothing"


@pytest.mark.parametrize("line,code", [s for s in _snippets() if _is_gpu(s[1])], ids=lambda v: str(v)[:20])
def test_readme_gpu_snippet_compiles(line, code):
    compile(code, f"README.md:{line}", "exec")


@pytest.mark.gpu
@pytest.mark.parametrize("line,code", [s for s in _snippets() if _is_gpu(s[1])], ids=lambda v: str(v)[:20])
def test_readme_gpu_snippet_runs(line, code, tmp_path):
    """Run as a user runs it, from a .py file: Triton's @jit reads its kernel's source from the file (an
    exec'd string has none)."""
    import runpy

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    script = tmp_path / f"readme_{line}.py"
    script.write_text(code)
    runpy.run_path(str(script), run_name="__readme__")


def _named_paths(doc: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.S | re.M)  # code blocks: commands, not claims
    found = set()
    for target in _LINK.findall(text):
        if "://" not in target:
            found.add(target)
    for span in _CODE.findall(text):
        span = span.rstrip(".,:;")
        if span.split("/")[0] in TOP and "/" in span:
            found.add(span)
        elif "/" not in span and (ROOT / span).suffix in (".md", ".toml") and span[0].isupper():
            found.add(span)  # README.md, MODEL_CARD.md-style top-level files
    return found


def _resolve(doc: Path, name: str) -> list[Path]:
    bases = [ROOT] if doc.parent == ROOT else [doc.parent, ROOT]
    for base in bases:
        hits = sorted(base.glob(name)) if "*" in name else [base / name] if (base / name).exists() else []
        if hits:
            return hits
    return []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_named_paths_exist(doc):
    names = _named_paths(doc)
    assert names, f"{doc.name} names no file at all: is the path pattern still right?"
    missing = sorted(n for n in names if n not in PENDING and not _resolve(doc, n))
    assert not missing, f"{doc.relative_to(ROOT)} names files that do not exist: {missing}"


def test_docs_pages_name_their_commands():
    """Each docs page (not design.md, which has no figures) names a command that reproduces its numbers."""
    for doc in DOCS[1:]:
        if doc.name == "design.md":
            continue
        text = doc.read_text()
        assert re.search(r"^    (perfmodel|python) ", text, re.M), f"{doc.name} shows no command to reproduce it"
