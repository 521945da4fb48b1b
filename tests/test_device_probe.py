"""benchmarks/device_probe.py without a GPU: its --self-test feeds MADE-UP live numbers (said so in the
result: self_test true) through the same comparison and report as a GPU run; and the H200 spec's relation
to the H100 SXM's, as the issue and the public datasheets give it."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from perfmodel.devices import get_spec, match_spec

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def probe():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import device_probe
    finally:
        sys.path.pop(0)
    return device_probe


def test_self_test_report(probe, tmp_path):
    out = tmp_path / "probe.json"
    assert probe.main(["--self-test", "--spec", "h200", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["self_test"] is True and res["spec"]["name"] == "h200"
    ok = {r["figure"]: r["ok"] for r in res["comparison"]}
    # the made-up card reports the spec's SMs, L2 and shared memory, another max clock
    assert ok["sm_count"] and ok["l2_bytes"] and ok["shared_memory_per_block_optin"]
    assert ok["max_sm_clock_mhz"] is False
    # 0.9 of the DRAM spec is plausible; a GEMM above the peak at its measured clock is not
    bw = next(r for r in res["comparison"] if r["figure"].startswith("dram_bw_gbs"))
    assert bw["ok"] and bw["fraction_of_spec"] == pytest.approx(0.9)
    gemm = next(r for r in res["comparison"] if "GEMM" in r["figure"])
    assert gemm["ok"] is False and gemm["at_sm_clock_mhz"] == 1500.0
    assert gemm["spec"] == pytest.approx(get_spec("h200").peak_flops("bfloat16", sm_clock_mhz=1500.0) / 1e12)
    md = out.with_suffix(".md").read_text()
    assert "| max_sm_clock_mhz | 1980 | 1755 |  | **no** |" in md


def test_unknown_figure_is_not_reported_as_agreeing(probe):
    spec = get_spec("h200")
    rows = probe.compare(spec, {"sm_count": 132}, None, [])
    assert {r["figure"]: r["ok"] for r in rows} == {"sm_count": True, "max_sm_clock_mhz": None, "l2_bytes": None,
                                                   "shared_memory_per_block_optin": None}


def test_h200_spec_against_h100_sxm():
    """The H200 is the H100 SXM's chip (132 SMs, the same clock, arithmetic and shared memory) with 4.8 TB/s
    HBM3e (1.43x) and the 60 MB of L2 that torch reports for it (the H100 SXM: 50 MB)."""
    h100, h200 = get_spec("h100-sxm"), get_spec("h200")
    for f in ("sm_count", "max_sm_clock_mhz", "flop_per_sm_clk", "shared_memory_per_block_optin",
              "registers_per_thread_max"):
        assert getattr(h100, f) == getattr(h200, f), f
    assert h200.dram_bw_gbs / h100.dram_bw_gbs == pytest.approx(4800 / 3350)
    assert (h100.l2_bytes, h200.l2_bytes) == (50 * 2**20, 60 * 2**20)
    assert match_spec("NVIDIA H200", 132) is h200
