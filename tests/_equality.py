"""What the shipped model folders serve, on a fixed set of problems: a snapshot to hold a refactoring to
"behaviour unchanged".

snapshot() loads models/h100 and models/h200 (both backends, every kernel mode and device each serves) and
records, for fixed GEMM, bmm and pad problems: rank / rank_many (default space and Inductor's default list),
predict (a given list; the default space as a digest), candidates (configs, times, cublas_ms, prefer_cublas),
predict_cublas_many, prefers_cublas_many, pad and the set-up's pad decision. Every float is kept exactly
(float.hex) and every array also as a sha256 of its float64 bytes.

Two comparisons:
- exact (this machine, before against after a change): every value and digest equal, bit for bit --
      python -m tests._equality record /tmp/before.json      # on the code before the change
      python -m tests._equality compare /tmp/before.json     # on the code after it: exit 1 on any difference
- portable (tests/test_equality.py, against tests/fixtures/shipped_outputs.json recorded on another CPU):
  floats within 1e-5 relative (float32 outputs differ between CPUs by ~1e-6: tests/_tolerance.py), each
  discrete pick (a config at a ranked position, a call, a pad) equal unless the values that decide it tie
  within that tolerance.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
REL = 1e-5  # the portable comparison's float tolerance (relative)

MM = [(4096, 4096, 4096, "float16", False, False, False), (16, 4096, 4096, "float16", False, False, False),
      (2048, 3072, 768, "bfloat16", False, True, False), (64, 14336, 4096, "bfloat16", False, False, True),
      (8192, 8192, 512, "float16", False, False, False), (1000, 37, 129, "float32", False, False, False),
      (512, 512, 512, "float32", True, False, False), (3, 50257, 768, "float16", False, False, False),
      (128, 128, 8192, "bfloat16", False, False, False), (2047, 1023, 4095, "float32", True, True, True)]
BMM = [(12, 128, 128, 64, "float16"), (32, 512, 64, 512, "bfloat16"), (4, 1024, 1024, 1024, "float16"),
       (96, 197, 64, 197, "float32")]
PAD = [(4095, 1000, 1000, "bfloat16", False, False), (4096, 768, 50257, "float16", False, False),
       (1023, 1023, 1023, "float32", True, False), (8191, 4096, 77, "float16", False, True),
       (4096, 4096, 4096, "float16", False, False)]


def _h(values: Any) -> str:
    return hashlib.sha256(np.ascontiguousarray(np.asarray(values, dtype=np.float64)).tobytes()).hexdigest()


def _f(x: float) -> str:
    return float(x).hex()


def _ranked(pairs) -> dict:
    return {"configs": [str(c) for c, _ in pairs], "ms": [_f(t) for _, t in pairs]}


def _cands(c) -> dict:
    return {"configs": [str(x) for x in c.configs], "ms": [_f(t) for t in c.predicted_ms],
            "cublas_ms": None if c.cublas_ms is None else _f(c.cublas_ms), "prefer_cublas": bool(c.prefer_cublas)}


def _problems():
    from perfmodel.schema import GemmProblem, PadProblem

    mm = [GemmProblem(m=m, n=n, k=k, dtype=d, allow_tf32=t, transpose_left=tl, transpose_right=tr)
          for m, n, k, d, t, tl, tr in MM]
    bmm = [GemmProblem(m=m, n=n, k=k, dtype=d, batch=b) for b, m, n, k, d in BMM]
    pad = [PadProblem(m=m, k=k, n=n, dtype=d, transpose_left=tl, transpose_right=tr) for m, k, n, d, tl, tr in PAD]
    return mm, bmm, pad


def _one(p: Any) -> dict:
    """Everything one Predictor serves on the fixed problems."""
    from perfmodel.configs import inductor_default_configs
    from perfmodel.serve.decisions import hook_pad_decision

    mm, bmm, pad = _problems()
    given = list(inductor_default_configs())
    out: dict[str, Any] = {"mm": [], "bmm": [], "pad": []}
    for prob in mm:
        full = p.predict(prob)
        out["mm"].append({
            "problem": str(prob), "rank": _ranked(p.rank(prob, top_k=5)), "rank_given": _ranked(p.rank(prob, given, 5)),
            "predict_given": [_f(v) for v in p.predict(prob, given)],
            "predict_default": {"n": len(full), "sha256": _h(full), "min": _f(full.min()), "argmin": int(full.argmin()),
                                "sum": _f(full[np.isfinite(full)].sum())},
            "candidates": _cands(p.candidates(prob)), "candidates_given": _cands(p.candidates(prob, given))})
    out["rank_many_given"] = [_ranked(r) for r in p.rank_many(mm, given, top_k=3)]
    out["predict_many_given"] = _h(p.predict_many(mm, given))
    if p.has_cublas:
        out["cublas_ms"] = [_f(v) for v in p.predict_cublas_many(mm)]
        out["prefers_cublas"] = [bool(v) for v in p.prefers_cublas_many(mm)]
    if p.has_bmm:
        for prob in bmm:
            out["bmm"].append({"problem": str(prob), "rank": _ranked(p.rank(prob, top_k=5)),
                               "predict_default": _h(p.predict(prob)), "candidates": _cands(p.candidates(prob)),
                               "aten_ms": _f(p.predict_cublas(prob)),
                               "prefers": bool(p.prefers_cublas_many([prob])[0])})
    if p.has_pad:
        for pp in pad:
            d = p.pad(pp)
            h = hook_pad_decision(p, pp, True)
            out["pad"].append({"problem": str(pp), "should_pad": bool(d.should_pad), "orig_ms": _f(d.orig_ms),
                               "padded_ms": _f(d.padded_ms), "hook_should_pad": bool(h.should_pad)})
    return out


def snapshot(models: tuple[str, ...] = ("h100", "h200"), backends: tuple[str, ...] = ("torch", "onnx")) -> dict:
    """{"<model>/<device>/<backend>/<kernel>": _one(...)} for every mode each shipped folder serves."""
    import torch

    from perfmodel.serve.predictor import Predictor
    from perfmodel.serve.runners import KERNELS

    torch.set_num_threads(2)
    out = {}
    for model in models:
        folder = REPO / "models" / model
        for backend in backends:
            first = Predictor.load(folder, backend=backend)
            for device in first.bundle.devices:
                base = Predictor.load(folder, backend=backend, device=device)
                for kernel in [k for k in KERNELS if k in base._run.kernels]:  # every mode it serves
                    out[f"{model}/{device}/{backend}/{kernel}"] = _one(base.with_kernel(kernel))
    return out


def _close(a: str, b: str) -> bool:
    x, y = float.fromhex(a), float.fromhex(b)
    return x == y or abs(x - y) <= REL * max(abs(x), abs(y))


def _tied(ms: list[str], i: int) -> bool:
    """Whether the i-th ranked time ties a neighbour within REL (its position may swap on another CPU)."""
    return any(0 <= j < len(ms) and _close(ms[i], ms[j]) for j in (i - 1, i + 1))


def compare(want: Any, got: Any, path: str = "", exact: bool = True) -> list[str]:
    """Differences between two snapshots (or parts of them), as 'path: want != got' lines."""
    if isinstance(want, dict) and isinstance(got, dict):
        if not exact and "configs" in want and "ms" in want and set(want) >= {"configs", "ms"}:
            return _compare_ranked(want, got, path)
        if set(want) != set(got):
            return [f"{path}: keys {sorted(want)} != {sorted(got)}"]
        return [d for k in want for d in compare(want[k], got[k], f"{path}/{k}", exact)]
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{path}: length {len(want)} != {len(got)}"]
        return [d for i, (a, b) in enumerate(zip(want, got)) for d in compare(a, b, f"{path}[{i}]", exact)]
    if not exact and isinstance(want, str) and isinstance(got, str) and "0x" in want and "p" in want:
        return [] if _close(want, got) else [f"{path}: {float.fromhex(want)} != {float.fromhex(got)}"]
    if not exact and isinstance(want, str) and len(want) == 64 and path.endswith(("sha256", "_given", "default")):
        return []  # a digest of float32 outputs: exact on one machine only
    return [] if want == got else [f"{path}: {want!r} != {got!r}"]


def _compare_ranked(want: dict, got: dict, path: str) -> list[str]:
    """A ranking (portable): times within REL; the config at each position equal unless its time ties a
    neighbour's; the other fields (cublas_ms, prefer_cublas) compared as usual."""
    diffs = []
    if len(want["ms"]) != len(got["ms"]):
        return [f"{path}: {len(want['ms'])} ranked != {len(got['ms'])}"]
    for i, (a, b) in enumerate(zip(want["ms"], got["ms"])):
        if not _close(a, b):
            diffs.append(f"{path}/ms[{i}]: {float.fromhex(a)} != {float.fromhex(b)}")
        elif want["configs"][i] != got["configs"][i] and not _tied(want["ms"], i):
            diffs.append(f"{path}/configs[{i}]: {want['configs'][i]} != {got['configs'][i]}")
    rest = {k: v for k, v in want.items() if k not in ("configs", "ms")}
    return diffs + compare(rest, {k: v for k, v in got.items() if k not in ("configs", "ms")}, path, exact=False)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("record", "compare"):
        print("usage: python -m tests._equality record|compare SNAPSHOT.json", file=sys.stderr)
        return 2
    got = snapshot()
    path = Path(argv[1])
    if argv[0] == "record":
        path.write_text(json.dumps(got, indent=1, sort_keys=True))
        print(f"recorded {len(got)} predictors to {path}")
        return 0
    diffs = compare(json.loads(path.read_text()), got)
    for d in diffs[:50]:
        print(d)
    print(f"{len(got)} predictors: {len(diffs)} differences (exact)")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
