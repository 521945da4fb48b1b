"""The flow of one call through the layers (docs/architecture.md, "One call through the layers"): which of the
project's modules a call enters, and how often, traced with sys.setprofile on the shipped models/h100 (CPU)."""
from __future__ import annotations

import collections
import sys
import warnings
from pathlib import Path

import pytest

from perfmodel import GemmProblem, Predictor
from perfmodel.configs import pruned_space

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("perfmodel", "serve", "train", "data_gen")


def _module(path: str) -> str | None:
    """The project module (folder/file.py) a code object's file is, or None (torch, numpy, this test)."""
    try:
        rel = Path(path).resolve().relative_to(REPO)
    except ValueError:
        return None
    return str(rel) if rel.parts[0] in PACKAGES else None


def entries(fn) -> tuple[collections.Counter, list[tuple[str, str]]]:
    """Run fn; count each project module's entries: a call into it whose nearest project caller is another module
    (or none: the call under test). The entries in order, as (module, function)."""
    count: collections.Counter = collections.Counter()
    order: list[tuple[str, str]] = []

    def profile(frame, event, arg):
        if event != "call":
            return
        mod = _module(frame.f_code.co_filename)
        if mod is None:
            return
        caller = frame.f_back
        while caller is not None and _module(caller.f_code.co_filename) is None:
            caller = caller.f_back
        if caller is None or _module(caller.f_code.co_filename) != mod:
            count[mod] += 1
            order.append((mod, frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count, order


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_rank_enters_each_module_once(backend):
    """Predictor.rank of one problem on a config list: every module it uses entered once, in the documented order."""
    p = Predictor.load(REPO / "models" / "h100", backend=backend)
    prob = GemmProblem(m=1000, n=3000, k=777, dtype="bfloat16")
    cfgs = pruned_space("bfloat16", p.spec)[:50]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p.rank(prob, cfgs)  # the config list's cache filled: what every later call finds
        count, order = entries(lambda: p.rank(prob, cfgs, top_k=3))
    assert max(count.values()) == 1, count
    runner = ["serve/onnx_runner.py"] if backend == "onnx" else ["perfmodel/model.py", "perfmodel/ensemble.py"]
    assert [m for m, _ in order] == ["serve/predictor.py", "serve/arguments.py", "serve/config_sets.py",
                                     "perfmodel/schema.py", "perfmodel/domain.py", "perfmodel/features.py",
                                     "serve/runners.py", *runner, "perfmodel/devices.py"]
