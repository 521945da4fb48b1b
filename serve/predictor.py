"""The Predictor: ranks Triton GEMM configs, predicts cuBLAS time and decides padding (docs/design.md).

    p = Predictor.load()                        # the shipped model (models/h100), fastest backend (onnx)
    p = Predictor.load("models:/perfmodel@prod", backend="onnx")
    p.rank(GemmProblem(m=4096, n=4096, k=4096, dtype="float16"), top_k=5)

One answer per question (docs/design.md, "One answer per question"): predict, predict_many, rank, rank_many and
candidates serve one time per (problem, config) -- the gemm head of the kernel mode (the ensemble; its
config network's mode) on every config given -- so rank orders by
exactly the times predict returns and the argmin of predict over the whole space is rank's top-1. The screen
(the student scoring every config, the gemm head only its best) is a fast path a caller asks for by name,
rank(..., screened=True), and the only one whose answer can differ. cuBLAS's time (predict_cublas,
Candidates.cublas_ms) is one per problem, perfmodel.serve.decisions.cublas_time: with the call head, below the
whole space's best config exactly where the call says cuBLAS wins (the cuBLAS head's time where it agrees, the
call's implied time where not); and cuBLAS is preferred exactly where its time is below the best Triton time
shown. Every time is floored in float64 at its problem's roofline, and a problem outside the
shapes the model was trained on is warned about once per kind (perfmodel.domain).

Two backends run the same folded network: "torch" (BatchNorm and standardisation folded into plain
Linear layers, under torch.inference_mode) and "onnx" (onnxruntime sessions on the folder's
model.onnx, whose ranking and predict graphs serve both kernel modes). Each is a
perfmodel.serve.runners.Runner, which declares the heads and kernel modes it serves; `Predictor.backend`
is the runner's own name, so it always names what runs. Everything else -- feature encoding,
validation, default config spaces -- is shared, so the backends differ only in the matrix products. The
cuBLAS call and the pad rule are perfmodel.serve.decisions'. This module holds the API (load, predict, rank)
and the served times; the argument checks and Candidates are perfmodel.serve.arguments, the config caches
perfmodel.serve.config_sets (ConfigSets), the cuBLAS, candidates and pad answers perfmodel.serve.cublas_pad
(CublasAndPad), both base classes of Predictor; resolving path_or_uri and choosing the backend is
perfmodel.serve.loading. Imports neither Lightning, nor MLflow (except to resolve an MLflow URI), nor
pandas.
"""
from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np
import torch

from perfmodel.artifact import ModelBundle, inductor_head, mode_head
from perfmodel.configs import pruned_space
from perfmodel.domain import Domain, OutsideDomainWarning
from perfmodel.features import configs_tensor, problems_array, problems_tensor
from perfmodel.ranking import screened_rank, screens
from perfmodel.schema import DTYPES, GemmConfig, GemmProblem

# module objects (what a test patches there is what runs), named absolutely: `from . import` reads as an import
# of the package perfmodel.serve, whose __init__ imports the Predictor (a circle to an import checker)
import perfmodel.serve.bmm as bmm
from .arguments import (Candidates, _check_kernel, _check_problem, _check_problems, _check_rank,  # noqa: F401
                        _check_rank_many, _check_top_k)  # (Candidates and _check_top_k: importable from here, as before)
from .config_sets import ConfigSets
from .cublas_pad import CublasAndPad, _output_source
from .loading import BACKENDS, MLFLOW_SCHEMES, load_model
from .runners import KERNELS, Runner, checked

__all__ = ["BACKENDS", "KERNELS", "MLFLOW_SCHEMES", "Candidates", "Predictor"]


