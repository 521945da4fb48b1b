"""Append-only, crash-safe dataset shards.

A shard part is a JSON-lines file: line 1 is a header (kind, device metadata, kernel hash, sweep
settings); then record lines, written in units: the rows of one unit (a GEMM problem, a batch of pad
problems) followed by a `{"_done": unit_id, "rows": n}` marker, flushed and fsynced together. A unit
without its marker was interrupted and does not count; a resumed run re-measures it into a new part,
so rows are never torn or duplicated. Finished parts may be gzipped (`.jsonl.gz`); reading handles both.
"""
from __future__ import annotations

import gzip
import io
import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

# Shard kinds of a dataset folder beside "gemm", "pad" and "cublas" (the quiet torch.mm re-time), here so
# that reading a dataset needs neither the kernel module (triton) nor the sweeps.
STATIC_KIND = "gemm_static"   # rows timed with the static compile (Inductor's kernel mode), data_gen/kernel.py
TUTORIAL_KIND = "gemm_tutorial"  # rows of the Triton tutorial's matmul, as an @autotune user writes it (kernel="tutorial")
ONLY_KIND = "cublas_only"     # torch.mm alone on problems of its own, data_gen/cublas_sweep.py

# Header fields that must agree between parts of one dataset: a resumed run refuses to mix them.
IDENTITY_FIELDS = ("kind", "device_name", "sm_count", "capability", "kernel_hash", "schema_version")


class ShardMismatchError(RuntimeError):
    pass


def _open_text(path: Path) -> io.TextIOBase:
    path = Path(path)
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def part_files(folder: Path, kind: str) -> list[Path]:
    folder = Path(folder)
    if not folder.exists():
        return []
    return sorted(p for p in folder.iterdir()
                  if p.name.startswith(kind + "-") and (p.name.endswith(".jsonl") or p.name.endswith(".jsonl.gz")))


def read_part(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]], set[str]]:
    """(header, rows of complete units, ids of complete units). A torn tail is ignored."""
    header: dict[str, Any] | None = None
    pending: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    done: set[str] = set()
    try:
        with _open_text(path) as f:
            for lineno, line in enumerate(f):
                if not line.endswith("\n"):
                    break  # torn last line: the writer died mid-write
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    break
                if lineno == 0:
                    if rec.get("_header") is not True:
                        raise ShardMismatchError(f"{path}: first line is not a shard header")
                    header = rec
                elif "_done" in rec:
                    unit = [r for r in pending if r.get("unit") == rec["_done"]]
                    if len(unit) == rec.get("rows", -1):
                        rows.extend(unit)
                        done.add(rec["_done"])
                    pending = []
                else:
                    pending.append(rec)
    except EOFError:  # truncated gzip member
        pass
    if header is None:
        raise ShardMismatchError(f"{path}: empty or headerless shard")
    return header, rows, done


def read_dataset(folder: Path, kind: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """All complete rows of every part of one kind, and the headers. Refuses mixed identities."""
    headers, rows, seen = [], [], set()
    for path in part_files(folder, kind):
        header, part_rows, done = read_part(path)
        if headers:
            check_compatible(headers[0], header, path)
        headers.append(header)
        dup = seen & done
        if dup:
            raise ShardMismatchError(f"{path}: units also complete in another part: {sorted(dup)[:3]}")
        seen |= done
        rows.extend(part_rows)
    return rows, headers


def check_compatible(expected: dict[str, Any], got: dict[str, Any], where: Any) -> None:
    for key in IDENTITY_FIELDS:
        if expected.get(key) != got.get(key):
            raise ShardMismatchError(
                f"{where}: refusing to mix shards: {key} is {got.get(key)!r} here but {expected.get(key)!r} "
                f"in the existing dataset")


class ShardWriter:
    """Writes one new part file; resumes by skipping units already complete in the folder."""

    def __init__(self, folder: Path, kind: str, header: dict[str, Any], shard: str = "0of1") -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.kind = kind
        existing_rows, existing_headers = read_dataset(self.folder, kind)
        header = {"_header": True, "kind": kind, **header}
        for h in existing_headers:
            check_compatible(h, header, self.folder)
        self.done: set[str] = {r["unit"] for r in existing_rows}
        self.n_existing_rows = len(existing_rows)
        n = len(part_files(self.folder, kind))
        self.path = self.folder / f"{kind}-s{shard}-p{n:03d}.jsonl"
        while self.path.exists() or self.path.with_suffix(".jsonl.gz").exists():
            n += 1
            self.path = self.folder / f"{kind}-s{shard}-p{n:03d}.jsonl"
        # The part appears with its header already in it (write a temporary file, then rename): a writer
        # that dies here must not leave a headerless part that every later run refuses to read.
        line = json.dumps(header, separators=(",", ":")) + "\n"
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._f = open(self.path, "a", encoding="utf-8")

    def _write(self, records: Iterable[dict[str, Any]]) -> None:
        self._f.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))
        self._f.flush()
        os.fsync(self._f.fileno())

    def write_unit(self, unit: str, rows: list[dict[str, Any]]) -> None:
        if unit in self.done:
            raise ValueError(f"unit {unit!r} is already in the dataset")
        if not rows:
            # A resumed writer learns finished units from their rows: an empty unit would be redone.
            raise ValueError(f"unit {unit!r}: a unit needs at least one row")
        rows = [{**r, "unit": unit} for r in rows]
        self._write([*rows, {"_done": unit, "rows": len(rows)}])
        self.done.add(unit)

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def iter_rows(folder: Path, kind: str) -> Iterator[dict[str, Any]]:
    rows, _ = read_dataset(folder, kind)
    yield from rows


def cublas_times(gemm_rows: Iterable[dict[str, Any]], retimed_rows: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Problem unit -> torch.mm ms: the quiet re-time (rows of the `cublas` parts, `perfmodel gen cublas`)
    where there is one, else the time measured inside the GEMM sweep (its `cublas` rows)."""
    out = {r["unit"]: r["ms"] for r in gemm_rows if r["kind"] == "cublas" and r["status"] == "ok"}
    out.update({r["unit"]: r["ms"] for r in retimed_rows if r["status"] == "ok"})
    return out


def compress_parts(folder: Path) -> list[Path]:
    """gzip every finished .jsonl part (keeps resume working: readers take .jsonl.gz)."""
    out = []
    for p in sorted(Path(folder).glob("*.jsonl")):
        gz = p.with_suffix(".jsonl.gz")
        with open(p, "rb") as src, gzip.open(gz, "wb", compresslevel=9) as dst:
            dst.write(src.read())
        p.unlink()
        out.append(gz)
    return out
