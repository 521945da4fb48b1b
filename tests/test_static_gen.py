"""`perfmodel gen static` (data_gen/static_gen.py, CPU): static-compile runs' rows into a dataset folder's
gemm_static parts. On a SYNTHETIC dataset (tests/_synthetic.py) and made-up static rows, and on the
committed runs, which must give back data/h100's gemm_static rows exactly."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from perfmodel.cli import main
from perfmodel.data_gen.shards import read_dataset
from tests._synthetic import write_retimed_run, write_synthetic_dataset

REPO = Path(__file__).resolve().parent.parent
RUNS = REPO / "benchmarks" / "results" / "static_retime_h100"
STATIC = "gemm_static"


def _run_folder(path: Path, data: Path, units: int) -> Path:
    """A run folder as static_retime.py writes it: each of the first `units` problems' Triton rows
    re-timed (made-up times: the dataset's x 1.1), tagged with its unit and the kernel."""
    return write_retimed_run(data, path, slice(None, units), 1.1, kernel="v4 static")


def test_gen_static_writes_the_runs_rows_once(tmp_path, capsys):
    data = write_synthetic_dataset(tmp_path / "data")
    first = _run_folder(tmp_path / "run1", data, 3)
    assert main(["gen", "static", str(first), "--out", str(data)]) == 0
    assert capsys.readouterr().out.startswith("3 problems (")
    rows, headers = read_dataset(data, STATIC)
    gemm_header = read_dataset(data, "gemm")[1][0]
    assert len({r["unit"] for r in rows}) == 3 and all("kernel" not in r for r in rows)
    assert headers[0]["device_name"] == gemm_header["device_name"] and headers[0]["source"] == "perfmodel gen static"
    assert headers[0]["kernel_mode"].startswith("v4 static")
    with gzip.open(first / "static_rows.jsonl.gz", "rt") as fh:
        written = [json.loads(line) for line in fh]
    assert sorted(r["ms"] for r in rows if r["status"] == "ok") == sorted(r["ms"] for r in written if r["status"] == "ok")
    parts = sorted(p.name for p in data.iterdir() if p.name.startswith(STATIC))
    # the same run again adds nothing, not even an empty part; a larger run adds only its new problems
    assert main(["gen", "static", str(first), "--out", str(data)]) == 0
    assert sorted(p.name for p in data.iterdir() if p.name.startswith(STATIC)) == parts
    assert main(["gen", "static", str(_run_folder(tmp_path / "run2", data, 5) / "static_rows.jsonl.gz"),
                 "--out", str(data)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("2 problems (")
    assert len({r["unit"] for r in read_dataset(data, STATIC)[0]}) == 5


def test_gen_static_names_the_bad_input(tmp_path, capsys):
    data = write_synthetic_dataset(tmp_path / "data")
    assert main(["gen", "static", str(tmp_path / "nowhere"), "--out", str(data)]) == 2
    assert "runs:" in capsys.readouterr().err
    run = _run_folder(tmp_path / "run", data, 1)
    (tmp_path / "empty").mkdir()
    assert main(["gen", "static", str(run), "--out", str(tmp_path / "empty")]) == 2
    assert "--out:" in capsys.readouterr().err and not list((tmp_path / "empty").iterdir())


@pytest.mark.skipif(not (RUNS / "static_rows.jsonl.gz").is_file(), reason="no committed static re-time")
@pytest.mark.slow
def test_gen_static_rebuilds_the_shipped_static_rows(tmp_path):
    """data/h100's gemm_static parts were written from these nine runs: the same rows come back."""
    data = tmp_path / "h100"
    data.mkdir()
    for part in (REPO / "data" / "h100").glob("gemm-*"):
        (data / part.name).write_bytes(part.read_bytes())
    runs = [RUNS, *(RUNS / f for f in ("test2", "test3", "train1", "train2", "val1", "train3", "train4", "train5"))]
    assert main(["gen", "static", *map(str, runs), "--out", str(data)]) == 0
    got, _ = read_dataset(data, STATIC)
    shipped, _ = read_dataset(REPO / "data" / "h100", STATIC)
    assert len(got) == len(shipped) == 65_623
    assert sorted(json.dumps(r, sort_keys=True) for r in got) == sorted(json.dumps(r, sort_keys=True) for r in shipped)
