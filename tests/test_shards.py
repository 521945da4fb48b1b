"""Crash-safe, append-only dataset shards (data_gen/shards.py)."""
from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from perfmodel.data_gen.shards import (IDENTITY_FIELDS, ShardMismatchError, ShardWriter, compress_parts, iter_rows,
                             part_files, read_dataset, read_part)

HEADER = {"device_name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "capability": "9.0",
          "kernel_hash": "0123456789abcdef", "schema_version": 1, "torch": "2.11.0"}


def unit_rows(unit: str, n: int, payload: int = 8) -> list[dict]:
    """Rows whose content can be checked after a crash: each row says which unit and index it is."""
    return [{"i": i, "check": f"{unit}:{i}", "payload": unit[-1] * payload} for i in range(n)]


def by_unit(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        out[r["unit"]].append(r)
    return out


def assert_units_intact(rows: list[dict], rows_per_unit: int, payload: int) -> None:
    """Every unit present is complete, each row once, no row torn or from another unit."""
    for unit, urows in by_unit(rows).items():
        assert sorted(r["i"] for r in urows) == list(range(rows_per_unit)), unit
        for r in urows:
            assert r["check"] == f"{unit}:{r['i']}"
            assert r["payload"] == unit[-1] * payload
    keys = [(r["unit"], r["i"]) for r in rows]
    assert len(keys) == len(set(keys)), "duplicate rows"


# ---- a writer killed by SIGKILL, then resumed ----

CHILD = textwrap.dedent("""
    import sys, time
    from perfmodel.data_gen.shards import ShardWriter

    class TearingFile:
        # Stalls in the middle of a unit's write, so that the kill lands inside the unit: what a short
        # write() or a buffered flush of a large unit leaves behind when the process dies.
        def __init__(self, f):
            self.f = f
        def write(self, s):
            # stall half-way: complete rows of the unit, then a torn one, then nothing (no marker)
            half = len(s) // 2
            self.f.write(s[:half])
            self.f.flush()
            print("WRITING", flush=True)
            time.sleep(30)
            self.f.write(s[half:])
            return len(s)
        def flush(self):
            self.f.flush()
        def fileno(self):
            return self.f.fileno()
        def close(self):
            self.f.close()

    folder, n_units, rows_per_unit, payload, tear_at = sys.argv[1], *map(int, sys.argv[2:6])
    sleep = float(sys.argv[6])
    header = {"device_name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "capability": "9.0",
              "kernel_hash": "0123456789abcdef", "schema_version": 1, "torch": "2.11.0"}
    w = ShardWriter(folder, "gemm", header)
    print("START", len(w.done), w.path.name, flush=True)
    written = 0
    for u in range(n_units):
        unit = f"u{u:04d}"
        if unit in w.done:
            continue
        if written == tear_at:
            w._f = TearingFile(w._f)
        w.write_unit(unit, [{"i": i, "check": f"{unit}:{i}", "payload": unit[-1] * payload}
                            for i in range(rows_per_unit)])
        written += 1
        print("DONE", unit, flush=True)
        if sleep:
            time.sleep(sleep)
    w.close()
    print("END", flush=True)
""")

N_UNITS, ROWS, PAYLOAD = 30, 20, 3000


def run_child(folder: Path, repo_root: Path, kill_after: int | None = None, tear_at: int = -1,
              sleep: float = 0.0) -> tuple[list[str], int]:
    """Start a writer process and SIGKILL it once `kill_after` units are reported done, or once it is
    inside the write of unit number `tear_at`. Returns (units reported done, exit status)."""
    env = {**os.environ, "PYTHONPATH": str(repo_root), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(folder), str(N_UNITS), str(ROWS), str(PAYLOAD),
                             str(tear_at), str(sleep)], stdout=subprocess.PIPE, text=True, env=env, cwd=repo_root)
    done: list[str] = []
    try:
        for line in proc.stdout:
            if line.startswith("DONE"):
                done.append(line.split()[1])
            if (line.startswith("WRITING")
                    or (line.startswith("DONE") and kill_after is not None and len(done) >= kill_after)):
                os.kill(proc.pid, signal.SIGKILL)
                break
    finally:
        proc.stdout.close()
        rc = proc.wait(timeout=60)
    return done, rc


