"""Dataset loading (numpy, no pandas), the by-problem split, and the Lightning data module."""
from __future__ import annotations

import json
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
    from perfmodel.data_gen.shards import read_dataset

    rows, _ = read_dataset(Path(folder), "gemm")
    if not rows:
        raise FileNotFoundError(f"data: no gemm shards in {folder}")
    return _gemm_table(rows, read_dataset(Path(folder), "cublas")[0])


def _gemm_table(rows: list[dict], cublas_rows: list[dict]) -> GemmTable:
    from perfmodel.data_gen.shards import cublas_times

    cublas_ms = cublas_times(rows, cublas_rows)
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

    return _pad_table(read_dataset(Path(folder), "pad")[0])


def _pad_table(rows: list[dict]) -> PadTable:
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


# ---------------------------------------------------------------- datasets of several devices

@dataclass
class DeviceDataset:
    """One dataset folder: its device (the spec name its shard headers give) and its tables."""

    device: str
    folder: Path
    gemm: GemmTable
    pads: PadTable
    header: dict          # the first gemm shard header (device metadata, kernel hash, sweep settings)


def header_device(header: dict) -> str:
    """The device spec name of a shard header: its device_spec, else the known spec matching its device
    name and SM count (perfmodel.devices.match_spec). ValueError when neither names a known device."""
    from perfmodel.devices import KNOWN_DEVICES, match_spec

    name = header.get("device_spec")
    if name in KNOWN_DEVICES:
        return name
    spec = match_spec(str(header.get("device_name", "")), header.get("sm_count"))
    if spec is None:
        raise ValueError(f"data: the shards' device {header.get('device_name')!r} ({header.get('sm_count')} SMs) "
                         "matches no spec of perfmodel/devices.py; add its DeviceSpec first")
    return spec.name


def folder_name_device(folder: Path) -> str | None:
    """The device a folder's name stands for (perfmodel.devices.DEVICE_FOLDER: "h100", "h100-v4" -> h100-sxm,
    "h200" -> h200), None for a name that names no device."""
    from perfmodel.devices import DEVICE_FOLDER

    name = Path(folder).resolve().name
    hits = [(len(f), d) for d, f in DEVICE_FOLDER.items() if name == f or name.startswith(f + "-")]
    return max(hits)[1] if hits else None


def load_device_dataset(folder: Path) -> DeviceDataset:
    """A dataset folder with its device, from the shard headers. Refuses a folder whose parts disagree on
    the device (within a kind the shard reader already refuses; here across gemm, cublas and pad parts),
    and one whose name stands for another device than its shards' (data/h200 holding H100 rows)."""
    from perfmodel.data_gen.shards import ShardMismatchError, read_dataset

    folder = Path(folder)
    rows, headers = read_dataset(folder, "gemm")
    if not rows:
        raise FileNotFoundError(f"data: no gemm shards in {folder}")
    cublas_rows, cublas_headers = read_dataset(folder, "cublas")
    pad_rows, pad_headers = read_dataset(folder, "pad")
    first = headers[0]
    for h in cublas_headers + pad_headers:
        for key in ("device_name", "sm_count"):
            if h.get(key) != first.get(key):
                raise ShardMismatchError(f"{folder}: refusing to mix devices: the {h.get('kind')} shards' {key} is "
                                         f"{h.get(key)!r}, the gemm shards' {first.get(key)!r}")
    device = header_device(first)
    named = folder_name_device(folder)
    if named is not None and named != device:
        raise ShardMismatchError(f"{folder}: the folder's name stands for {named} but its shards were measured on "
                                 f"{first.get('device_name')!r} ({device}): refusing to mix devices")
    return DeviceDataset(device, folder, _gemm_table(rows, cublas_rows), _pad_table(pad_rows), first)


def load_device_datasets(folders) -> list[DeviceDataset]:
    """Each folder's DeviceDataset, in order (the first is the model's default device). Refuses two folders
    of one device (their problems would be split apart independently) and datasets timed with different
    kernels (every device must be timed with the same kernel to be compared)."""
    out = [load_device_dataset(f) for f in folders]
    seen: dict[str, Path] = {}
    for d in out:
        if d.device in seen:
            raise ValueError(f"data: {seen[d.device]} and {d.folder} are both {d.device} datasets; give one folder "
                             "per device")
        seen[d.device] = d.folder
    kernels = {d.header.get("kernel_hash") for d in out}
    if len(kernels) > 1:
        raise ValueError("data: the datasets were timed with different kernels ("
                         + ", ".join(f"{d.folder}: {d.header.get('kernel_hash')}" for d in out) + ")")
    return out


