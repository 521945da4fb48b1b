"""The docs stay true: README.md's Python snippets run, and every file the README and docs/*.md name exists.

Snippets: every ```python fence of README.md runs on the CPU, in order, each in a fresh namespace. A fence
whose first line is the comment `# gpu` needs a CUDA GPU: it is only compiled here (a syntax check),
and run by the gpu-marked test where a GPU is visible. Mark a new GPU snippet the same way.

Paths: markdown link targets and `code spans` that look like repo paths (they start with one of the repo's
top-level folders, or are a top-level file) must exist; a glob (`*`) must match something. Paths in
docs/*.md may be written relative to docs/ (e.g. img/x.png).

Figures: each row of README.md's results table is matched to a function of RESULTS (below) that
recomputes its **bold** figures from the committed source (a model's metadata.json, a
benchmarks/results/*.json); every bold figure must be that value rounded as printed. A row without a
function fails: add one when adding a row.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Callable

import pytest

from tests._scripts import benchmark_script

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "studies" / "README.md"]
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


_MODULE = re.compile(r"python -m\s+(benchmarks(?:\.[a-z_]\w*)+)(?!\.?\w)")  # NAME: a placeholder


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_named_benchmark_modules_exist(doc):
    """A `python -m benchmarks.NAME` (or benchmarks.studies.NAME) command in a page names a module of the
    benchmarks package (benchmarks/NAME.py), code blocks included: those are the commands to rerun."""
    missing = sorted(m for m in set(_MODULE.findall(doc.read_text()))
                     if not (ROOT / (m.replace(".", "/") + ".py")).is_file())
    assert not missing, f"{doc.relative_to(ROOT)} runs benchmark modules that do not exist: {missing}"


def test_docs_pages_name_their_commands():
    """Each docs page (not design.md, which has no figures) names a command that reproduces its numbers."""
    for doc in DOCS[1:]:
        if doc.name == "design.md":
            continue
        text = doc.read_text()
        assert re.search(r"^    (perfmodel|python) ", text, re.M), f"{doc.name} shows no command to reproduce it"


# ---------------------------------------------------------------- README's results table

def _json(path: str) -> dict:
    return json.loads((ROOT / path).read_text())


def _meta(model: str) -> dict:
    return _json(f"models/{model}/metadata.json")


# "fp16 / bf16 / fp32" in the README: fp32 is both fp32 modes (ieee and tf32), as `perfmodel eval` reports it
MODES = ("float16", "bfloat16", "fp32_all")


def _inductor_bench(path: str) -> dict[str, float]:
    """benchmarks/inductor_bench.py's result: the hook's (perfmodel-pad) GEMM tuning and whole compile
    summed over the shapes, and the kernel speed, stock kernel ms / the hook's per shape: geomean, worst."""
    runs = {v["variant"]: {s["name"]: s for s in v["shapes"]} for v in _json(path)["variants"]}
    stock, ours = runs["stock"], runs["perfmodel-pad"]
    speed = [stock[n]["kernel_ms"] / ours[n]["kernel_ms"] for n in stock]
    return {"gemm_tuning_s": sum(s["gemm_tuning_s"] for s in ours.values()),
            "compile_s": sum(s["compile_s"] for s in ours.values()),
            "speed_geomean": math.exp(sum(map(math.log, speed)) / len(speed)), "speed_worst": min(speed)}


INDUCTOR_H100, INDUCTOR_H200 = ("benchmarks/results/inductor_bench_h100_unseen_v8.json",
                                "benchmarks/results/inductor_bench_h200_unseen_v5.json")


def _serve_latency() -> list[float]:
    """p50 ms of the onnx backend (the default): rank one problem / 100; predict one / 100
    (benchmarks/studies/one_answer_latency.py: every config scored, beside the paths served before)."""
    res = _json("benchmarks/results/one_answer_latency_cpu2.json")
    one, many = res["one"], res["many"]
    return [one["rank, 1 problem, 368 configs"]["new_p50_ms"], many["rank_many, 100 problems, 368 configs"]["new_p50_ms"],
            one["predict, 1 problem, 368 configs"]["new_p50_ms"], many["predict_many, 100 problems, 368 configs"]["new_p50_ms"]]


def _family() -> dict[str, float]:
    """The family-held-out ranking figures: `perfmodel eval --model build/h100-family --json` of the build of
    recipes/h100-family.toml (the shipped recipe, split by family), committed with its split named."""
    res = _json("benchmarks/results/family_eval_h100.json")
    assert res["split"]["kind"] == "family" and res["split"]["model_split"] == "family"
    assert not res["split"]["contaminated"]
    return res["results"]["perfmodel"]


def _h200() -> list[float]:
    m = _meta("h200")["metrics_by_device"]["h200"]
    return [m["results"][f"{d}/top1_eff"] for d in MODES] + [m["pad"]["pad/total_vs_oracle"]]