def test_sigkill_then_resume(tmp_path, repo_root):
    folder = tmp_path / "ds"
    # Run 1: killed in the middle of writing its 6th unit.
    done1, rc1 = run_child(folder, repo_root, tear_at=5)
    assert rc1 == -signal.SIGKILL
    assert done1 == [f"u{u:04d}" for u in range(5)]
    (part1,) = part_files(folder, "gemm")
    raw = part1.read_text()
    assert not raw.endswith("\n") and '"u0005:3"' in raw, "the kill did not land inside unit u0005"
    assert '"_done":"u0005"' not in raw
    rows, headers = read_dataset(folder, "gemm")
    assert len(headers) == 1 and headers[0]["device_name"] == HEADER["device_name"]
    assert_units_intact(rows, ROWS, PAYLOAD)
    units1 = set(by_unit(rows))
    assert units1 == set(done1), "the torn unit must not count, the finished ones must"

    # Run 2: resumes in a new part; killed again, at whatever point it has reached.
    done2, rc2 = run_child(folder, repo_root, kill_after=4, sleep=0.01)
    assert rc2 == -signal.SIGKILL
    assert done2[:4] == [f"u{u:04d}" for u in range(5, 9)], "the resumed writer must start at the torn unit"
    rows, headers = read_dataset(folder, "gemm")
    assert len(headers) == 2
    assert_units_intact(rows, ROWS, PAYLOAD)
    units2 = set(by_unit(rows))
    assert units1 | set(done2) <= units2
    assert units2 == {f"u{u:04d}" for u in range(len(units2))}

    # Run 3: finishes.
    done3, rc3 = run_child(folder, repo_root)
    assert rc3 == 0
    assert not set(done3) & units2, "a finished unit was measured again"
    rows, headers = read_dataset(folder, "gemm")
    assert len(headers) == 3 and len(part_files(folder, "gemm")) == 3
    assert_units_intact(rows, ROWS, PAYLOAD)
    counts = Counter(r["unit"] for r in rows)
    assert set(counts) == {f"u{u:04d}" for u in range(N_UNITS)}
    assert set(counts.values()) == {ROWS}
    assert len(rows) == N_UNITS * ROWS

    # A fourth writer finds nothing left to do.
    w = ShardWriter(folder, "gemm", HEADER)
    assert w.done == set(counts) and w.n_existing_rows == N_UNITS * ROWS
    w.close()


# ---- torn and incomplete units ----

def write_units(folder: Path, units: list[str], n: int = 3, header: dict = HEADER, kind: str = "gemm") -> Path:
    with ShardWriter(folder, kind, header) as w:
        for u in units:
            w.write_unit(u, unit_rows(u, n))
    return w.path


def test_torn_last_line_ignored(tmp_path):
    path = write_units(tmp_path, ["u0", "u1"])
    with open(path, "a") as f:
        # rows of u2 without their marker, then half a JSON line without a newline
        for r in unit_rows("u2", 2):
            f.write(json.dumps({**r, "unit": "u2"}) + "\n")
        f.write('{"i": 2, "check": "u2:2", "payl')
    header, rows, done = read_part(path)
    assert header["device_name"] == HEADER["device_name"] and header["_header"] is True
    assert done == {"u0", "u1"}
    assert len(rows) == 6 and {r["unit"] for r in rows} == {"u0", "u1"}

    # the resumed writer redoes u2 only, in a new part
    w = ShardWriter(tmp_path, "gemm", HEADER)
    assert w.done == {"u0", "u1"}
    assert w.path != path
    w.write_unit("u2", unit_rows("u2", 3))
    w.close()
    rows, headers = read_dataset(tmp_path, "gemm")
    assert len(headers) == 2
    assert Counter(r["unit"] for r in rows) == {"u0": 3, "u1": 3, "u2": 3}
    assert_units_intact(rows, 3, 8)


def test_torn_complete_json_without_newline_ignored(tmp_path):
    # A whole marker written but not its newline: the writer died mid-write, the unit does not count.
    path = write_units(tmp_path, ["u0"])
    with open(path, "a") as f:
        for r in unit_rows("u1", 3):
            f.write(json.dumps({**r, "unit": "u1"}) + "\n")
        f.write(json.dumps({"_done": "u1", "rows": 3}))
    _, rows, done = read_part(path)
    assert done == {"u0"} and {r["unit"] for r in rows} == {"u0"}


