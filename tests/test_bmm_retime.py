"""benchmarks/studies/bmm_retime.py: the bmm timings' repeatability (CPU). Its rule on synthetic timings (said so), and
its committed figures recomputed from the committed rows."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_the_ceiling_rule_on_synthetic_timings():
    # synthetic: problem p has configs a (1.0 ms) and b (1.1 ms) in the first timing; the re-time makes b the
    # faster (0.9 ms against a's 1.0) and flips the aten call (aten 0.95 ms: slower than 0.9, faster than 1.0)
    from benchmarks.studies.bmm_retime import compare

    p = (64, 64, 64, "float16", False, False, False, 8)          # problems keyed as PROBLEM's fields
    q = (64, 64, 64, "float32", True, False, False, 8)
    first = ({p: {"a": 1.0, "b": 1.1}, q: {"a": 2.0, "b": 3.0}}, {p: 0.95, q: 5.0})
    second = ({p: {"a": 1.0, "b": 0.9}, q: {"a": 2.0, "b": 3.0}}, {p: 0.95, q: 5.0})
    res = compare(first, second)
    assert res["problems"] == 2 and res["configs"] == 4
    assert res["top1_first_on_second"] == pytest.approx((0.9 / 1.0) ** 0.5)      # p's pick a: 0.9 / 1.0; q's: 1
    assert res["top1_second_on_first"] == pytest.approx((1.0 / 1.1) ** 0.5)
    assert res["picks_differ"] == 0.5 and res["call_same"] == 0.5
    assert res["top1_by_mode"] == {"float16": {"problems": 1, "top1": pytest.approx(0.9)},
                                   "tf32": {"problems": 1, "top1": 1.0}}
    same = compare(first, first)
    assert same["top1_first_on_second"] == 1.0 and same["call_same"] == 1.0 and same["picks_differ"] == 0.0


@pytest.mark.parametrize("sweep,problems", [("4", 247), ("1", 300), ("1q", 300)])
def test_the_committed_figures_are_the_rows(sweep, problems):
    from benchmarks.studies.bmm_retime import SWEEPS, compare, timings

    want = json.loads((REPO / f"benchmarks/results/bmm_retime_h100_sweep{sweep}.json").read_text())
    got = compare(*(timings(p) for p in SWEEPS[sweep]))
    assert got["problems"] == want["problems"] == problems and got["configs"] == want["configs"]
    for k in ("top1_first_on_second", "top1_second_on_first", "picks_differ", "call_same"):
        assert got[k] == pytest.approx(want[k], rel=1e-9), k