def _whole_models(device: str = "h100") -> list[float]:
    """benchmarks/model_bench.py's headline for perfmodel.serve.compile on the device: step ratio geomean, worst;
    compile ratio geomean, worst (the script's own ratios(): ratios measured side by side in one process)."""
    mb = benchmark_script("model_bench")
    return list(mb.headline(_json(f"benchmarks/results/model_bench_{device}.json"), "perfmodel"))


# Row key (a row's first cell, or the name of the <!-- marker --> it starts with) -> its bold figures,
# recomputed, in the order printed. A key matches the rows whose key starts with it.
RESULTS: dict[str, Callable[[], list[float]]] = {
    "whole-models": _whole_models,
    "h200-whole-models": lambda: _whole_models("h200"),
    "config ranking, top-1 efficiency": lambda: [_family()[f"{d}/top1_eff"] for d in MODES],
    "config ranking, top-5 efficiency": lambda: [_family()[f"{d}/top5_eff"] for d in MODES],
    "pad decisions, total time / the oracle's": lambda: [_meta("h100")["pad_metrics"]["pad/total_vs_oracle"]],
    "cuBLAS or Triton": lambda: [r["hybrid"]["call_right"] for r in _json("benchmarks/results/cublas_call_rules.json")
                                 if r["model"] == "models/h100" and r["split"] == "test"],
    "H200 (`models/h200`": _h200,
    "config ranking for the kernel as Inductor compiles it":
        lambda: [_meta("h100")["static_metrics"][f"test_static/static_head/{d}/top1_eff"] for d in MODES],
    "the same on an H200 (`models/h200`'s inductor head)":
        lambda: [_meta("h200")["inductor_metrics"]["devices"]["h200"][f"test_static/static_head/all/top{k}_eff"]
                 for k in (1, 5)],
    "ranking Triton's tutorial matmul":
        lambda: [_meta("h200")["tutorial_metrics"]["devices"]["h200"][f"test_static/static_head/all/top{k}_eff"]
                 for k in (1, 5)],
    "torch.compile max-autotune": lambda: [v for path in (INDUCTOR_H100, INDUCTOR_H200)
                                           for v in (_inductor_bench(path)["gemm_tuning_s"],
                                                     _inductor_bench(path)["compile_s"])],
    "the same: kernel speed": lambda: [v for path in (INDUCTOR_H100, INDUCTOR_H200)
                                       for v in (_inductor_bench(path)["speed_geomean"],
                                                 _inductor_bench(path)["speed_worst"])],
    "Triton `@autotune`": lambda: [sum(s["autotune_s"] for s in v["shapes"])
                                   for v in _json("benchmarks/results/triton_hook_bench_h100_v9.json")["variants"]
                                   if v["variant"] == "pruned"],
    "serve-latency": _serve_latency,
    "batched GEMMs": lambda: [_meta("h100")["bmm_metrics"][k] for k in ("cv/all/top1_eff", "cv/all/top5_eff",
                                                                         "cv/call/accuracy")],
}


def _results_rows() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = re.split(r"^## Results.*$", text, maxsplit=1, flags=re.M)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert len(rows) > 2 and set(rows[1].replace("|", "")) <= {"-", ":", " "}, "README's results table moved"
    return rows[2:]  # after the header and its separator


def _row_key(row: str) -> str:
    first = row.split("|")[1]
    marker = re.match(r"\s*<!--\s*([\w-]+)\s*-->", first)
    return marker.group(1) if marker else first.strip()


def test_results_table_is_found():
    assert len(_results_rows()) >= len(RESULTS) - 1


@pytest.mark.parametrize("row", _results_rows(), ids=lambda r: _row_key(r)[:32])
def test_results_row_figures_are_the_sources(row):
    key = _row_key(row)
    keys = [k for k in RESULTS if key.startswith(k)]
    assert len(keys) == 1, (f"README results row {key!r} has {'no' if not keys else 'more than one'} recompute "
                            "function: add one to RESULTS in tests/test_docs.py (its source file and how its bold "
                            "figures come out of it)")
    printed = [n for bold in re.findall(r"\*\*(.+?)\*\*", row) for n in re.findall(r"\d+(?:\.\d+)?", bold)]
    values = RESULTS[keys[0]]()
    assert len(printed) == len(values), f"{key!r}: {len(printed)} bold figures, {len(values)} recomputed"
    wrong = []
    for text, value in zip(printed, values):
        decimals = len(text.split(".")[1]) if "." in text else 0
        if f"{value:.{decimals}f}" != text:
            wrong.append(f"README says {text}, the source {value:.{decimals + 3}f}")
    assert not wrong, f"{key!r}: " + "; ".join(wrong)


def test_every_results_function_has_its_row():
    keys = [_row_key(r) for r in _results_rows()]
    stale = [k for k in RESULTS if not any(key.startswith(k) for key in keys)]
    assert not stale, f"RESULTS in tests/test_docs.py has functions for rows README.md no longer has: {stale}"