def test_marker_with_wrong_row_count_not_counted(tmp_path):
    path = write_units(tmp_path, ["u0"])
    with open(path, "a") as f:
        for r in unit_rows("u1", 2):
            f.write(json.dumps({**r, "unit": "u1"}) + "\n")
        f.write(json.dumps({"_done": "u1", "rows": 3}) + "\n")
        for r in unit_rows("u2", 2):
            f.write(json.dumps({**r, "unit": "u2"}) + "\n")
        f.write(json.dumps({"_done": "u2", "rows": 2}) + "\n")
    _, rows, done = read_part(path)
    assert done == {"u0", "u2"}
    assert Counter(r["unit"] for r in rows) == {"u0": 3, "u2": 2}


def test_units_written_once(tmp_path):
    with ShardWriter(tmp_path, "gemm", HEADER) as w:
        w.write_unit("u0", unit_rows("u0", 2))
        with pytest.raises(ValueError, match="u0"):
            w.write_unit("u0", unit_rows("u0", 2))
    w = ShardWriter(tmp_path, "gemm", HEADER)
    with pytest.raises(ValueError, match="u0"):
        w.write_unit("u0", unit_rows("u0", 2))
    w.close()
    rows, _ = read_dataset(tmp_path, "gemm")
    assert len(rows) == 2


def test_empty_unit_cannot_brick_resume(tmp_path):
    # A unit with no rows would be complete on disk but absent from a resumed writer's `done` (which is
    # built from rows): it would be written again, and the dataset would then refuse to load.
    with ShardWriter(tmp_path, "gemm", HEADER) as w:
        with pytest.raises(ValueError, match="at least one row"):
            w.write_unit("empty", [])
    w = ShardWriter(tmp_path, "gemm", HEADER)
    assert "empty" not in w.done  # refused, so nothing of it was written
    w.write_unit("empty", unit_rows("empty", 1))
    w.close()
    rows, _ = read_dataset(tmp_path, "gemm")
    assert all(r["unit"] == "empty" for r in rows)


def test_duplicate_unit_across_parts_refused(tmp_path):
    write_units(tmp_path, ["u0"])
    # a hand-made second part repeating u0 (never made by ShardWriter)
    other = tmp_path / "gemm-s00of01-p009.jsonl"
    other.write_text(json.dumps({"_header": True, "kind": "gemm", **HEADER}) + "\n"
                     + "".join(json.dumps({**r, "unit": "u0"}) + "\n" for r in unit_rows("u0", 3))
                     + json.dumps({"_done": "u0", "rows": 3}) + "\n")
    with pytest.raises(ShardMismatchError, match="u0"):
        read_dataset(tmp_path, "gemm")


def test_writer_dying_before_its_header_leaves_folder_usable(tmp_path):
    # The header cannot be serialised: the writer fails while creating its part. The folder must not
    # be left with a headerless part that makes every later run refuse to start.
    bad = {**HEADER, "torch": object()}
    with pytest.raises(TypeError):
        ShardWriter(tmp_path, "gemm", bad)
    for p in part_files(tmp_path, "gemm"):
        read_part(p)  # none headerless
    path = write_units(tmp_path, ["u0"])
    rows, headers = read_dataset(tmp_path, "gemm")
    assert len(rows) == 3 and len(headers) == 1
    assert path.exists()


def test_headerless_part_refused(tmp_path):
    path = tmp_path / "gemm-s00of01-p000.jsonl"
    path.write_text(json.dumps({"i": 0, "unit": "u0"}) + "\n")
    with pytest.raises(ShardMismatchError, match="header"):
        read_part(path)


# ---- identity: a resumed run refuses to mix devices or kernels ----

@pytest.mark.parametrize("field,value", [
    ("device_name", "NVIDIA H200"), ("sm_count", 114), ("kernel_hash", "fedcba9876543210"),
    ("capability", "8.0"), ("schema_version", 2),
])
def test_resume_with_other_identity_refused(tmp_path, field, value):
    assert field in IDENTITY_FIELDS
    write_units(tmp_path, ["u0"])
    before = part_files(tmp_path, "gemm")
    with pytest.raises(ShardMismatchError, match=field):
        ShardWriter(tmp_path, "gemm", {**HEADER, field: value})
    assert part_files(tmp_path, "gemm") == before, "a refused writer must not create a part"