class Predictor(ConfigSets, CublasAndPad):
    """A loaded model. Build with Predictor.load(); every method validates its arguments, raising
    ValueError/TypeError that name the offending field, and is safe to call from many threads."""

    def __init__(self, bundle: ModelBundle, backend: str, runner: Runner, source: str, kernel: str = "autotune") -> None:
        _check_kernel(kernel)
        if kernel == "inductor" and inductor_head(bundle.heads) is None:
            raise ValueError(f"kernel: {source} has no config network and no inductor head, so it predicts only "
                             "kernel='autotune' (a build with [train].config_net = true, or `perfmodel build --only "
                             "inductor`, serves kernel='inductor')")
        if kernel == "tutorial" and mode_head(bundle.heads, kernel) is None:
            raise ValueError(f"kernel: {source} has no tutorial head, so it does not predict kernel='tutorial' "
                             "(`perfmodel build --only gemm_tutorial` fits it on the data's gemm_tutorial rows)")
        if kernel not in runner.kernels:
            raise ValueError(f"kernel: the {runner.backend} backend cannot serve kernel={kernel!r} for {source}: its "
                             f"model.onnx has no {kernel} ranking and predict graphs (exported before they existed); "
                             "re-export with `perfmodel export-onnx`, or load with backend='torch'")
        if backend != runner.backend:
            raise ValueError(f"backend: {backend!r} given with a {runner.backend} runner")
        runner.prepare(kernel)  # the mode's graphs built and checked now, not inside a call
        self.kernel = kernel
        self._static = kernel == "inductor"
        # the inductor mode of a config network (or the inductor head), or the tutorial head, ranks and predicts in
        # place of the gemm head
        self._gemm = mode_head(bundle.heads, kernel)
        self._loaded = (bundle, backend, runner, source)  # for with_kernel
        self.bundle = bundle
        self.backend = runner.backend  # what runs: every call of this Predictor goes through runner
        self.source = source
        self.device = bundle.spec.name  # the device predicted for (Predictor.load's device)
        self._run = runner
        self._encoder = bundle.encoders["gemm"]
        # The default config space per dtype: built once here, read-only afterwards (thread-safe).
        self._default_configs = {d: tuple(pruned_space(d, bundle.spec)) for d in DTYPES}
        self._default_tensors = {d: self._config_entry(configs_tensor(cfgs))
                                 for d, cfgs in self._default_configs.items()}
        self._config_cache: OrderedDict[bytes, tuple[torch.Tensor, Any, dict]] = OrderedDict()
        self._config_lock = threading.Lock()
        self._last_configs: tuple[list[GemmConfig], tuple[torch.Tensor, Any, dict]] | None = None
        # {problem: its best predicted ms over the model device's config space} (space_best_ms)
        self._space_cache: OrderedDict[GemmProblem, float] = OrderedDict()
        self._space_lock = threading.Lock()
        # rank(..., screened=True), the fast path: the screen (a screen head, or the student: ModelBundle.
        # screen_name) scores every config and the gemm head its best screen_keep per problem -- when there are
        # more than twice as many configs -- and, with a lead (an ensemble gemm head), that head's first member
        # the screen's best and the whole ensemble only its best lead_keep (perfmodel.ranking.screened_rank).
        self.screen_keep = bundle.screen_keep
        self.lead_keep = bundle.lead_keep
        # What predict, predict_many, rank, rank_many and candidates serve: the gemm head of the kernel mode (its
        # config network's inductor mode). The student
        # (perfmodel distill) serves only as the screen of the fast path.
        self.predict_head = self._gemm
        # The shapes the model was trained on, per kind of head (perfmodel.domain; None: the folder records
        # none), and the kinds already warned about (once each per Predictor).
        self.domain = Domain.of(bundle.metadata)
        self._warned: set[str] = set()

    # ------------------------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path_or_uri: str | os.PathLike | None = None, *, backend: str | None = None,
             device: str | None = None, kernel: str = "autotune") -> "Predictor":
        """Load a model folder (weights + metadata [+ model.onnx]).

        path_or_uri: None for the shipped default (models/h100, inside the installed package or the
            checkout: perfmodel.locations.default_model_dir()), a folder path, or an
        MLflow URI ("models:/name@alias", "models:/name/version", "runs:/<run id>/<path>"), downloaded
        with MLFLOW_TRACKING_URI (default sqlite:///mlflow.db).
        backend: "torch", "onnx" (onnxruntime on the folder's model.onnx), or None (default): the
            fastest one available -- onnx when onnxruntime imports and the folder has a model.onnx,
            else torch (benchmarks/serve_latency.py measures both).
        device: the device spec to predict for (e.g. "h100-sxm"), one the model was trained for; None:
            the visible GPU's when the model knows it, else the model's default device (with a warning
            when a GPU it does not know is visible). `Predictor.device` says which.
        kernel: which kernel, and which compile of it, to predict (KERNELS): "autotune" (default; the dataset's
            kernel -- Inductor's mm template body -- with Triton's default specialisation), "inductor" (the same
            template with every size and stride a constant, as Inductor compiles it; needs the model's config
            network or inductor head) or "tutorial" (the Triton tutorial's matmul as an @autotune user writes
            it; needs the model's tutorial head). Both backends serve every mode the model has (onnx: the graphs
            export-onnx writes for each); backend None picks onnx only when its file serves the mode.
        Raises FileNotFoundError for a missing model, ArtifactError (a ValueError) for a corrupt or
        mismatched one, ValueError for an unknown backend, a device the model does not know, or a kernel
        mode the model or the named backend cannot serve (saying why).
        """
        _check_kernel(kernel)  # before the load: a bad argument fails fast
        return cls(*load_model(path_or_uri, backend, device, kernel), kernel=kernel)

    def with_kernel(self, kernel: str) -> "Predictor":
        """This model (the same weights and backend, nothing reloaded) predicting for another kernel mode
        (KERNELS); self when it is this one's. ValueError when the backend cannot serve it."""
        return self if kernel == self.kernel else type(self)(*self._loaded, kernel=kernel)

    @property
    def has_static(self) -> bool:
        """Whether the model predicts kernel="inductor" (it has a config network)."""
        return inductor_head(self.bundle.heads) is not None

    # ---------------------------------------------------------------------------------- properties
    @property
    def spec(self):
        """The DeviceSpec predicted for (Predictor.device's; one the model was trained for)."""
        return self.bundle.spec

    @property
    def pad_threshold(self) -> float:
        return self.bundle.pad_threshold

    @property
    def has_cublas(self) -> bool:
        return _output_source(self.bundle, "cublas") is not None

    @property
    def has_pad(self) -> bool:
        return "pad" in self.bundle.heads

    @property
    def has_bmm(self) -> bool:
        """Whether the model predicts batched GEMMs (GemmProblem(batch > 1)): it has bmm heads."""
        return bmm.BMM in self.bundle.heads

    @property
    def has_screen(self) -> bool:
        """Whether ranking screens (a screen head, or the student serving as one: metadata "screen_head")."""
        return self.bundle.screen_name is not None

    # ---------------------------------------------------------------------------------- predicting
    @property
    def runner(self) -> Runner:
        """The Runner every call of this Predictor goes through (its backend: Predictor.backend)."""
        return self._run

    def _ms(self, head: str, x: torch.Tensor, what: str) -> np.ndarray:
        return self._checked(np.exp(self._run(head, x)), what, positive=True)

    # ------------------------------------------------------------------ the domain and the physical floor
    def as_trained(self, problems: Sequence[Any], kind: str) -> list[Any]:
        """The problems as the heads of `kind` predict them (perfmodel.domain: m, n, k below the least trained
        value raised to it), warning once per kind (per Predictor) where one is outside the trained shapes."""
        dom = self.domain
        if dom is None:
            return list(problems)
        out = []
        for p in problems:
            why = dom.outside(kind, p)
            if why and kind not in self._warned:
                self._warned.add(kind)
                import warnings

                warnings.warn(dom.message(self.source, kind, p, why), OutsideDomainWarning, stacklevel=3)
            out.append(dom.raised(kind, p) if why else p)
        return out

    def roofline_ms(self, problems: Sequence[GemmProblem]) -> np.ndarray:
        """Each problem's physical floor on the model's device (1-D float64 ms; DeviceSpec.roofline_ms):
        no time this Predictor returns is below it."""
        return self.spec.roofline_ms([p.m for p in problems], [p.n for p in problems], [p.k for p in problems],
                                     [p.dtype for p in problems], [p.allow_tf32 for p in problems],
                                     [p.batch for p in problems])

    def floored(self, problems: Sequence[GemmProblem], ms: np.ndarray) -> np.ndarray:
        """ms (P,) or (P, C) float64 floored at each problem's roofline in float64: the heads floor at a float32
        feature, whose exp can sit a rounding below it (and a raised problem's at its own)."""
        roof = self.roofline_ms(problems)
        return np.maximum(ms, roof if ms.ndim == 1 else roof[:, None])

    # ---------------------------------------------------------------------------- the served times
    def predict(self, prob: GemmProblem, configs: Sequence[GemmConfig] | None = None) -> np.ndarray:
        """Predicted milliseconds of each config on prob: 1-D float64 array, one per config.
        configs None: the pruned space of the model's device for prob.dtype. The times rank orders by: the
        gemm head of the kernel mode on every config (`Predictor.predict_head`), so the argmin is rank's
        top-1 (of ties at the floor, rank keeps the one the head scores lowest)."""
        prob = _check_problem(prob)
        if prob.batch > 1:
            return bmm.predict(self, [prob], configs)[0]
        _, ct, part, fits = self._configs(configs, prob.dtype)
        return self._unrunnable_inf(self._served([prob], ct, part, f"prob {prob}")[1], fits, [prob])[0]

    def predict_many(self, problems: Sequence[GemmProblem],
                     configs: Sequence[GemmConfig] | None = None) -> np.ndarray:
        """[len(problems), len(configs)] predicted ms, every problem with every config in one pass.
        configs None needs problems of one dtype (the default space depends on it)."""
        problems = _check_problems(problems)
        if bmm.batched(problems):
            return bmm.predict(self, problems, configs)
        _, ct, part, fits = self._configs(configs, self._common_dtype(problems, configs))
        return self._unrunnable_inf(self._served(problems, ct, part, "problems")[1], fits, problems)

    def _served(self, problems: Sequence[GemmProblem], ct: torch.Tensor, part: Any, what: str
                ) -> tuple[np.ndarray, np.ndarray]:
        """(score, ms), each (P, C) float64: the gemm head of the kernel mode on every problem with every config
        -- what predict returns and rank orders by (the score: the head's output before the floors, which
        orders a problem's configs as the times do and keeps an order among those at the floor). The same
        computation for both, so their times agree bit for bit."""
        seen = self.as_trained(problems, "gemm")
        with torch.inference_mode():  # no autograd bookkeeping on the encoder's small ops
            x = self._encoder.encode_problems_cross(seen, ct, part)  # (P * C, F)
        z, ms = self._run.served(self._gemm, x, what)
        shape = (len(problems), part.n_configs)
        return z.reshape(shape), self.floored(problems, ms.reshape(shape))


    def _best(self, problems: list[GemmProblem], ct: torch.Tensor, part: Any, k: int,
              screened: bool = False) -> tuple[list, list]:
        """The k configs predicted fastest for each problem: (indices, ms), each (P, k), fastest first, ties in
        the given order. By the served times (_served: every config scored; predict's times), or with
        screened by perfmodel.ranking.screened_rank, the fast path (the screen on every config and the gemm
        head on its best max(screen_keep, k), when there are more than twice as many configs -- or, for k <=
        lead_keep, the gemm ensemble's lead member on those and the whole ensemble on the lead's best
        lead_keep). Lists (P lists of k): every caller wants Python values, and on one problem's few values
        each numpy call costs more than the list conversion."""
        n_cfg, n_prob = part.n_configs, len(problems)  # (a tensor's shape or len() costs a few us)
        k = min(k, n_cfg)
        if not screened:
            z, ms = self._served(problems, ct, part, "problems")
            order = np.argsort(z, axis=1, kind="stable")[:, :k]
            return order.tolist(), np.take_along_axis(ms, order, 1).tolist()
        seen = self.as_trained(problems, "gemm")
        keep = max(self.screen_keep, k)
        screens_now = screens(self.has_screen, n_cfg, keep)
        if screens_now and self._run.ranks(self.kernel, keep, k):
            # onnx: the traced rule, in one call
            cand, log_ms = self._run.rank(problems_array(seen), part, self.kernel)
            # every ranked config's time finite and positive (a NaN anywhere fails), then the first k
            ms = self._checked(np.exp(log_ms.astype(np.float64)), "problems", positive=True)[:, :k]
            return cand[:, :k].tolist(), self.floored(problems, ms).tolist()
        with torch.inference_mode():
            x = self._encoder.encode_cross(problems_tensor(seen), ct, part)  # (P * C, F)
        screen = None
        if screens_now:
            screen = self._run.score(self.bundle.screen_name, x).reshape(n_prob, n_cfg)
            self._checked(screen.numpy(), "problems (screen)")

        def gemm(rows: torch.Tensor | None, lead: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
            xr = x if rows is None else x[rows]
            z, log_ms = self._run.score_log_ms(self._gemm, xr, lead)
            self._checked(z.numpy(), "problems")
            return z, log_ms

        def lead(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self._run.lead(self._gemm, x[rows])

        with torch.inference_mode():
            idx, log_ms = screened_rank(gemm, n_prob, n_cfg, screen, keep, k, lead=lead, lead_keep=self.lead_keep)
        ms = self._checked(np.exp(log_ms.numpy().astype(np.float64)), "problems", positive=True)
        return idx.tolist(), self.floored(problems, ms).tolist()

    _checked = staticmethod(checked)  # perfmodel.serve.runners.checked

    def rank(self, prob: GemmProblem, configs: Sequence[GemmConfig] | None = None,
             top_k: int = 5, *, screened: bool = False) -> list[tuple[GemmConfig, float]]:
        """The top_k configs by predicted time, fastest first: [(GemmConfig, predicted_ms)], predict's times
        and order (ties: the head's score, then the given order). Fewer when fewer configs are given.
        screened=True: the fast path -- the student screens every config and the gemm head scores its best
        screen_keep (over 100x faster over a whole space of ~1,200 configs: 0.5 against 62 ms on a 2-core CPU,
        benchmarks/studies/one_answer_latency.py; below 2 * screen_keep configs the same as screened=False). Its times are predict's, but its configs are not
        always predict's fastest: over the whole space its top-1 is predict's argmin on 91-93 % of held-out
        problems, 0.998 of its time (docs/model.md). Use it where latency matters more than that."""
        top_k, prob, screened = _check_rank(top_k, prob, screened)
        if prob.batch > 1:
            return bmm.rank(self, [prob], configs, top_k)[0]
        cfgs, ct, part, ok = self._config_rows(configs, prob.dtype, [prob])
        if ok is not None:
            return self._rank_runnable(prob, cfgs, ok[0], top_k, screened)
        idx, ms = self._best([prob], ct, part, top_k, screened)
        return [(cfgs[i], t) for i, t in zip(idx[0], ms[0])]

    def _rank_runnable(self, prob: GemmProblem, cfgs: Sequence[GemmConfig], ok: np.ndarray,
                       top_k: int, screened: bool = False) -> list[tuple[GemmConfig, float]]:
        """rank() of a list holding configs the device cannot run: the runnable ones ranked, then the
        others (inf ms, in the given order) up to top_k."""
        good = [c for c, o in zip(cfgs, ok) if o]
        out = self.rank(prob, good, top_k, screened=screened) if good else []
        return out + [(c, math.inf) for c, o in zip(cfgs, ok) if not o][: top_k - len(out)]

    def rank_many(self, problems: Sequence[GemmProblem], configs: Sequence[GemmConfig] | None = None,
                  top_k: int = 5, *, screened: bool = False) -> list[list[tuple[GemmConfig, float]]]:
        """rank() for many problems in one batched pass: one list per problem."""
        top_k, problems, screened = _check_rank_many(top_k, problems, screened)
        if bmm.batched(problems):
            return bmm.rank(self, problems, configs, top_k)
        cfgs, ct, part, ok = self._config_rows(configs, self._common_dtype(problems, configs), problems)
        if ok is not None:
            return [self._rank_runnable(p, cfgs, o, top_k, screened) for p, o in zip(problems, ok)]
        idx, ms = self._best(problems, ct, part, top_k, screened)
        return [[(cfgs[i], t) for i, t in zip(ri, rm)] for ri, rm in zip(idx, ms)]

    def __repr__(self) -> str:
        return (f"Predictor(source={self.source!r}, backend={self.backend!r}, device={self.spec.name!r}, "
                f"kernel={self.kernel!r})")
