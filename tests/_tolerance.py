"""How close a figure recomputed here must come to the figure stored when the model was fitted (on another
machine), for figures computed through float32 networks.

float32 network outputs differ between CPUs by about 1e-6 relative: the matmul kernels' blocking and SIMD
width change the order of the sums. A figure that averages such outputs moves by as much; a figure that
counts or picks by them (an accuracy, a share within 10 %, a top-1 pick) changes only where two
predictions tie within that rounding, one item at a time. Each helper states the tolerance it allows;
every one is far below what a change of the weights, the data or a rule moves the figure by.

A test module imports this as tests._tolerance (the repo root is on sys.path, see conftest.py).
"""
from __future__ import annotations

import math

import pytest

# A mean of float32 outputs (a mean |log error|, a MAPE): 1e-4 relative, a hundred times the CPU-to-CPU
# difference of the outputs themselves.
MEAN_REL = 1e-4


def mean_of_outputs(stored: float):
    """pytest.approx for a mean of float32 network outputs (MEAN_REL relative)."""
    return pytest.approx(stored, rel=MEAN_REL, abs=1e-9)


def share(stored: float, n: int, flips: int = 1):
    """pytest.approx for a share of n items decided by float32 outputs (an accuracy, the share within
    10 %): `flips` items may come out the other way on another CPU (predictions tied within rounding)."""
    assert n > 0
    return pytest.approx(stored, abs=flips / n + 1e-12)


def geomean_one_flip(stored: float, n: int, worst: float, printed: float = 0.0):
    """pytest.approx for a geomean over n problems of per-problem efficiencies (top-1 / top-5 efficiency)
    picked by float32 predictions: one problem's pick may flip between two configs predicted within
    rounding of each other; its efficiency may then move by as much as the worst problem's loss (`worst`,
    the lowest per-problem efficiency of the figure), which moves the geomean by a factor of at most
    worst ** (-1 / n). printed: half the last digit of a figure stored rounded (5e-5 for 4 decimals)."""
    assert n > 0 and 0 < worst <= 1
    return pytest.approx(stored, rel=math.expm1(-math.log(worst) / n) + 1e-12, abs=printed + 1e-12)


def efficiency(stored: float, got: dict, key: str, modes):
    """geomean_one_flip for an efficiency figure `key` ("<group>/top1_eff" or "<group>/top5_eff", as
    train/evaluate.py's summarize names them) of the dict `got` recomputed here, over problems of dtype
    modes `modes` (one per problem): n is the group's problem count, worst its lowest per-problem
    efficiency (summarize's "<mode>/worst_top1" / "/worst_top5")."""
    import numpy as np

    group, figure = key.split("/")
    k = figure.split("_")[0]  # top1 / top5
    members = {"all": ("all",), "fp32_all": ("float32", "tf32")}.get(group, (group,))
    modes = np.asarray(modes)
    n = len(modes) if members == ("all",) else int(np.isin(modes, members).sum())
    worst = min(got[f"{m}/worst_{k}"] for m in members if f"{m}/worst_{k}" in got)
    return geomean_one_flip(stored, n, worst)
