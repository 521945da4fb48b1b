"""The commands that read data or models, as on the README's plain `pip install -e .`: no GPU stack
(triton), no training extra (lightning, mlflow), no bench extra (pandas, matplotlib).

Every command runs in one subprocess where those modules cannot be imported (each is None in
sys.modules before perfmodel loads: `import triton` raises ModuleNotFoundError and
importlib.util.find_spec("triton") is None, as where the package is not installed). `perfmodel eval`
runs on a SYNTHETIC dataset (tests/_synthetic.py, a few seconds) rather than data/h100 (about 15 s):
what is checked is that it runs and reports, not its figures."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BLOCKED = ("triton", "lightning", "pytorch_lightning", "lightning_fabric", "mlflow", "sqlalchemy", "alembic",
           "pandas", "matplotlib")

CHILD = textwrap.dedent("""
    import contextlib, importlib, io, json, sys
    blocked, commands = json.loads(sys.argv[1])
    for name in blocked:
        sys.modules[name] = None
    def importable(name):
        try:
            importlib.import_module(name)
        except ImportError:
            return False
        return True
    from perfmodel.cli import main
    runs = []
    for argv in commands:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except BaseException as exc:  # an ImportError's traceback, argparse's SystemExit
                rc = repr(exc)
        runs.append({"rc": rc, "out": out.getvalue(), "err": err.getvalue()})
    loaded = sorted(n for n, m in sys.modules.items() if m is not None and n.split(".")[0] in blocked)
    print("RESULTS" + json.dumps({"runs": runs, "loaded": loaded, "importable": [n for n in blocked if importable(n)]}))
""")

PROBLEM = ["--m", "4096", "--n", "4096", "--k", "4096", "--dtype", "float16", "--transpose-right"]


@pytest.fixture(scope="module")
def plain(repo_root: Path, tmp_path_factory) -> dict:
    """{name: {"rc", "out", "err"}} of each command, and the child's "loaded" / "importable" lists."""
    sys.path.insert(0, str(repo_root))
    try:
        from tests._synthetic import write_synthetic_dataset
    finally:
        sys.path.pop(0)
    synthetic = write_synthetic_dataset(tmp_path_factory.mktemp("plain") / "h100", n_problems=40)
    commands = {
        "data info": ["data", "info", "--json", str(repo_root / "data" / "h100")],
        "rank": ["rank", *PROBLEM, "--top-k", "5", "--json"],
        "rank inductor": ["rank", *PROBLEM, "--top-k", "5", "--kernel", "inductor", "--json"],
        "pad": ["pad", "--m", "4095", "--k", "4097", "--n", "1000", "--dtype", "bfloat16", "--json"],
        "eval": ["eval", "--data", str(synthetic), "--json"],
        "eval --log-mlflow": ["eval", "--data", str(synthetic), "--log-mlflow"],
        "build": ["build", "--recipe", str(repo_root / "recipes" / "ci-small.toml")],
    }
    env = {**os.environ, "PYTHONPATH": str(repo_root), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps([BLOCKED, list(commands.values())])], env=env,
                          cwd=repo_root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULTS"))
    res = json.loads(line[len("RESULTS"):])
    return {**dict(zip(commands, res["runs"])), "loaded": res["loaded"], "importable": res["importable"]}


def _ok(run: dict) -> dict:
    assert run["rc"] == 0, run["err"][-3000:]
    return json.loads(run["out"])


def test_the_gpu_and_training_stack_is_really_absent(plain):
    # the blocking works (else every other test here would pass vacuously) and no command brought them in
    assert plain["importable"] == [] and plain["loaded"] == []


def test_data_info(plain):
    info = _ok(plain["data info"])
    assert info["device_spec"] == "h100-sxm"
    assert info["gemm_rows"] > 100_000 and info["gemm_problems"] > 1000
    # the kinds whose names came from the kernel and cuBLAS sweep modules before
    assert info["gemm_static_rows"] > 0 and info["gemm_static_problems"] > 0


@pytest.mark.parametrize("name,kernel", [("rank", "autotune"), ("rank inductor", "inductor")])
def test_rank(plain, name, kernel):
    from perfmodel import GemmProblem, Predictor

    out = _ok(plain[name])
    assert out["kernel"] == kernel and len(out["configs"]) == 5
    ms = [c["predicted_ms"] for c in out["configs"]]
    assert ms == sorted(ms) and all(0 < t < math.inf for t in ms)
    # the same ranking as a Predictor with the full stack in this process (same backend, same CPU)
    prob = GemmProblem(m=4096, n=4096, k=4096, dtype="float16", transpose_right=True)
    want = Predictor.load(backend=out["backend"], kernel=kernel).rank(prob, top_k=5)
    fields = ("block_m", "block_n", "block_k", "group_m", "num_stages", "num_warps")
    assert [tuple(c[f] for f in fields) for c in out["configs"]] == [tuple(getattr(c, f) for f in fields)
                                                                        for c, _ in want]
    assert ms == pytest.approx([t for _, t in want], rel=1e-5)


def test_pad(plain):
    out = _ok(plain["pad"])
    assert out["needs_padding"] is True and isinstance(out["should_pad"], bool)
    assert out["orig_ms"] > 0 and out["padded_ms"] > 0
    assert out["should_pad"] == (out["padded_ms"] * out["threshold"] < out["orig_ms"])


def test_eval(plain):
    out = _ok(plain["eval"])
    res = out["results"]["perfmodel"]
    assert res["all/problems"] == out["test_problems"] > 0
    for k in ("all/top1_eff", "all/top5_eff"):
        assert 0 < res[k] <= 1
    assert res["all/top5_eff"] >= res["all/top1_eff"]
    assert out["device"]["data"] == "h100-sxm" and "pad/total_vs_oracle" in out["pad"]


def test_extras_missing_are_named(plain):
    # --log-mlflow and building need the train extra: a one-line error naming what is missing, exit 2
    for name, missing in (("eval --log-mlflow", "mlflow"), ("build", "lightning")):
        run = plain[name]
        assert run["rc"] == 2 and run["out"] == ""
        assert f"needs {missing}, not installed" in run["err"] and "perfmodel[train]" in run["err"]
        assert "Traceback" not in run["err"]
