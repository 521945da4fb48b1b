"""The two backends of perfmodel.serve.predictor.Predictor, which run the same folded network.

Both implement Runner, the interface the Predictor calls: `backend` (what Predictor.backend reports),
`heads` (the heads it scores row by row: score / score_log_ms / __call__) and `kernels` (the kernel modes
whose rank and predict it serves, KERNELS). "torch": the folded heads (BatchNorm and standardisation
folded into plain Linear layers) under torch.inference_mode, a plain Linear/ReLU chain as addmm.
"onnx": onnxruntime sessions on the folder's model.onnx -- the heads, and per kernel mode the screened
ranking graph and predict's graph (`ranks` / `predicts` say when one call serves the request) --, in
perfmodel.serve.onnx_runner, which imports this module (never the other way round).
Imports neither Lightning, nor MLflow, nor pandas, nor onnxruntime.
"""
from __future__ import annotations

import abc
import math
import os
import threading
from typing import Any

import numpy as np
import torch
from torch import nn

from perfmodel.artifact import ModelBundle, mode_head

# Intra-op threads for the torch backend: the network is small (a few hundred rows x 256 wide), so
# more threads than this mostly add synchronisation.
_SERVING_THREADS = 4


# The kernel modes a Predictor predicts for (docs/design.md, "Kernel modes"): "autotune", the canonical
# kernel with Triton's default specialisation (what a @triton.autotune user runs, and what the dataset's
# gemm rows time); "inductor", the same source compiled for one problem's shape, as Inductor compiles its
# mm template (a config network's inductor mode, or the inductor head); "tutorial", the Triton tutorial's matmul
# as an @autotune user writes it (no contiguity hints, K always masked: the tutorial head).
KERNELS = ("autotune", "inductor", "tutorial")


def model_kernels(bundle: ModelBundle) -> frozenset[str]:
    """The kernel modes a model predicts: "autotune", and "inductor" / "tutorial" where it has the head that serves
    the mode (perfmodel.artifact.mode_head)."""
    return frozenset(k for k in KERNELS if mode_head(bundle.heads, k) is not None)



def checked(values: np.ndarray, what: str, positive: bool = False) -> np.ndarray:
    """values (scores, or ms with positive=True), unchanged; RuntimeError naming `what` where one is not finite (or
    not positive). Never clamp: a non-finite prediction means the model left its valid range."""
    # a finite sum means every value is finite (a NaN or an inf makes the sum NaN or inf): one reduction on the
    # fast path, the elementwise check only when the sum is not finite
    if (not math.isfinite(values.sum()) and not np.isfinite(values).all()) or (positive and not values.min() > 0):
        raise RuntimeError(f"{what}: the model predicted a non-finite or non-positive time")
    return values

