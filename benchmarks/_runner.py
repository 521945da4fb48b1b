"""Running one benchmark variant in a fresh worker process (shared by the GPU hook benchmarks)."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any


def run_worker(variant: str, cmd: list[str], env: dict[str, str], res_file: Path, timeout: float) -> dict[str, Any]:
    """Run cmd (which writes its JSON result to res_file); the result with the process wall time, or an
    error row when it fails or times out, so that one variant never loses the others' results."""
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        err = {"variant": variant, "error": f"timed out after {timeout} s", "process_s": timeout}
        if res_file.is_file():  # the worker's results so far (it rewrites the file after each shape)
            try:
                return {**json.loads(res_file.read_text()), **err, "partial": True}
            except ValueError:
                pass
        return err
    wall = time.perf_counter() - t0
    if r.returncode != 0 or not res_file.is_file():
        return {"variant": variant, "error": f"worker exited {r.returncode}: {r.stderr[-2000:]}", "process_s": wall}
    res = json.loads(res_file.read_text())
    res["process_s"] = wall
    return res
