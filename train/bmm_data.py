"""The bmm rows of a dataset folder (`perfmodel gen bmm`) as the bmm heads' table (train/bmm_head.py), their split
by shape, and the folder's static rows as batch-1 bmm rows."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from perfmodel.features import BMM_PROBLEM_COLUMNS

from .data import _mode, _problem_row, split_problems


@dataclass
class BmmTable:
    """A folder's bmm rows. Per problem: problems (P, 9) BMM_PROBLEM_COLUMNS, modes, families, shape (an id
    shared by problems that differ only in batch), aten_ms (nan where not timed). Per Triton row:
    problem_idx, configs (R, 6), ms, inductor (a config of Inductor's DEFAULT list, not an extra one)."""

    problems: np.ndarray
    modes: np.ndarray
    families: np.ndarray
    shape: np.ndarray
    aten_ms: np.ndarray
    problem_idx: np.ndarray
    configs: np.ndarray
    ms: np.ndarray
    inductor: np.ndarray


def has_bmm_rows(folder: Path) -> bool:
    """Whether the dataset folder has bmm shards (`perfmodel gen bmm`)."""
    from perfmodel.data_gen.bmm import KIND
    from perfmodel.data_gen.shards import part_files

    return bool(part_files(Path(folder), KIND))


def table_from_rows(rows: list[dict[str, Any]]) -> BmmTable:
    """The BmmTable of bmm shard rows (ok Triton rows and aten rows; failures and aten_pad rows left out)."""
    index: dict[str, int] = {}
    probs, modes, fams, shapes, aten = [], [], [], [], []
    shape_ids: dict[tuple, int] = {}
    tri: list[tuple[int, list[int], float, bool]] = []
    for r in rows:
        if r.get("status") != "ok" or r.get("kind") not in ("triton", "aten"):
            continue
        if r["unit"] not in index:
            index[r["unit"]] = len(probs)
            probs.append(_problem_row(r) + [r["batch"]])
            modes.append(_mode(r))
            fams.append(r.get("family", ""))
            key = tuple(_problem_row(r))
            shapes.append(shape_ids.setdefault(key, len(shape_ids)))
            aten.append(np.nan)
        i = index[r["unit"]]
        if r["kind"] == "aten":
            aten[i] = r["ms"]
        else:
            cfg = [r[c] for c in ("block_m", "block_n", "block_k", "group_m", "num_stages", "num_warps")]
            tri.append((i, cfg, r["ms"], str(r.get("source", "")).startswith("default")))
    if not tri:
        raise ValueError("data: no timed Triton bmm rows")
    return BmmTable(np.array(probs, dtype=np.float64).reshape(-1, len(BMM_PROBLEM_COLUMNS)), np.array(modes),
                    np.array(fams), np.array(shapes), np.array(aten, dtype=np.float64),
                    np.array([t[0] for t in tri]), np.array([t[1] for t in tri], dtype=np.float64),
                    np.array([t[2] for t in tri], dtype=np.float64), np.array([t[3] for t in tri]))


def load_bmm(folder: Path) -> BmmTable:
    """The folder's bmm shards as a BmmTable; FileNotFoundError naming data where it has none."""
    from perfmodel.data_gen.bmm import KIND
    from perfmodel.data_gen.shards import read_dataset

    rows, _ = read_dataset(Path(folder), KIND)
    if not rows:
        raise FileNotFoundError(f"data: no {KIND} shards in {folder} (perfmodel gen bmm)")
    return table_from_rows(rows)


def load_bmm_checked(folder: Path, device: str) -> BmmTable:
    """load_bmm, ValueError naming data where the shards were timed on another device than `device` (a spec name)."""
    from perfmodel.data_gen.bmm import KIND
    from perfmodel.data_gen.shards import read_dataset

    rows, headers = read_dataset(Path(folder), KIND)
    timed = {h.get("device_spec") for h in headers}
    if timed != {device}:
        raise ValueError(f"data: the bmm shards of {folder} were timed on {', '.join(map(str, sorted(timed, key=str)))}; "
                         f"the model's bmm heads are fitted for its default device {device}")
    if not rows:
        raise FileNotFoundError(f"data: no {KIND} shards in {folder} (perfmodel gen bmm)")
    return table_from_rows(rows)


def shard_record(folder: Path, kind: str) -> dict[str, Any]:
    """The folder and the sha256 of its shard files of one kind (in name order), for the build record."""
    import hashlib

    from perfmodel.data_gen.shards import part_files

    h = hashlib.sha256()
    files = sorted(part_files(Path(folder), kind), key=lambda p: p.name)
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return {"path": Path(folder).as_posix(), "files": [f.name for f in files], "sha256": h.hexdigest()}


def bmm_data_record(folder: Path) -> dict[str, Any]:
    """The folder and the sha256 of its bmm shard files (in name order), for the build record."""
    from perfmodel.data_gen.bmm import KIND

    return shard_record(folder, KIND)


def split_by_shape(table: BmmTable, seed: int) -> np.ndarray:
    """0/1/2 (train/val/test) per problem: split_problems over the shapes (stratified by dtype mode), each
    problem in its shape's set."""
    first = np.unique(table.shape, return_index=True)[1]           # one problem of each shape, by shape id
    return split_problems(table.modes[first], seed)[table.shape]


def static_table(folder: Path) -> BmmTable | None:
    """The folder's gemm_static rows (train/static_head.py load_static) as batch-1 bmm rows, family "mm"; None
    where it has none."""
    from .static_head import has_static_rows, load_static

    if not has_static_rows(folder):
        return None
    st = load_static(folder)
    n = len(st.problems)
    return BmmTable(np.concatenate([st.problems, np.ones((n, 1))], 1), st.modes, np.full(n, "mm"), np.arange(n),
                    np.full(n, np.nan), st.problem_idx, st.configs, st.ms, np.zeros(len(st.ms), dtype=bool))