def checked_scores_ms(z: np.ndarray, ms: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    """checked(z, what) and checked(ms, what, positive=True), in one call."""
    return checked(z, what), checked(ms, what, positive=True)


class Runner(abc.ABC):
    """What the Predictor runs a model with. Rows are a head's encoded features (N, F) float32.

    backend: its name, what Predictor.backend reports. heads: the heads it scores row by row.
    kernels: the kernel modes (KERNELS) whose rank and predict it serves -- row by row (the Predictor
    encodes, ranks with perfmodel.ranking.screened_rank and adds the static head's output) or in one
    call where `ranks` / `predicts` say so. Every method is safe to call from many threads."""

    backend: str
    heads: frozenset[str]
    kernels: frozenset[str]

    @abc.abstractmethod
    def score(self, head: str, x: torch.Tensor) -> torch.Tensor:
        """PerfMLP.score of the head on x: (N,) or (N, n_outputs), before the floors."""

    @abc.abstractmethod
    def score_log_ms(self, head: str, x: torch.Tensor, lead: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """(score, log ms) of the head on x; lead: its lead member's outputs on x (lead()), or None."""

    def served(self, head: str, x: torch.Tensor, what: str) -> tuple[np.ndarray, np.ndarray]:
        """(score, ms), float64, of the head on x (score_log_ms, then exp), both checked (`checked`: finite, the
        times positive; RuntimeError naming `what` otherwise)."""
        z, log_ms = self.score_log_ms(head, x)
        return checked_scores_ms(z.numpy().astype(np.float64), np.exp(log_ms.numpy().astype(np.float64)), what)

    @abc.abstractmethod
    def __call__(self, head: str, x: torch.Tensor) -> np.ndarray:
        """log ms (float64), the head's full output."""

    def prepare(self, kernel: str) -> None:
        """Make ready what serving the kernel mode needs (the Predictor calls it when built for the mode);
        nothing by default."""

    def lead(self, head: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """PerfMLP.lead_score of the head on x: (score, outputs) of its ensemble's lead member alone."""
        raise RuntimeError(f"the {self.backend} backend runs no lead member row by row (its ranking graph does)")

    def ranks(self, kernel: str, keep: int, k: int) -> bool:
        """Whether rank() serves a screened ranking (the screen's best `keep`) of k configs for the kernel
        mode in one call."""
        return False

    def rank(self, problems: np.ndarray, part: "_ConfigPart", kernel: str) -> tuple[np.ndarray, np.ndarray]:
        """The screened ranking of problems (P, 8) float64 against a config set: (kept config indices,
        their log ms), each (P, kept), fastest first, ties in config order."""
        raise NotImplementedError(f"the {self.backend} backend has no ranking graph")

    def predicts(self, kernel: str) -> bool:
        """Whether predict() serves the kernel mode's predict in one call (encoding included)."""
        return False

    def predict(self, problems: np.ndarray, part: "_ConfigPart", kernel: str) -> np.ndarray:
        """(P, C) float32 log ms of problems (P, 8) float64 with a config set, by predict_head()."""
        raise NotImplementedError(f"the {self.backend} backend has no predict graph")


class _TorchRunner(Runner):
    """Folded heads on the CPU; torch inference is thread-safe on modules in eval mode. Serves every
    head and every kernel mode of the model, row by row.

    A folded head that is a plain chain of Linear and ReLU layers runs as addmm with in-place ReLU
    (no per-layer output allocation for the activation): ~1.5x faster than the module on a 36,800-row
    batch on the 2-core CPU, bit-identical output. An ensemble runs its GroupedNet; any other head
    runs as its module."""

    backend = "torch"

    def __init__(self, bundle: ModelBundle) -> None:
        self.modules = {name: head.for_serving().eval() for name, head in bundle.heads.items()}
        self.heads = frozenset(self.modules)
        self.kernels = model_kernels(bundle)
        for head in self.modules.values():
            head.requires_grad_(False).prepare_serving()

    def score(self, head: str, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.modules[head].serving_score(x)

    def score_log_ms(self, head: str, x: torch.Tensor, lead: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.modules[head]
        with torch.inference_mode():
            if lead is None:
                return h.serving_score_log_ms(x)
            z = h.score_with_lead(x, lead)
            return z, h.floor(z, x)

    def lead(self, head: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.inference_mode():
            return self.modules[head].lead_score(x)

    def __call__(self, head: str, x: torch.Tensor) -> np.ndarray:
        return self.score_log_ms(head, x)[1].numpy().astype(np.float64)


class _ConfigPart(tuple):
    """FeatureEncoder.config_part(configs) of a config set -- (config part, smem) -- with the numpy
    arrays the ONNX ranking graph takes for it (feeds), made once per config set, and per staged graph
    (perfmodel.serve.onnx_runner._Staged) the outputs of its config stage on them (staged, filled on first
    use)."""

    feeds: dict[str, np.ndarray]
    staged: dict[Any, dict[str, np.ndarray]]
    n_configs: int  # the set's config count, as an int (a tensor's shape costs ~1 us per call)

    @classmethod
    def of(cls, encoder: Any, ct: torch.Tensor) -> "_ConfigPart":
        part = cls(encoder.config_part(ct))
        part.n_configs = int(ct.shape[0])
        part.feeds = {"rank_configs": ct.numpy(), "rank_config_part": part[0].numpy(),
                      "rank_config_smem": part[1].numpy()}
        part.staged = {}
        return part



_threads_lock = threading.Lock()
_threads_configured = False


def _configure_torch_threads() -> None:
    """Once per process, at the first torch-backend load (never at import): cap torch's intra-op pool
    at min(4, cores) unless the caller chose a thread count through OMP_NUM_THREADS / MKL_NUM_THREADS
    or already lowered it. Call torch.set_num_threads afterwards to override."""
    global _threads_configured
    with _threads_lock:
        if _threads_configured:
            return
        _threads_configured = True
        if os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS"):
            return
        want = min(_SERVING_THREADS, os.cpu_count() or 1)
        if torch.get_num_threads() > want:
            torch.set_num_threads(want)