def joint_split(datasets: list, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The split of several devices' datasets (0/1/2 train/val/test per problem, and per pad row), one
    array per dataset: the first (the model's default device) gets split_problems -- the split of a model
    of it alone; in each later one, a problem also measured on an earlier device (the same m, n, k, dtype,
    tf32 and layout) takes that problem's set, so that no held-out shape is trained on through another
    device's timings, and its other problems are split by split_problems, stratified by dtype mode.
    Deterministic: the seed and the datasets' order decide it."""
    known_g: dict[tuple, int] = {}
    known_p: dict[tuple, int] = {}
    return ([_inherit_split(ds.gemm.problems, ds.gemm.modes, known_g, seed) for ds in datasets],
            [_inherit_split(ds.pads.pads, ds.pads.modes, known_p, seed) for ds in datasets])


def _inherit_split(rows: np.ndarray, modes: np.ndarray, known: dict[tuple, int], seed: int) -> np.ndarray:
    keys = [tuple(r) for r in rows.tolist()]
    out = np.array([known.get(k, -2) for k in keys], dtype=np.int64)
    new = out == -2
    out[new] = split_problems(modes[new], seed)
    for k, v in zip(keys, out.tolist()):
        known.setdefault(k, v)
    return out


def parse_device_fractions(text: str) -> dict[str, float]:
    """"h200=0.1,h100-sxm=1" -> {"h200": 0.1, "h100-sxm": 1.0}; "" -> {}."""
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        try:
            frac = float(value)
        except ValueError:
            frac = float("nan")
        if not sep or not name.strip() or not 0.0 <= frac <= 1.0:
            raise ValueError(f"device_fraction: expected DEVICE=FRACTION with 0 <= FRACTION <= 1, got {part!r}")
        out[name.strip()] = frac
    return out


def subsample_training(split: np.ndarray, device: np.ndarray, modes: np.ndarray, fractions: dict[str, float],
                       seed: int) -> np.ndarray:
    """The split with only a fraction of a device's TRAINING problems kept (per dtype mode, rounded); the
    others become -1 (unused). Validation and test are unchanged. Deterministic per (seed, device), and
    nested: the problems kept at a fraction are kept at every larger one."""
    import zlib

    out = split.copy()
    for name, frac in fractions.items():
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        for mode in np.unique(modes):
            idx = np.flatnonzero((device == name) & (modes == mode) & (split == 0))
            order = rng.permutation(idx)
            out[order[int(round(frac * len(idx))):]] = -1
    return out


def concat_gemm(tables: list[GemmTable]) -> GemmTable:
    offsets = np.cumsum([0] + [len(t.problems) for t in tables])
    return GemmTable(np.concatenate([t.problems for t in tables]), [k for t in tables for k in t.problem_keys],
                     np.concatenate([t.modes for t in tables]),
                     np.concatenate([t.problem_idx + o for t, o in zip(tables, offsets)]),
                     np.concatenate([t.configs for t in tables]), np.concatenate([t.ms for t in tables]),
                     np.concatenate([t.cublas_ms for t in tables]))


def concat_pad(tables: list[PadTable]) -> PadTable:
    return PadTable(np.concatenate([t.pads for t in tables]), np.concatenate([t.orig_ms for t in tables]),
                    np.concatenate([t.padded_ms for t in tables]), np.concatenate([t.modes for t in tables]))


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
    # A last training batch of one row cannot be batch-normalised: it is left out of that epoch (a shuffled
    # loader leaves out another row each epoch). Any other size keeps every row.
    drop_last = shuffle and len(y) % batch_rows == 1
    return torch.utils.data.DataLoader(ds, batch_size=batch_rows, shuffle=shuffle, generator=gen, collate_fn=_collate,
                                       drop_last=drop_last)


def slice_dataset(src: Path, dst: Path, problems: int, seed: int, kinds: tuple[str, ...]) -> Path:
    """Write a slice of the dataset folder src into dst (created; its shard files plain .jsonl): `problems`
    GEMM problems drawn at random (seeded) with their rows of every kind keyed by problem (gemm, cublas,
    gemm_static), and the same share of the units of the other kinds (pad, cublas_only). For a small
    model that builds in minutes (recipes/ci-small.toml); the split and everything downstream are as for
    a whole folder."""
    from perfmodel.data_gen.shards import part_files, read_part

    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    gemm_units = sorted({u for p in part_files(src, "gemm") for u in read_part(p)[2]})
    if problems < 1 or not gemm_units:
        raise ValueError(f"slice_problems: must be >= 1 with gemm shards in {src}, got {problems}")
    rng = np.random.default_rng(seed)
    keep = set(rng.permutation(gemm_units)[:problems].tolist())
    share = min(1.0, problems / len(gemm_units))
    for kind in kinds:
        for path in part_files(src, kind):
            header, rows, done = read_part(path)
            units = sorted(done)
            if kind not in ("gemm", "cublas", "gemm_static"):  # units of their own: the same share of them
                units = sorted(rng.permutation(units)[:int(round(share * len(units)))].tolist())
            chosen = set(units) & (keep if kind in ("gemm", "cublas", "gemm_static") else set(units))
            by_unit: dict[str, list] = {}
            for r in rows:
                if r.get("unit") in chosen:
                    by_unit.setdefault(r["unit"], []).append(r)
            name = path.name[:-3] if path.name.endswith(".gz") else path.name
            with open(dst / name, "w", encoding="utf-8") as f:
                f.write(json.dumps(header) + "\n")
                for unit, unit_rows in by_unit.items():
                    f.writelines(json.dumps(r) + "\n" for r in unit_rows)
                    f.write(json.dumps({"_done": unit, "rows": len(unit_rows)}) + "\n")
    return dst


# ---------------------------------------------------------------- the domain a model was trained on

def data_domain(folders) -> dict:
    """The metadata "domain" record (perfmodel.domain.record) of the rows in the dataset folders, every
    device's: per kind of head, the least and greatest m, n, k (and batch), the greatest FLOPs and the layouts
    of the rows it is fitted on -- gemm: the GEMM problems with Triton times; cublas: the GEMM problems with a
    torch.mm time, the cuBLAS-only problems and the pad rows; pad: the pad rows; bmm: the bmm rows. Rows that
    failed are left out; kinds a folder lacks are skipped."""
    from perfmodel.data_gen.shards import ONLY_KIND, read_dataset
    from perfmodel.domain import record

    def dims(rows: list, names: tuple) -> np.ndarray:
        return np.array([[r[n] for n in names] for r in rows], dtype=np.float64).reshape(-1, len(names))

    mnk, lay = ("m", "n", "k"), ("transpose_left", "transpose_right")
    parts: dict[str, list] = {"gemm": [], "cublas": [], "pad": [], "bmm": []}
    for folder in folders:
        gemm = load_gemm(Path(folder))                                            # columns m, n, k, ..., tl, tr
        has_rows = np.bincount(gemm.problem_idx, minlength=len(gemm.problems)) > 0
        parts["gemm"].append(gemm.problems[has_rows][:, [0, 1, 2, 6, 7]])
        parts["cublas"].append(gemm.problems[np.isfinite(gemm.cublas_ms)][:, [0, 1, 2, 6, 7]])
        only = [r for r in read_dataset(Path(folder), ONLY_KIND)[0] if r.get("status") == "ok"]
        parts["cublas"].append(dims(only, mnk + lay))
        pads = load_pad(Path(folder))                                             # columns m, k, n, ..., tl, tr
        parts["pad"].append(pads.pads[:, [0, 1, 2, 6, 7]])
        parts["cublas"].append(pads.pads[:, [0, 2, 1, 6, 7]])                     # the unpadded mm (m, n, k)
        bmm = [r for r in read_dataset(Path(folder), "bmm")[0] if r.get("status") == "ok"]
        parts["bmm"].append(dims(bmm, mnk + ("batch",) + lay))
    return record({kind: np.concatenate(p) for kind, p in parts.items() if p})


def write_domain(model, folders) -> dict:
    """Add (or replace) a model folder's metadata "domain" from its data folders (data_domain), its weights
    and ONNX files untouched, and the step to its build record. Returns the record.

        python -c "from perfmodel.train.data import write_domain; write_domain('models/h100', ['data/h100'])"
    """
    import time

    from perfmodel.artifact import METADATA, append_step, step_record

    from .folder import dataset_path

    t0 = time.perf_counter()
    folder = Path(model)
    meta = json.loads((folder / METADATA).read_text())
    meta["domain"] = data_domain(folders)
    paths = [dataset_path(Path(f)) for f in folders]
    meta = append_step(meta, step_record("domain", {"data": paths}, time.perf_counter() - t0, refit=True,
                                         command=f"write_domain({str(model)!r}, {paths!r})"))
    (folder / METADATA).write_text(json.dumps(meta, indent=2, sort_keys=True))
    return meta["domain"]
