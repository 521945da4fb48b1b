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


def resolve_model(model: Path, synthetic: bool, tmp: Path, repo: Path, synthetic_label: str
                  ) -> tuple[Path, str] | None:
    """(model folder, label for the results) of a benchmark run: a random-weight model written under
    tmp with synthetic, else model (labelled relative to the repo, no machine path); None if missing."""
    if synthetic:
        from tests._synthetic import write_synthetic_model

        return write_synthetic_model(tmp / "synthetic", onnx=False), synthetic_label
    if not (model / "metadata.json").is_file():
        return None
    resolved = model.resolve()
    return model, str(resolved.relative_to(repo)) if resolved.is_relative_to(repo) else model.name


def save_results(out: Path, results: dict[str, Any], text: str) -> None:
    """Print the markdown table and write it (out with .md) next to the JSON results (out)."""
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    out.with_suffix(".md").write_text(text + "\n")
