"""`perfmodel gen static`: rows timed with the static compile (the kernel compiled for one problem's shape,
as Inductor compiles its mm template) written into a dataset folder as `gemm_static` parts (CPU); with
`--kind gemm_tutorial`, rows of the Triton tutorial's matmul (the kernel an `@autotune` user writes,
benchmarks/studies/tutorial_kernel.py `sweep`) as `gemm_tutorial` parts.

The rows come from GPU runs of `benchmarks/static_retime.py` (a folder holding `static_rows.jsonl.gz`, or a
rows file of that format): one JSON row per config, with the problem's `unit`. Each problem becomes one
unit of the folder's `gemm_static` parts, its Triton and cuBLAS rows as timed, under the folder's own
`gemm` header (device, versions, kernel source hash) with the static kernel mode. Units already in the
folder are left as they are, so the same runs can be written again (a run adding nothing writes no part).
A gemm_tutorial row times one of the folder's problems, or a problem of the tutorial kernel's own (the unaligned
sweep's shapes, which the dataset's kernel was not timed on): its unit is then the id of its own fields
(data_gen/problems.py problem_id), which is checked.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

ROWS_FILE = "static_rows.jsonl.gz"  # what a static_retime.py GPU run writes into its --out folder
SOURCE = "perfmodel gen static"


def rows_file(run: Path) -> Path:
    """The rows file of a run: the path itself if it is a file, else the folder's static_rows.jsonl.gz."""
    path = run if run.is_file() else run / ROWS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"runs: no {ROWS_FILE} in {run} (nor is it a rows file)")
    return path


def read_runs(runs: list[Path]) -> dict[str, list[dict[str, Any]]]:
    """The runs' rows by problem unit, in file order; each row without its `unit` and `kernel` fields."""
    by_unit: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        with gzip.open(rows_file(run), "rt") as fh:
            for n, line in enumerate(fh, 1):
                r = json.loads(line)
                if "unit" not in r:
                    raise ValueError(f"runs: row {n} of {run} has no 'unit' field")
                r.pop("kernel", None)
                by_unit.setdefault(r.pop("unit"), []).append(r)
    return by_unit


def run_kernel(runs: list[Path]) -> dict[str, str]:
    """The kernel a tutorial sweep timed (kernel_mode, kernel_hash), from its runs' run.json; ValueError where
    a run has none or the runs disagree (one part holds one kernel's rows)."""
    seen = set()
    for run in runs:
        path = (run if run.is_dir() else run.parent) / "run.json"
        try:
            meta = json.loads(path.read_text())
            seen.add((meta["kernel"], meta["kernel_hash"]))
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(f"runs: {path} does not name the kernel timed (kernel, kernel_hash): {exc}") from None
    if len(seen) != 1:
        raise ValueError(f"runs: the runs timed {len(seen)} different kernels ({sorted(seen)}); write one at a time")
    mode, h = seen.pop()
    return {"kernel_mode": mode, "kernel_hash": h}


def _problem_id(row: dict[str, Any], unit: str) -> str:
    """data_gen/problems.py problem_id of a row's problem fields; ValueError naming the unit where one is missing."""
    from .problems import PROBLEM_FIELDS, problem_id, row_problem

    missing = [f for f in PROBLEM_FIELDS if f not in row]
    if missing:
        raise ValueError(f"runs: the rows of problem {unit!r} have no {', '.join(missing)}")
    return problem_id(row_problem(row))


def write_static(data: Path, runs: list[Path], kind: str | None = None) -> dict[str, int]:
    """Write the runs' rows into the dataset folder `data` as `kind` parts (gemm_static by default, or
    gemm_tutorial), gzipped when done. Returns {"written": new problems, "problems": problems read, "rows": rows
    read}."""
    from .kernel import STATIC_KIND, static_kernel_mode
    from .shards import TUTORIAL_KIND, ShardWriter, compress_parts, read_dataset

    kind = kind or STATIC_KIND
    if kind not in (STATIC_KIND, TUTORIAL_KIND):
        raise ValueError(f"--kind: expected {STATIC_KIND} or {TUTORIAL_KIND}, got {kind!r}")
    if not runs:
        raise ValueError("runs: name at least one static_retime.py run (folder or rows file)")
    if not data.is_dir():
        raise FileNotFoundError(f"--out: no dataset folder at {data}")
    _, headers = read_dataset(data, "gemm")
    if not headers:
        raise FileNotFoundError(f"--out: {data} has no gemm shards to take the header from")
    header = {k: v for k, v in headers[0].items() if k not in ("_header", "kind", "sweep")}
    if kind == STATIC_KIND:
        header.update(kernel_mode=static_kernel_mode(), source=SOURCE)
    else:
        header.update(run_kernel(runs), source=f"{SOURCE} --kind {TUTORIAL_KIND}")
    by_unit = read_runs(runs)
    if kind == TUTORIAL_KIND:  # a problem of the folder's, or a new one named by the id of its own fields
        known = {r["unit"] for r in read_dataset(data, "gemm")[0]}
        for unit, rows in by_unit.items():
            if unit not in known and unit != _problem_id(rows[0], unit):
                raise ValueError(f"runs: problem {unit!r} is not in {data}'s gemm rows, nor is it the id of its rows' "
                                 f"problem (m, n, k, dtype, allow_tf32, layout: {_problem_id(rows[0], unit)!r})")
    done = {r["unit"] for r in read_dataset(data, kind)[0]}
    new = sorted(u for u in by_unit if u not in done)
    if new:  # (no part at all when every problem is already there)
        with ShardWriter(data, kind, header) as w:
            for unit in new:
                w.write_unit(unit, by_unit[unit])
        compress_parts(data)
    return {"written": len(new), "problems": len(by_unit), "rows": sum(len(r) for r in by_unit.values())}
