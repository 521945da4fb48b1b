"""benchmarks/device_probe.py without a GPU: its --self-test feeds MADE-UP live numbers (said so in the
result: self_test true) through the same comparison and report as a GPU run; and the H200 spec against
the committed probe of a real H200."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from perfmodel.devices import get_spec, match_spec

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def probe():
    from benchmarks import device_probe

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


def test_h200_spec_agrees_with_the_committed_probe(probe):
    """The h200 spec, as the code has it now, against what device_probe measured on an H200
    (benchmarks/results/device_probe_h200.json, a GPU run): compare() on the recorded live figures finds
    every reported property equal and every measured rate under the spec's peak, and the card's name and
    SM count match the spec."""
    res = json.loads((ROOT / "benchmarks" / "results" / "device_probe_h200.json").read_text())
    assert res["self_test"] is False
    spec = get_spec("h200")
    rows = probe.compare(spec, res["live"], res["bandwidth"], res["gemms"])
    assert len(rows) == 4 + 1 + len(res["gemms"]) and all(r["ok"] is True for r in rows), rows
    assert match_spec(res["live"]["device_name"], res["live"]["sm_count"]) is spec
    # a spec that claimed less DRAM bandwidth than the card copies at would be refused
    slow = probe.compare(dataclasses.replace(spec, dram_bw_gbs=res["bandwidth"]["gbs_best"] * 0.99), res["live"],
                         res["bandwidth"], res["gemms"])
    assert [r["figure"] for r in slow if not r["ok"]] == ["dram_bw_gbs (copy, read + write)"]
