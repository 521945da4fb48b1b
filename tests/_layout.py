"""A model folder in the layout from before the problem network -- separate cublas (and call) heads -- made
from a shipped folder, for the tests of the head-by-head refits (`perfmodel cublas-head`, `call-head`), which
refuse a folder with a problem network (the shipped ones have it now).

The copy keeps every other head as shipped; its cublas head is a placeholder of random weights (8 wide, one
member) until a test refits it: what such a test checks is the refit, not the placeholder's predictions."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from perfmodel import artifact, onnx_export
from perfmodel.model import PerfMLP


def old_layout_copy(src: Path, dst: Path) -> Path:
    """dst: src's folder with its problem network replaced by a placeholder cublas head (no call heads)."""
    bundle = artifact.load(Path(src))
    if artifact.PROBLEM not in bundle.heads:
        raise ValueError(f"model: {src} has no problem network (it is in the old layout already)")
    problem = bundle.heads.pop(artifact.PROBLEM)
    bundle.encoders["cublas"] = bundle.encoders.pop(artifact.PROBLEM)
    torch.manual_seed(0)
    bundle.heads["cublas"] = PerfMLP(replace(problem.cfg, hidden=(8,), members=1, n_outputs=1,
                                             floor_features=problem.cfg.floor_features[:1]))
    for key in ("problem_outputs", "problem_settings"):
        bundle.metadata.pop(key, None)
    artifact.save(bundle, Path(dst))
    onnx_export.export_onnx_all(bundle, Path(dst))
    card = Path(src) / "MODEL_CARD.md"
    if card.is_file():
        (Path(dst) / "MODEL_CARD.md").write_text(card.read_text())
    assert "problem" not in json.loads((Path(dst) / "metadata.json").read_text())["heads"]
    return Path(dst)
