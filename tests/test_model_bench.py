"""benchmarks/model_bench.py's CPU side: which workloads a --workloads value names, and the ratios it reports
from rows (SYNTHETIC timings written in the tests; the GPU runs are not tested here)."""
from __future__ import annotations

import json

import pytest

from tests._scripts import benchmark_script


def _model_bench():
    return benchmark_script("model_bench")


def test_workload_prefixes_with_and_without_commas():
    mb = _model_bench()
    names = lambda spec: [w.name for w in mb.select_workloads(spec)]  # noqa: E731
    # "," separates prefixes; "Llama" names both Llama workloads, in WORKLOADS' order
    assert names("T5,BERT") == ["BERT-large (4 layers), fp16, 16x384", "T5-base, bf16, 8x512 -> 128"]
    assert len(names("Llama")) == 2
    # a prefix that holds a comma: ";" separates, so prefill and decode can be named apart
    assert names("Llama-3-8B widths (2 layers), bf16, decode;Swin") == [
        "Llama-3-8B widths (2 layers), bf16, decode 8x1", "Swin-T, fp16, batch 32"]
    assert names("no such model") == []


def _row(step: float, compile_s: float, run: str) -> dict:
    return {"step_ms": step, "compile_s": compile_s, "run": run}


def test_ratios_pair_rows_of_one_run_and_one_tag():
    """SYNTHETIC rows: each perfmodel row is set against default mode of its own run (and, where two processes
    shared one run label, of its own tag); stock's ratio to default mode of its run caps the baseline."""
    mb = _model_bench()
    vs = {"max-autotune": _row(1.8, 100.0, "a"), "default": _row(2.0, 10.0, "a"),
          "default@x": _row(2.0, 5.0, "b"), "perfmodel@x": _row(1.6, 10.0, "b"),
          "perfmodel@y": _row(1.0, 4.0, "b"), "default@y": _row(1.1, 4.0, "b")}
    res = {"workloads": {"GPT-2 124M, fp16, 8x512": {"variants": vs}}}
    step, comp = mb.ratios(res)["perfmodel"]["GPT-2 124M, fp16, 8x512"]
    # perfmodel@x against default@x (2.0 / 1.6, 10 / 5), perfmodel@y against default@y (1.1 / 1.0, 4 / 4),
    # over stock's 2.0 / 1.8 of default mode in its run
    assert step == pytest.approx((2.0 / 1.6 * 1.1 / 1.0) ** 0.5 / (2.0 / 1.8), rel=1e-9)
    assert comp == pytest.approx((10.0 / 5.0 * 4.0 / 4.0) ** 0.5, rel=1e-9)
    assert mb.headline(res) == (step, step, comp, comp)


# ---------------------------------------------------------------------------------------------- decisions as an artifact
def test_table_variant_options_are_the_setups():
    """The "table" variant compiles with a literal copy of the set-up's options (no perfmodel import there)."""
    from perfmodel.serve.compile import OPTIONS

    assert _model_bench().SETUP_OPTIONS == OPTIONS


def test_table_variant_static_only_and_missing_table_named(tmp_path):
    kinds = {w.kind: w for w in _model_bench().WORKLOADS}
    assert "table" in _model_bench().variants_for(kinds["static"], ["default", "table"])
    assert _model_bench().variants_for(kinds["dynamic"], ["default", "table"]) == ["default"]
    assert _model_bench().variants_for(kinds["moe"], ["default", "table"]) == ["default"]
    with pytest.raises(FileNotFoundError, match="--tables: no table for 'GPT-2 124M, fp16, 8x512'"):
        _model_bench().load_table(tmp_path, "GPT-2 124M, fp16, 8x512")
    assert _model_bench().slug("Llama-3-8B widths (2 layers), bf16, decode 8x1") == "llama-3-8b-widths-2-layers-bf16-decode-8x1"


def test_committed_plan_tables():
    """The four workloads' CPU plans are committed, their keys on the H200's device name, entries without template
    hash (torch versions differ between the CPU and the GPU)."""
    names = ["GPT-2 124M, fp16, 8x512", "BERT-large (4 layers), fp16, 16x384",
             "Llama-3-8B widths (2 layers), bf16, decode 8x1", "Qwen2-7B widths (2 layers), bf16, 4x512"]
    for name in names:
        table = _model_bench().load_table(_model_bench().TABLES, name)
        assert table and all(k.startswith("NVIDIA H200+") for k in table), name
        assert all("template_hash" not in e and "template_id" in e for v in table.values() for e in v), name


def test_compare_tables_against_recorded_rows(tmp_path, capsys):
    """SYNTHETIC results: a perfmodel-det row's recorded table against the plan's file -- a key only in the plan,
    one only in the compile, one whose entry differs, one equal up to template_hash."""
    name = "GPT-2 124M, fp16, 8x512"
    plan = {"a": [{"template_id": "aten::mm"}], "b": [{"template_id": "triton::mm", "BLOCK_M": 64}],
            "c": [{"template_id": "aten::bmm"}], "e": [{"template_id": "aten::mm"}]}
    (tmp_path / f"{_model_bench().slug(name)}.json").write_text(json.dumps(plan))
    recorded = {"a": [{"template_id": "aten::mm"}],
                "b": [{"template_id": "triton::mm", "BLOCK_M": 64, "template_hash": "h"}],
                "c": [{"template_id": "triton::bmm", "BLOCK_M": 32}], "d": [{"template_id": "aten::addmm"}]}
    results = {"workloads": {name: {"variants": {"perfmodel-det": {"lookup_table": recorded}}},
                             "BERT-large (4 layers), fp16, 16x384": {"variants": {}}}}
    out = _model_bench().compare_tables(results, tmp_path)
    assert list(out) == [name]
    c = out[name]
    assert (c["both"], c["only_plan"], c["only_compile"], list(c["differ"]), c["equal"]) == (3, ["e"], ["d"], ["c"],
                                                                                              False)
    assert "only in the plan: e" in capsys.readouterr().out


def test_model_bench_imports_no_perfmodel():
    """The worker's module imports neither perfmodel nor serve (the "table" variant runs before either)."""
    import subprocess
    import sys
    from pathlib import Path

    code = "import sys, benchmarks.model_bench; print(any(m in sys.modules for m in ('perfmodel', 'serve')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "False"
