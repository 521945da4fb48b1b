"""`perfmodel rank / pad / export-onnx` (serve/commands.py), on a SYNTHETIC random-weight model folder."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from perfmodel import GemmProblem, PadProblem
from perfmodel.serve import Predictor
from tests._synthetic import write_synthetic_model
from perfmodel.serve.cli import main

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_model(tmp_path_factory.mktemp("cli") / "model", seed=3)


def _run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    try:
        rc = main(list(argv))
    except SystemExit as exc:  # argparse errors exit
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_rank_table(model_dir: Path, capsys: pytest.CaptureFixture) -> None:
    rc, out, err = _run(capsys, "rank", "--m", "4096", "--n", "4096", "--k", "4096", "--dtype", "float16",
                        "--top-k", "3", "--model", str(model_dir))
    assert rc == 0, err
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["rank", "BLOCK_M"])
    for word in ("BLOCK_N", "BLOCK_K", "GROUP_M", "stages", "warps", "TFLOP/s"):
        assert word in lines[header]
    rows = [line.split() for line in lines[header + 2: header + 5]]
    assert [r[0] for r in rows] == ["1", "2", "3"]
    times = [float(r[7]) for r in rows]
    assert times == sorted(times)
    best = Predictor.load(model_dir).rank(GemmProblem(m=4096, n=4096, k=4096, dtype="float16"), top_k=3)
    assert [int(x) for x in rows[0][1:7]] == list(best[0][0].as_dict().values())
    assert "cuBLAS" in out


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_rank_json(model_dir: Path, capsys: pytest.CaptureFixture, backend: str) -> None:
    rc, out, err = _run(capsys, "rank", "--m", "128", "--n", "1000", "--k", "4096", "--dtype", "float32",
                        "--allow-tf32", "--transpose-left", "--top-k", "4", "--model", str(model_dir),
                        "--backend", backend, "--json")
    assert rc == 0, err
    res = json.loads(out)
    want = GemmProblem(m=128, n=1000, k=4096, dtype="float32", allow_tf32=True, transpose_left=True)
    assert res["problem"] == want.as_dict()
    assert [r["rank"] for r in res["configs"]] == [1, 2, 3, 4]
    ms = [r["predicted_ms"] for r in res["configs"]]
    assert ms == sorted(ms) and res["cublas_ms"] > 0 and isinstance(res["prefer_cublas"], bool)
    assert res["backend"] == backend
    flops = 2 * 128 * 1000 * 4096
    assert res["configs"][0]["tflops"] == pytest.approx(flops / (ms[0] * 1e-3) / 1e12)


def test_pad(model_dir: Path, capsys: pytest.CaptureFixture) -> None:
    rc, out, err = _run(capsys, "pad", "--m", "4095", "--k", "4097", "--n", "1000", "--dtype", "bfloat16",
                        "--model", str(model_dir), "--json")
    assert rc == 0, err
    res = json.loads(out)
    d = Predictor.load(model_dir).pad(PadProblem(m=4095, k=4097, n=1000, dtype="bfloat16"))
    assert res["should_pad"] == d.should_pad and res["orig_ms"] == pytest.approx(d.orig_ms)
    assert res["padded_dims"] == {"m": 4096, "k": 4104, "n": 1000}
    rc, out, _ = _run(capsys, "pad", "--m", "4096", "--k", "4096", "--n", "1024", "--prepadded-left",
                      "--model", str(model_dir))
    assert rc == 0 and "already aligned" in out


@pytest.mark.parametrize("argv, field", [
    (["rank", "--m", "0", "--n", "64", "--k", "64"], "m"),
    (["rank", "--m", "-4", "--n", "64", "--k", "64"], "m"),
    (["rank", "--m", "64", "--n", "64", "--k", "2.5"], "k"),
    (["rank", "--m", "64", "--n", "x", "--k", "64"], "n"),
    (["rank", "--m", "nan", "--n", "64", "--k", "64"], "m"),
    (["rank", "--m", "64", "--n", "64", "--k", "64", "--dtype", "int8"], "dtype"),
    (["rank", "--m", "64", "--n", "64", "--k", "64", "--top-k", "0"], "top_k"),
    (["rank", "--m", "64", "--n", "64", "--k", "64", "--backend", "tensorrt"], "backend"),
    (["rank", "--n", "64", "--k", "64"], "--m"),
    (["rank", "--m", "64", "--n", "64", "--k", "64", "--batch", "0"], "batch"),
    (["rank", "--m", "64", "--n", "64", "--k", "64", "--batch", "8"], "batch"),  # no bmm heads in this model
    (["pad", "--m", "64", "--k", "0", "--n", "64"], "k"),
])
def test_bad_input_one_line_error(model_dir: Path, capsys: pytest.CaptureFixture, argv: list[str],
                                  field: str) -> None:
    rc, out, err = _run(capsys, *argv, "--model", str(model_dir))
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"perfmodel {argv[0]}: error: ") and field in err


def test_missing_model_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rc, _, err = _run(capsys, "rank", "--m", "64", "--n", "64", "--k", "64", "--model", str(tmp_path / "none"))
    assert rc == 2 and "no model folder" in err and len(err.strip().splitlines()) == 1


def test_export_onnx(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = tmp_path / "m"
    shutil.copytree(model_dir, folder)
    (folder / "model.onnx").unlink()
    rc, out, err = _run(capsys, "export-onnx", "--model", str(folder))
    assert rc == 0, err
    assert (folder / "model.onnx").is_file()
    p = Predictor.load(folder, backend="onnx")
    assert p.rank(GemmProblem(m=64, n=64, k=64), top_k=1)
    steps = json.loads((folder / "metadata.json").read_text())["build"]["steps"]
    assert steps[-1]["step"] == "export-onnx" and steps[-1]["refit"] is True  # the folder's record says so
    rc, _, _ = _run(capsys, "export-onnx", "--model", str(folder), "--out", str(tmp_path / "x.onnx"))
    assert rc == 0 and (tmp_path / "x.onnx").is_file()
    # an export elsewhere leaves the folder, and its record, as they were
    assert json.loads((folder / "metadata.json").read_text())["build"]["steps"] == steps


def test_export_onnx_screen_keep(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--screen-keep sets the folder's screen_keep and traces the ranking graph with it: the onnx backend
    then ranks in one call with that keep, as the torch backend does."""
    folder = tmp_path / "m"
    shutil.copytree(model_dir, folder)
    before = Predictor.load(folder, backend="onnx").screen_keep
    keep = max(1, before // 2)
    rc, out, err = _run(capsys, "export-onnx", "--model", str(folder), "--screen-keep", str(keep))
    assert rc == 0, err
    ox, pt = Predictor.load(folder, backend="onnx"), Predictor.load(folder, backend="torch")
    assert ox.screen_keep == pt.screen_keep == ox._run.rank_keep == keep != before
    last = json.loads((folder / "metadata.json").read_text())["build"]["steps"][-1]
    assert last["step"] == "export-onnx" and last["settings"] == {"screen_keep": keep}
    prob = GemmProblem(m=3000, n=77, k=1024)
    a, b = ox.rank(prob, top_k=5), pt.rank(prob, top_k=5)
    assert [c for c, _ in a] == [c for c, _ in b]
    assert np.allclose([ms for _, ms in a], [ms for _, ms in b], rtol=1e-3)
    rc, _, err = _run(capsys, "export-onnx", "--model", str(folder), "--screen-keep", "4", "--out", str(tmp_path / "x.onnx"))
    assert rc == 2 and "--screen-keep" in err


def test_python_m_serve_cli(model_dir: Path) -> None:
    """`python -m perfmodel.serve.cli rank ...` from the repo root."""
    r = subprocess.run([sys.executable, "-m", "perfmodel.serve.cli", "rank", "--m", "512", "--n", "512", "--k", "512",
                        "--model", str(model_dir), "--json"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["configs"]) == 5


def test_rank_a_batched_gemm_with_the_shipped_model(capsys: pytest.CaptureFixture) -> None:
    """--batch ranks Inductor's bmm template with the shipped model's bmm heads (models/h100, real weights)."""
    model = REPO / "models" / "h100"
    rc, out, err = _run(capsys, "rank", "--m", "384", "--n", "384", "--k", "64", "--batch", "256", "--top-k", "3",
                        "--model", str(model), "--json")
    assert rc == 0, err
    res = json.loads(out)
    prob = GemmProblem(m=384, n=384, k=64, batch=256)
    assert res["problem"] == prob.as_dict() and len(res["configs"]) == 3
    want = Predictor.load(model).rank(prob, top_k=3)
    assert [r["predicted_ms"] for r in res["configs"]] == pytest.approx([ms for _, ms in want], rel=1e-6)
    assert res["configs"][0]["tflops"] == pytest.approx(prob.flops / (want[0][1] * 1e-3) / 1e12)
    rc, out, err = _run(capsys, "rank", "--m", "384", "--n", "384", "--k", "64", "--batch", "256",
                        "--model", str(model))
    assert rc == 0, err
    assert out.startswith("256 x 384 x 384 x 64 float16") and "aten::bmm predicted" in out
