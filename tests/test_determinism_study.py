"""benchmarks/studies/determinism.py's CPU side: the report over SYNTHETIC process records and the kernel names read
from output code (the GPU compiles are not run here)."""
from __future__ import annotations

from benchmarks.studies import determinism as det


def _rec(proc, table, kernels=("triton_poi_fused_0", "extern_kernels.mm")):
    return {"proc": proc, "decisions": [{"op": "mm", "triton": False}], "lookup_table": table,
            "kernels": sorted(kernels)}


def test_report_counts_distinct_sets():
    t = {"k": [{"template_id": "aten::mm"}]}
    same = det.report([_rec(i, t) for i in range(3)])
    assert same["deterministic"] and same["lookup_table"]["distinct"] == 1 and same["procs"] == 3
    other = {"k": [{"template_id": "triton::mm", "BLOCK_M": 64}]}
    rep = det.report([_rec(0, t), _rec(1, other), _rec(2, t), {"proc": 3, "error": "exit 1: boom"}])
    assert not rep["deterministic"]
    assert rep["lookup_table"]["distinct"] == 2 and sorted(rep["lookup_table"]["groups"].values()) == [[0, 2], [1]]
    assert rep["decisions"]["distinct"] == 1 and rep["errors"] == ["exit 1: boom"]
    assert not det.report([_rec(0, t), {"proc": 1, "error": "x"}])["deterministic"]  # an error is not a pass


def test_kernel_names_from_output_code(tmp_path):
    (tmp_path / "ab").mkdir()
    (tmp_path / "ab" / "cab.py").write_text(
        "triton_poi_fused_add_0 = async_compile.triton('triton_poi_fused_add_0', '''\n"
        "def triton_poi_fused_add_0(in_ptr0, xnumel):\n    pass\n''')\n"
        "buf0 = extern_kernels.mm(arg0, arg1)\nextern_kernels.bmm(a, b)\n")
    (tmp_path / "other.py").write_text("def triton_not_output_code(): pass\n")
    assert det.kernel_names(tmp_path) == ["extern_kernels.bmm", "extern_kernels.mm", "triton_poi_fused_add_0"]