def test_non_identity_fields_may_differ(tmp_path):
    write_units(tmp_path, ["u0"])
    w = ShardWriter(tmp_path, "gemm", {**HEADER, "torch": "2.12.0", "sweep": {"seed": 1}})
    assert w.done == {"u0"}
    w.close()


def test_read_dataset_refuses_mixed_parts(tmp_path):
    write_units(tmp_path, ["u0"])
    other = tmp_path / "gemm-s01of02-p000.jsonl"
    other.write_text(json.dumps({"_header": True, "kind": "gemm", **HEADER, "sm_count": 114}) + "\n")
    with pytest.raises(ShardMismatchError, match="sm_count"):
        read_dataset(tmp_path, "gemm")


def test_kinds_are_separate(tmp_path):
    write_units(tmp_path, ["u0", "u1"], kind="gemm")
    write_units(tmp_path, ["p0"], kind="pad", header={**HEADER, "kernel_hash": "other"})
    gemm, _ = read_dataset(tmp_path, "gemm")
    pad, pad_headers = read_dataset(tmp_path, "pad")
    assert {r["unit"] for r in gemm} == {"u0", "u1"}
    assert {r["unit"] for r in pad} == {"p0"}
    assert pad_headers[0]["kind"] == "pad"
    assert read_dataset(tmp_path / "missing", "gemm") == ([], [])


# ---- compression ----

def test_compress_parts_roundtrip_and_resume(tmp_path):
    write_units(tmp_path, ["u0", "u1"])
    write_units(tmp_path, ["u2"])
    write_units(tmp_path, ["p0"], kind="pad")
    before_gemm = read_dataset(tmp_path, "gemm")
    before_pad = read_dataset(tmp_path, "pad")
    gz = compress_parts(tmp_path)
    assert len(gz) == 3
    assert all(p.name.endswith(".jsonl.gz") and p.exists() for p in gz)
    assert not list(tmp_path.glob("*.jsonl")), "the uncompressed parts are removed"
    for p in gz:
        with gzip.open(p, "rt") as f:
            assert json.loads(f.readline())["_header"] is True
    assert read_dataset(tmp_path, "gemm") == before_gemm
    assert read_dataset(tmp_path, "pad") == before_pad
    assert list(iter_rows(tmp_path, "gemm")) == before_gemm[0]

    # resuming on compressed parts: done units are known, the new part does not clash with a .gz one
    w = ShardWriter(tmp_path, "gemm", HEADER)
    assert w.done == {"u0", "u1", "u2"}
    assert w.path.suffix == ".jsonl" and not w.path.with_suffix(".jsonl.gz").exists()
    w.write_unit("u3", unit_rows("u3", 3))
    w.close()
    rows, headers = read_dataset(tmp_path, "gemm")
    assert len(headers) == 3
    assert Counter(r["unit"] for r in rows) == {"u0": 3, "u1": 3, "u2": 3, "u3": 3}


def test_truncated_gzip_keeps_complete_units(tmp_path):
    with ShardWriter(tmp_path, "gemm", HEADER) as w:
        for u in range(50):
            w.write_unit(f"u{u:02d}", unit_rows(f"u{u:02d}", 4, payload=200))
    (gz,) = compress_parts(tmp_path)
    data = gz.read_bytes()
    gz.write_bytes(data[: len(data) * 2 // 3])
    header, rows, done = read_part(gz)
    assert header["kind"] == "gemm"
    assert 0 < len(done) < 50
    assert done == {f"u{u:02d}" for u in range(len(done))}
    assert_units_intact(rows, 4, 200)


def test_cublas_times_prefer_the_quiet_retime():
    from perfmodel.data_gen.shards import cublas_times

    gemm = [{"unit": "a", "kind": "cublas", "status": "ok", "ms": 0.2},
            {"unit": "b", "kind": "cublas", "status": "ok", "ms": 0.3},
            {"unit": "a", "kind": "triton", "status": "ok", "ms": 0.1},
            {"unit": "c", "kind": "cublas", "status": "fail:wrong_result", "ms": 0.4}]
    retimed = [{"unit": "a", "kind": "cublas", "status": "ok", "ms": 0.05},
               {"unit": "b", "kind": "cublas", "status": "fail:wrong_result", "ms": 9.0}]
    assert cublas_times(gemm, retimed) == {"a": 0.05, "b": 0.3}
    assert cublas_times(gemm, []) == {"a": 0.2, "b": 0.3}
