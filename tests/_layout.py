"""A model folder whose problem network has one output, torch.mm's time, and no call outputs -- what a build
without a [problem] step writes -- made from a shipped folder, for the tests of the cuBLAS call without call
outputs (prefer_cublas then compares the cuBLAS time with the best config's).

The copy keeps every other head as shipped; its problem network is a placeholder of random weights (8 wide, one
member, one output): what such a test checks is the call made from the times, not the placeholder's predictions."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from perfmodel import artifact, onnx_export
from perfmodel.model import PerfMLP


def cublas_only_copy(src: Path, dst: Path) -> Path:
    """dst: src's folder with its problem network replaced by a placeholder of one output, cublas (no call outputs)."""
    bundle = artifact.load(Path(src))
    if artifact.PROBLEM not in bundle.heads:
        raise ValueError(f"model: {src} has no problem network")
    problem = bundle.heads[artifact.PROBLEM]
    torch.manual_seed(0)
    bundle.heads[artifact.PROBLEM] = PerfMLP(replace(problem.cfg, hidden=(8,), members=1, n_outputs=1,
                                                     floor_features=problem.cfg.floor_features[:1]))
    bundle.metadata = {**bundle.metadata, "problem_outputs": ["cublas"]}
    bundle.metadata.pop("problem_settings", None)
    artifact.save(bundle, Path(dst))
    onnx_export.export_onnx_all(bundle, Path(dst))
    card = Path(src) / "MODEL_CARD.md"
    if card.is_file():
        (Path(dst) / "MODEL_CARD.md").write_text(card.read_text())
    assert json.loads((Path(dst) / "metadata.json").read_text())["problem_outputs"] == ["cublas"]
    return Path(dst)
