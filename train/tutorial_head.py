"""The tutorial head: kernel="tutorial", fitted on its own (`perfmodel build --only gemm_tutorial`).

Users of the `@triton.autotune` hook write the Triton tutorial's matmul, not the dataset's kernel (Inductor's
template body with its EVEN_K and contiguity hints): on the H200 the two order configs differently on NT layouts
and odd sizes (benchmarks/studies/tutorial_kernel.py). This head is the inductor head's fit (train/inductor_head.py
fit_inductor_head: the config network on each folder's gemm rows, flag 0, and its second mode's rows, flag 1, each
mode's rows of a problem a group, split by family; the flag folded in at 1) with the second mode's rows the folders'
`gemm_tutorial` parts (`perfmodel gen static --kind gemm_tutorial`, from the tutorial study's `sweep`). A folder
without them still gives its gemm rows (TutorialSettings.plain), so a device the tutorial kernel was not timed on is
served from its own autotune-mode rows plus the difference learnt on the others. Needs Lightning, not MLflow.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from perfmodel import artifact
from perfmodel.heads.tutorial import TUTORIAL_GEMM

from .folder import settings_record
from .inductor_head import InductorSettings, fit_inductor_head, refit_mode_head

KIND = "gemm_tutorial"


@dataclass
class TutorialSettings(InductorSettings):
    """The inductor head's settings, and whether a folder without tutorial rows gives its gemm rows."""

    plain: bool = True


def tutorial_step(bundle: artifact.ModelBundle, folders: Sequence[Path], s: TutorialSettings, log: Any = print,
                  datasets: list | None = None) -> dict[str, Any]:
    """The tutorial head into bundle (TUTORIAL_GEMM, on the gemm encoder), metadata "tutorial_metrics" and
    "tutorial_settings"; returns the metrics."""
    head, metrics = fit_inductor_head(bundle, folders, s, log, datasets, kind=KIND, what="tutorial-head",
                                      plain=s.plain)
    bundle.heads[TUTORIAL_GEMM] = head
    bundle.encoders[TUTORIAL_GEMM] = bundle.encoders["gemm"]
    bundle.metadata = {**bundle.metadata, "tutorial_metrics": metrics, "tutorial_settings": settings_record(s)}
    return metrics


def refit_tutorial(s: TutorialSettings, model: Path, data: Sequence[Path], log: Any = print,
                   command: str = "") -> dict[str, Any]:
    """`perfmodel build --only gemm_tutorial`: the tutorial head of the folder `model` on the data folders (one per
    device of the model, in its order), added in place."""
    return refit_mode_head(tutorial_step, "tutorial-head", s, model, data, log, command)


__all__ = ["TutorialSettings", "refit_tutorial", "tutorial_step"]
