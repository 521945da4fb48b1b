"""benchmarks/replay_decisions.py: replaying the whole-model benchmark's recorded decisions under a candidate
model folder. SYNTHETIC models (random weights, tests/_synthetic.py) and decisions recorded from the first
of them: the tool must find nothing against the folder that made them and the differences against another."""
from __future__ import annotations

import json

import pytest

from perfmodel import GemmProblem
from tests._scripts import benchmark_script
from tests._synthetic import write_synthetic_model


@pytest.fixture(scope="module")
def rd():
    return benchmark_script("replay_decisions")


def _problem(p: GemmProblem) -> dict:
    return {"m": p.m, "n": p.n, "k": p.k, "dtype": p.dtype, "allow_tf32": p.allow_tf32,
            "transpose_left": p.transpose_left, "transpose_right": p.transpose_right, "batch": p.batch}


def test_replay_against_the_measured_folder_and_another(rd, tmp_path, capsys):
    from perfmodel.serve.compile import Policy

    a, b = write_synthetic_model(tmp_path / "a", seed=0), write_synthetic_model(tmp_path / "b", seed=1)
    measured = rd._load(str(a))
    probs = [GemmProblem(m=m, n=n, k=k, dtype=d) for m, n, k, d in
             ((16, 4096, 4096, "float16"), (2048, 3072, 768, "float16"), (4096, 1024, 4096, "bfloat16"),
              (64, 14336, 4096, "bfloat16"), (8192, 8192, 512, "float16"))]
    decisions = []
    for p in probs:
        keep, cfgs, sure = rd.replay(measured, "mm", _problem(p), Policy())
        assert sure is False  # the sure rule is a bmm's alone
        decisions.append({"op": "mm", "problem": _problem(p), "triton": keep, "configs": cfgs,
                          "cublas_ms": None, "triton_ms": None})
    results = tmp_path / "r.json"
    results.write_text(json.dumps({"workloads": {"w": {"variants": {"perfmodel@s1": {"decisions": decisions},
                                                                    "default@s1": {}}}}}))
    assert rd.main(["--measured", str(a), "--candidate", str(a), "--results", str(results),
                    "--pad", "4095,768,1000,float16"]) == 0
    out = capsys.readouterr().out
    assert "5 recorded GEMM problems; the measured folder's replay reproduces 5" in out
    assert "decides 0 of them differently" in out and "(differs)" not in out
    differs = rd.main(["--measured", str(a), "--candidate", str(b), "--results", str(results)])
    out = capsys.readouterr().out
    n = out.count("differs: w: mm")
    assert f"decides {n} of them differently" in out and differs == (1 if n else 0)
    assert n > 0  # two random models rank these five problems' configs differently somewhere
    with pytest.raises(SystemExit):
        rd.main(["--measured", str(a), "--candidate", str(b), "--results", str(tmp_path / "none.json")])
    assert "--results" in capsys.readouterr().err
