"""Dataset loading (numpy, no pandas), the by-problem split, and the Lightning data module."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from perfmodel.features import CONFIG_COLUMNS, PAD_COLUMNS
from perfmodel.schema import DTYPE_BYTES, PAD_ALIGNMENT


@dataclass
class GemmTable:
    """One row per measured (problem, config); problem_idx points into `problems`."""

    problems: np.ndarray        # (P, 8) PROBLEM_COLUMNS, float64
    problem_keys: list[str]     # unit ids
    modes: np.ndarray           # (P,) str: float16 / bfloat16 / tf32 / float32
    problem_idx: np.ndarray     # (N,) int64
    configs: np.ndarray         # (N, 6) CONFIG_COLUMNS
    ms: np.ndarray              # (N,) measured median ms
    cublas_ms: np.ndarray       # (P,) torch.mm ms (NaN if missing)

    def problem_rows(self) -> list[np.ndarray]:
        """The row indices of each problem, in row order (empty for a problem without rows)."""
        order = np.argsort(self.problem_idx, kind="stable")
        bounds = np.searchsorted(self.problem_idx[order], np.arange(len(self.problems) + 1))
        return [order[bounds[i]:bounds[i + 1]] for i in range(len(self.problems))]

    def subset(self, problem_mask: np.ndarray) -> "GemmTable":
        keep = np.flatnonzero(problem_mask)
        remap = -np.ones(len(self.problems), dtype=np.int64)
        remap[keep] = np.arange(len(keep))
        rows = problem_mask[self.problem_idx]
        return GemmTable(self.problems[keep], [self.problem_keys[i] for i in keep], self.modes[keep],
                         remap[self.problem_idx[rows]], self.configs[rows], self.ms[rows], self.cublas_ms[keep])


@dataclass
class PadTable:
    pads: np.ndarray       # (N, 11) PAD_COLUMNS
    orig_ms: np.ndarray
    padded_ms: np.ndarray
    modes: np.ndarray


def _mode(r: dict) -> str:
    return "tf32" if r["allow_tf32"] else r["dtype"]


def _problem_row(r: dict) -> list[float]:
    return [r["m"], r["n"], r["k"], DTYPE_BYTES[r["dtype"]], r["dtype"] == "bfloat16", r["allow_tf32"],
            r["transpose_left"], r["transpose_right"]]


def load_gemm(folder: Path) -> GemmTable:
    from perfmodel.data_gen.shards import cublas_times, read_dataset

    rows, _ = read_dataset(Path(folder), "gemm")
    if not rows:
        raise FileNotFoundError(f"data: no gemm shards in {folder}")
    cublas_ms = cublas_times(rows, read_dataset(Path(folder), "cublas")[0])
    keys: dict[str, int] = {}
    problems, modes, cublas = [], [], []
    pidx, cfgs, ms = [], [], []
    for r in rows:
        if r["status"] != "ok":
            continue
        u = r["unit"]
        if u not in keys:
            keys[u] = len(problems)
            problems.append(_problem_row(r))
            modes.append(_mode(r))
            cublas.append(cublas_ms.get(u, np.nan))
        i = keys[u]
        if r["kind"] != "cublas":
            pidx.append(i)
            cfgs.append([r[c] for c in CONFIG_COLUMNS])
            ms.append(r["ms"])
    return GemmTable(np.asarray(problems, dtype=np.float64), list(keys), np.asarray(modes),
                     np.asarray(pidx, dtype=np.int64), np.asarray(cfgs, dtype=np.float64),
                     np.asarray(ms, dtype=np.float64), np.asarray(cublas, dtype=np.float64))


def load_pad(folder: Path) -> PadTable:
    from perfmodel.data_gen.shards import read_dataset

    rows, _ = read_dataset(Path(folder), "pad")
    rows = [r for r in rows if r["status"] == "ok"]
    pads = np.asarray([[r["m"], r["k"], r["n"], DTYPE_BYTES[r["dtype"]], r["dtype"] == "bfloat16", r["allow_tf32"],
                        r["transpose_left"], r["transpose_right"], r["prepadded_left"], r["prepadded_right"],
                        PAD_ALIGNMENT[r["dtype"]]] for r in rows], dtype=np.float64).reshape(-1, len(PAD_COLUMNS))
    return PadTable(pads, np.asarray([r["orig_ms"] for r in rows]), np.asarray([r["padded_ms"] for r in rows]),
                    np.asarray([_mode(r) for r in rows]))


def split_problems(modes: np.ndarray, seed: int, fractions=(0.8, 0.1, 0.1)) -> np.ndarray:
    """0/1/2 (train/val/test) per problem, stratified by dtype mode: no problem is in two sets."""
    rng = np.random.default_rng(seed)
    out = np.zeros(len(modes), dtype=np.int64)
    for mode in np.unique(modes):
        idx = rng.permutation(np.flatnonzero(modes == mode))
        n_val = int(round(fractions[1] * len(idx)))
        n_test = int(round(fractions[2] * len(idx)))
        out[idx[:n_test]] = 2
        out[idx[n_test:n_test + n_val]] = 1
    return out


def dataset_hash(folder: Path) -> str:
    """sha256 over the shard files' names and bytes (the model card records it)."""
    h = hashlib.sha256()
    for p in sorted(Path(folder).glob("*.jsonl*")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


class ProblemBatches(torch.utils.data.Sampler):
    """Batches of whole problems (so a within-problem ranking term sees every config of a problem)."""

    def __init__(self, problem_idx: np.ndarray, problems_per_batch: int, shuffle: bool, seed: int) -> None:
        self.groups = [np.flatnonzero(problem_idx == i) for i in range(int(problem_idx.max()) + 1)]
        self.groups = [g for g in self.groups if len(g)]
        self.ppb, self.shuffle, self.seed, self.epoch = problems_per_batch, shuffle, seed, 0

    def __iter__(self):
        order = np.arange(len(self.groups))
        if self.shuffle:
            order = np.random.default_rng(self.seed + self.epoch).permutation(order)
            self.epoch += 1
        for j in range(0, len(order), self.ppb):
            yield np.concatenate([self.groups[i] for i in order[j:j + self.ppb]]).tolist()

    def __len__(self) -> int:
        return -(-len(self.groups) // self.ppb)


class RowDataset(torch.utils.data.Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor, group: torch.Tensor) -> None:
        self.x, self.y, self.group = x, y, group

    def __len__(self) -> int:
        return len(self.y)

    def __getitems__(self, idx: list[int]):
        i = torch.as_tensor(idx)
        return self.x[i], self.y[i], self.group[i]

    def __getitem__(self, i: int):
        return self.x[i], self.y[i], self.group[i]


def _collate(batch):
    return batch  # __getitems__ already returns stacked tensors


def make_loader(x: torch.Tensor, y: torch.Tensor, group: np.ndarray | None, problems_per_batch: int,
                shuffle: bool, seed: int, batch_rows: int = 4096) -> torch.utils.data.DataLoader:
    g = torch.as_tensor(group if group is not None else np.arange(len(y)))
    ds = RowDataset(x, y, g)
    if group is not None:
        sampler = ProblemBatches(np.asarray(group), problems_per_batch, shuffle, seed)
        return torch.utils.data.DataLoader(ds, batch_sampler=sampler, collate_fn=_collate)
    gen = torch.Generator().manual_seed(seed)
    return torch.utils.data.DataLoader(ds, batch_size=batch_rows, shuffle=shuffle, generator=gen, collate_fn=_collate)
