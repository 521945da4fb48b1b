"""The Predictor: ranks Triton GEMM configs, predicts cuBLAS time and decides padding (docs/design.md).

    p = Predictor.load()                        # the shipped model (models/h100), fastest backend (onnx)
    p = Predictor.load("models:/perfmodel@prod", backend="onnx")
    p.rank(GemmProblem(m=4096, n=4096, k=4096, dtype="float16"), top_k=5)

One answer per question (docs/design.md, "One answer per question"): predict, predict_many, rank, rank_many and
candidates serve one time per (problem, config) -- the gemm head of the kernel mode (the ensemble; its
config network's mode, or with a static head its output added) on every config given -- so rank orders by
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
cuBLAS call and the pad rule are perfmodel.serve.decisions'. This module holds the API, its argument
validation and the config caches; resolving path_or_uri and choosing the backend is
perfmodel.serve.loading. Imports neither Lightning, nor MLflow (except to resolve an MLflow URI), nor
pandas.
"""
from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from perfmodel.artifact import (CALL, CALL_STATIC, INDUCTOR_GEMM, PROBLEM, STATIC, ModelBundle, inductor_head,
                                problem_columns, problem_output, with_static)
from perfmodel.configs import pruned_space, runnable
from perfmodel.domain import Domain, OutsideDomainWarning, roofline_ms
from perfmodel.features import configs_tensor, pad_tensor, problems_array, problems_tensor
from perfmodel.ranking import screened_rank, screens
from perfmodel.schema import DTYPE_BYTES, DTYPES, GemmConfig, GemmProblem, PadDecision, PadProblem

from . import bmm, decisions
from .loading import BACKENDS, MLFLOW_SCHEMES, load_model
from .runners import KERNELS, Runner, _ConfigPart, checked

__all__ = ["BACKENDS", "KERNELS", "MLFLOW_SCHEMES", "Candidates", "Predictor"]

# Config sets whose tensor and config-only encoding are kept (autotuners rank one list for many shapes).
_CONFIG_CACHE_SIZE = 32
# Problems whose best predicted time over the whole config space is kept (what cuBLAS's time is implied from:
# a whole-model compile asks about one shape for each of its layers).
_SPACE_CACHE_SIZE = 4096
# Problems scored over the whole space in one batch (64 x 1,206 configs: ~15 MB of features)
_SPACE_CHUNK = 64


@dataclass(frozen=True)
class Candidates:
    """What to benchmark for one problem: the model's best configs, widened while they are too close
    to call, and the predicted cuBLAS (torch.mm) time.

    configs / predicted_ms: fastest first (predict's times). cublas_ms: Predictor.predict_cublas (with the
    model's call head for the kernel mode, below the whole space's best config exactly where the call says
    cuBLAS wins: perfmodel.serve.decisions.cublas_time), or None when the model has no cuBLAS head.
    prefer_cublas: cublas_ms below predicted_ms[0], the best config shown (perfmodel.serve.decisions.
    cublas_preferred: the one rule of the CLI, the API and the hooks), so a caller may skip compiling Triton
    altogether. With the call head this is its call against the whole space (below 0: cuBLAS), and against
    a config list of the caller's also wherever cuBLAS beats the list's best.
    For a bmm (batch > 1): the model's bmm heads -- Inductor's bmm template configs, aten::bmm's time as
    cublas_ms (the bmm call head's implied time), the same rule (perfmodel.serve.bmm).
    """

    configs: tuple[GemmConfig, ...]
    predicted_ms: tuple[float, ...]
    cublas_ms: float | None
    prefer_cublas: bool

    @property
    def best_ms(self) -> float:
        return self.predicted_ms[0]


def _check_top_k(top_k: Any, name: str = "top_k") -> int:
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, got {type(top_k).__name__} ({top_k!r})")
    if top_k < 1:
        raise ValueError(f"{name}: must be >= 1, got {top_k}")
    return int(top_k)


def _check_flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__} ({value!r})")
    return value


def _check_kernel(kernel: Any) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {', '.join(KERNELS)}, got {kernel!r}")


def _check_problem(prob: Any, name: str = "prob") -> GemmProblem:
    if not isinstance(prob, GemmProblem):
        raise TypeError(f"{name}: expected a GemmProblem, got {type(prob).__name__}")
    return prob  # batch > 1 (a bmm) goes to the model's bmm heads (perfmodel.serve.bmm)


def _check_problems(problems: Any) -> list[GemmProblem]:
    """A non-empty sequence of GemmProblem, as a list; errors name the offending element."""
    if isinstance(problems, GemmProblem) or not isinstance(problems, Iterable):
        raise TypeError(f"problems: expected a sequence of GemmProblem, got {type(problems).__name__}")
    problems = list(problems)
    if not problems:
        raise ValueError("problems: empty; pass at least one GemmProblem")
    for i, p in enumerate(problems):
        _check_problem(p, f"problems[{i}]")
    return problems


class _Fits(dict):
    """{dtype size: (C,) bool, which configs of a set the device can run}, and the sizes for which it
    can run them all (checked once per config set, not per call)."""

    def __init__(self, masks: dict[int, np.ndarray]) -> None:
        super().__init__(masks)
        self.all_runnable = frozenset(b for b, m in masks.items() if m.all())


class Predictor:
    """A loaded model. Build with Predictor.load(); every method validates its arguments, raising
    ValueError/TypeError that name the offending field, and is safe to call from many threads."""

    def __init__(self, bundle: ModelBundle, backend: str, runner: Runner, source: str, kernel: str = "autotune") -> None:
        _check_kernel(kernel)
        if kernel == "inductor" and inductor_head(bundle.heads) is None:
            raise ValueError(f"kernel: {source} has no static head or config network, so it predicts only "
                             "kernel='autotune' (perfmodel static-head adds a static head)")
        if kernel not in runner.kernels:
            raise ValueError(f"kernel: the {runner.backend} backend cannot serve kernel={kernel!r} for {source}: its "
                             f"model.onnx has no {kernel} ranking and predict graphs (exported before they existed); "
                             "re-export with `perfmodel export-onnx`, or load with backend='torch'")
        if backend != runner.backend:
            raise ValueError(f"backend: {backend!r} given with a {runner.backend} runner")
        runner.prepare(kernel)  # the mode's graphs built and checked now, not inside a call
        self.kernel = kernel
        self._static = kernel == "inductor"
        # the inductor mode of a config network ranks and predicts in place of the gemm head; a static head's
        # output is added to the gemm head's (perfmodel.artifact.inductor_head)
        self._gemm = INDUCTOR_GEMM if self._static and inductor_head(bundle.heads) == INDUCTOR_GEMM else "gemm"
        self._adds_static = self._static and self._gemm == "gemm"
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
        # config network's inductor mode, or the gemm head with the static head's output added). The student
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
        kernel: which compile of the kernel to predict (KERNELS): "autotune" (default; Triton's default
            specialisation, as a @triton.autotune user's kernel) or "inductor" (every size and stride a
            constant, as Inductor compiles its mm template; needs the model's static head or config
            network). Both backends serve both modes (onnx: the graphs export-onnx writes for each);
            backend None picks onnx only when its file serves the mode.
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
        """Whether the model predicts kernel="inductor" (it has a static head or a config network)."""
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

    def default_configs(self, dtype: str) -> tuple[GemmConfig, ...]:
        """The model device's pruned config space for a dtype (the configs used when none are given)."""
        if dtype not in self._default_configs:
            raise ValueError(f"dtype: unsupported dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
        return self._default_configs[dtype]

    # ---------------------------------------------------------------------------------- predicting
    def _config_entry(self, ct: torch.Tensor) -> tuple[torch.Tensor, Any, dict[int, np.ndarray]]:
        """What a config set's calls reuse: its tensor, its config-only encoding, and per dtype size which
        of its configs the device can run (perfmodel.configs.runnable)."""
        fits = _Fits({b: runnable(ct.numpy(), float(b), self.spec) for b in set(DTYPE_BYTES.values())})
        return ct, _ConfigPart.of(self._encoder, ct), fits

    def _configs(self, configs: Any, dtype: str) -> tuple[Sequence[GemmConfig], torch.Tensor, Any, dict]:
        """(configs, their tensor, their config-only encoding, their runnable masks per dtype size); the
        last three cached per config set."""
        if configs is None:
            return (self._default_configs[dtype], *self._default_tensors[dtype])
        if isinstance(configs, (GemmConfig, str, bytes, dict)) or not isinstance(configs, Iterable):
            raise TypeError(f"configs: expected a sequence of GemmConfig, got {type(configs).__name__}")
        # An autotuner ranks one config list for shape after shape: the last list is matched by list
        # equality, which compares the same objects by identity (a few us for hundreds of configs,
        # where building the key below takes ~25 us). Only GemmConfigs equal GemmConfigs. A list
        # equal to the last one is served with the last one's own copy (no copy made per call).
        last = self._last_configs
        if last is not None and type(configs) is list and last[0] == configs:
            return (last[0], *last[1])
        configs = list(configs)
        if not configs:
            raise ValueError("configs: empty; pass at least one GemmConfig (or None for the default space)")
        if last is not None and last[0] == configs:
            return (configs, *last[1])
        try:  # GemmConfig.packed: 48 bytes per config; anything else fails here or on the length
            key = b"".join([c.packed for c in configs])
        except (AttributeError, TypeError):
            key = b""
        if len(key) != 48 * len(configs):
            for i, c in enumerate(configs):
                if not isinstance(c, GemmConfig):
                    raise TypeError(f"configs[{i}]: expected a GemmConfig, got {type(c).__name__} ({c!r})")
        with self._config_lock:
            hit = self._config_cache.get(key)
            if hit is not None:
                self._config_cache.move_to_end(key)
        if hit is None:
            hit = self._config_entry(configs_tensor(configs))
            with self._config_lock:
                self._config_cache[key] = hit
                while len(self._config_cache) > _CONFIG_CACHE_SIZE:
                    self._config_cache.popitem(last=False)
        self._last_configs = (configs, hit)  # one assignment: threads see the old pair or the new one
        return (configs, *hit)

    @property
    def runner(self) -> Runner:
        """The Runner every call of this Predictor goes through (its backend: Predictor.backend)."""
        return self._run

    def config_set(self, configs: Any, problems: Sequence[GemmProblem]) -> tuple[list, torch.Tensor, np.ndarray | None]:
        """(configs, their tensor (C, ...), (P, C) bool of the configs the model's device can run for each problem,
        or None where it can run them all) of a config list for problems (configs None: the model device's pruned
        space for the problems' one dtype): the Predictor's cached config sets, for a head scored outside it
        (perfmodel.serve.bmm)."""
        cfgs, ct, _, fits = self._configs(configs, self._common_dtype(list(problems), configs))
        return list(cfgs), ct, self._runnable(fits, problems)

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
        """Each problem's physical floor on the model's device (1-D float64 ms; perfmodel.domain.roofline_ms):
        no time this Predictor returns is below it."""
        return roofline_ms(self.spec, [p.m for p in problems], [p.n for p in problems], [p.k for p in problems],
                           [p.dtype for p in problems], [p.allow_tf32 for p in problems], [p.batch for p in problems])

    def floored(self, problems: Sequence[GemmProblem], ms: np.ndarray) -> np.ndarray:
        """ms (P,) or (P, C) float64 floored at each problem's roofline in float64: the heads floor at a float32
        feature, whose exp can sit a rounding below it (and a raised problem's at its own)."""
        roof = self.roofline_ms(problems)
        return np.maximum(ms, roof if ms.ndim == 1 else roof[:, None])

    # ---------------------------------------------------------------------------- the served times
    @staticmethod
    def _runnable(fits: dict[int, np.ndarray], problems: Sequence[GemmProblem]) -> np.ndarray | None:
        """(P, C) bool: which configs the model's device can run for each problem (fits: _config_entry's
        masks per dtype size); None when all can (the default spaces, and nearly every user list)."""
        runs_all = fits.all_runnable
        if len(problems) == 1:  # one problem (a rank call): no generator
            if problems[0].dtype_bytes in runs_all:
                return None
        elif all(p.dtype_bytes in runs_all for p in problems):
            return None
        return np.stack([fits[p.dtype_bytes] for p in problems])

    def _unrunnable_inf(self, ms: np.ndarray, fits: dict[int, np.ndarray], problems: Sequence[GemmProblem]) -> np.ndarray:
        """ms (P, C) with inf where the device cannot run the config (docs/design.md: such a config
        predicts inf and ranks after every runnable one)."""
        ok = self._runnable(fits, problems)
        return ms if ok is None else np.where(ok, ms, np.inf)

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
            x = self._encoder.encode_cross(problems_tensor(seen), ct, part)  # (P * C, F)
        z, log_ms = self._run.score_log_ms(self._gemm, x)
        if self._adds_static:  # the inductor kernel: the static head's output added before the physical floor
            with torch.inference_mode():
                z = self._inductor(z, x, floor=False)
                log_ms = self.bundle.heads["gemm"].physical_floor(z, x)
        shape = (len(problems), part.n_configs)
        z = self._checked(z.numpy().astype(np.float64), what).reshape(shape)
        ms = self._checked(np.exp(log_ms.numpy().astype(np.float64)), what, positive=True).reshape(shape)
        return z, self.floored(problems, ms)

    def _inductor(self, score: torch.Tensor, x: torch.Tensor, floor: bool) -> torch.Tensor:
        """kernel="inductor" on rows x (perfmodel.artifact.with_static, the rule the ONNX graphs trace): a
        head's score or log ms plus the static head's output, then, with floor, the gemm head's physical
        floor."""
        gemm = self.bundle.heads["gemm"]
        return with_static(score, self._run.score(STATIC, x), (lambda v: gemm.physical_floor(v, x)) if floor else None)

    @staticmethod
    def _common_dtype(problems: list[GemmProblem], configs: Any) -> str:
        dtypes = {p.dtype for p in problems}
        if configs is None and len(dtypes) > 1:
            raise ValueError(f"configs: problems mix dtypes {sorted(dtypes)}, whose default config spaces "
                             "differ; pass configs explicitly")
        return problems[0].dtype

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
            if self._adds_static:  # the inductor kernel: the static head's output added before the physical floor
                z = self._inductor(z, xr, floor=False)
                log_ms = self.bundle.heads["gemm"].physical_floor(z, xr)
            self._checked(z.numpy(), "problems")
            return z, log_ms

        def lead(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            xr = x[rows]
            score, outputs = self._run.lead(self._gemm, xr)
            if self._adds_static:  # the lead orders by the inductor kernel's times too; its outputs stay the member's
                score = self._inductor(score, xr, floor=False)
            return score, outputs

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
        top_k = _check_top_k(top_k)
        prob = _check_problem(prob)
        screened = _check_flag(screened, "screened")
        if prob.batch > 1:
            return bmm.rank(self, [prob], configs, top_k)[0]
        cfgs, ct, part, fits = self._configs(configs, prob.dtype)
        ok = self._runnable(fits, [prob])
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
        top_k = _check_top_k(top_k)
        problems = _check_problems(problems)
        screened = _check_flag(screened, "screened")
        if bmm.batched(problems):
            return bmm.rank(self, problems, configs, top_k)
        cfgs, ct, part, fits = self._configs(configs, self._common_dtype(problems, configs))
        ok = self._runnable(fits, problems)
        if ok is not None:
            return [self._rank_runnable(p, cfgs, o, top_k, screened) for p, o in zip(problems, ok)]
        idx, ms = self._best(problems, ct, part, top_k, screened)
        return [[(cfgs[i], t) for i, t in zip(ri, rm)] for ri, rm in zip(idx, ms)]

    # ------------------------------------------------------------------------------- cuBLAS or Triton
    def space_best_ms(self, problems: Sequence[GemmProblem]) -> np.ndarray:
        """Per problem, the best predicted time over the model device's config space for its dtype -- rank(p,
        top_k=1)'s time (a bmm's: the bmm head's) -- kept per problem (_SPACE_CACHE_SIZE): what cuBLAS's time
        is implied from."""
        out = np.empty(len(problems))
        todo: dict[str, list[int]] = {}
        with self._space_lock:
            for i, p in enumerate(problems):
                hit = self._space_cache.get(p)
                if hit is None:
                    todo.setdefault(p.dtype, []).append(i)
                else:
                    self._space_cache.move_to_end(p)
                    out[i] = hit
        for dtype, where in todo.items():
            for s in range(0, len(where), _SPACE_CHUNK):  # a bounded batch: (chunk x ~1,200 configs) rows
                idx = where[s:s + _SPACE_CHUNK]
                probs = [problems[i] for i in idx]
                if probs[0].batch > 1:
                    best = np.exp(np.min(bmm.scores(self, probs, None)[2], axis=1))
                else:
                    _, ct, part, fits = self._configs(None, dtype)
                    ok = self._runnable(fits, probs)
                    best = np.array([r[0][1] for r in self.rank_many(probs, None, 1)]) if ok is not None \
                        else np.array([r[0] for r in self._best(probs, ct, part, 1)[1]])
                out[idx] = best
                self._remember(probs, best)
        return out

    def _remember(self, problems: Sequence[GemmProblem], best_ms: Sequence[float]) -> None:
        with self._space_lock:
            for p, b in zip(problems, best_ms):
                self._space_cache[p] = float(b)
                self._space_cache.move_to_end(p)
            while len(self._space_cache) > _SPACE_CACHE_SIZE:
                self._space_cache.popitem(last=False)

    def predict_cublas(self, prob: GemmProblem) -> float:
        """Predicted ms of torch.mm (cuBLAS) on prob -- of aten::bmm for a batched one (batch > 1). With the
        model's call head for the kernel mode and a problem of the shapes and layouts it was fitted on
        (perfmodel.domain): the cuBLAS head's time where it agrees with the call, else the time the call
        implies against the best config of the whole space (rank(prob, top_k=1)'s time x exp(the call),
        floored at the roofline) -- so it is below that best time exactly where the call says cuBLAS wins
        (decisions.cublas_time); otherwise the cuBLAS head's time. The one cuBLAS time of the CLI, Candidates,
        the hooks and the whole-model set-up. RuntimeError if the model has no cuBLAS head."""
        return float(self.predict_cublas_many([_check_problem(prob)])[0])

    def predict_cublas_many(self, problems: Sequence[GemmProblem]) -> np.ndarray:
        """Predicted ms of torch.mm for each problem (1-D, predict_cublas's); of aten::bmm for batched problems."""
        problems = _check_problems(problems)
        if bmm.batched(problems):
            return bmm.aten_ms(self, problems)
        if not self.has_cublas:
            raise RuntimeError(f"{self.source}: this model has no cuBLAS head")
        return self._cublas_shown(problems)

    def _cublas_shown(self, problems: Sequence[GemmProblem], best_ms: np.ndarray | None = None) -> np.ndarray:
        """predict_cublas_many of plain GEMMs (decisions.cublas_time); best_ms: their best times over the whole
        space, when known."""
        head = self.floored(problems, self._cublas_ms(self._cublas_x(self.as_trained(problems, "cublas"))))
        call = self._call_head
        # the call head was fitted on the GEMM problems: where a problem is outside their shapes and layouts
        # (perfmodel.domain's "gemm"), the cuBLAS head's time alone
        covered = np.array([self.domain is None or not self.domain.outside("gemm", p) for p in problems])
        if call is None or not covered.any():
            return head
        out = head.copy()
        sel = [p for p, c in zip(problems, covered) if c]
        best = self.space_best_ms(sel) if best_ms is None else np.asarray(best_ms, dtype=np.float64)[covered]
        score = self._call_scores(call, self._cublas_x(sel))
        out[covered] = decisions.cublas_time(head[covered], best, score, self.roofline_ms(sel))
        return out

    def _cublas_ms(self, x: torch.Tensor) -> np.ndarray:
        """Predicted torch.mm ms on the problems' cuBLAS features x: the cuBLAS head's, or the problem
        network's cuBLAS output (perfmodel.artifact.PROBLEM)."""
        head, col = _output_source(self.bundle, "cublas")
        log_ms = self._run(head, x)
        return self._checked(np.exp(log_ms if col is None else log_ms[:, col]), "problems (cuBLAS)", positive=True)

    def _cublas_x(self, problems: Sequence[GemmProblem]) -> torch.Tensor:
        """The problems' features for the cuBLAS head, which its call heads take too (perfmodel call-head)."""
        with torch.inference_mode():
            return self.bundle.encoders["cublas"].encode(problems_tensor(problems))

    def candidates(self, prob: GemmProblem, configs: Sequence[GemmConfig] | None = None, top_k: int = 5,
                   margin: float = 0.05, max_k: int | None = None) -> Candidates:
        """The top_k configs, widened by every further config predicted within `margin` (relative) of
        the top_k-th one -- configs the model cannot tell apart -- up to max_k (default 2 * top_k);
        with the predicted cuBLAS time (predict_cublas) and whether it beats the best of them."""
        top_k = _check_top_k(top_k)
        max_k = 2 * top_k if max_k is None else _check_top_k(max_k, "max_k")
        if max_k < top_k:
            raise ValueError(f"max_k: must be >= top_k ({top_k}), got {max_k}")
        if isinstance(margin, bool) or not isinstance(margin, (int, float)):
            raise TypeError(f"margin: expected a number, got {type(margin).__name__} ({margin!r})")
        if not (math.isfinite(margin) and margin >= 0):
            raise ValueError(f"margin: must be finite and >= 0, got {margin}")
        prob = _check_problem(prob)
        if prob.batch > 1:
            return self._bmm_candidates(prob, configs, top_k, margin, max_k)
        cfgs, ct, part, fits = self._configs(configs, prob.dtype)
        ok = self._runnable(fits, [prob])
        if ok is not None and ok[0].any():  # a config the device cannot run is never a candidate
            return self.candidates(prob, [c for c, o in zip(cfgs, ok[0]) if o], top_k, margin, max_k)
        idx, ms = self._best([prob], ct, part, max_k)
        idx, ms = idx[0], ms[0]
        if configs is None and ok is None:  # the whole space's best: what cuBLAS's time is implied from
            self._remember([prob], [ms[0]])
        k = min(top_k, len(idx))
        bound = ms[k - 1] * (1.0 + margin)
        while k < min(max_k, len(idx)) and ms[k] <= bound:
            k += 1
        cublas_ms, prefer = None, False
        if self.has_cublas:
            cublas_ms = float(self._cublas_shown([prob])[0])
            prefer = bool(decisions.cublas_preferred(cublas_ms, float(ms[0])))
        return Candidates(configs=tuple(cfgs[i] for i in idx[:k]), predicted_ms=tuple(float(t) for t in ms[:k]),
                          cublas_ms=cublas_ms, prefer_cublas=prefer)

    def _bmm_candidates(self, prob: GemmProblem, configs: Any, top_k: int, margin: float, max_k: int) -> Candidates:
        """candidates() of a bmm: the bmm head's ranking (configs the device can run), widened alike, with
        aten::bmm's predicted time (predict_cublas: the bmm call head's implied time, or a bmm_aten head's)
        as cublas_ms and the same rule: aten's time below the best config shown."""
        scored = bmm.scores(self, [prob], configs)
        ranked = bmm.rank_scored(*scored, 10**9)[0]                   # every config, the runnable ones first
        ranked = ([r for r in ranked if math.isfinite(r[1])] or ranked)[:max_k]
        k = min(top_k, len(ranked))
        bound = ranked[k - 1][1] * (1.0 + margin)
        while k < len(ranked) and ranked[k][1] <= bound:
            k += 1
        if configs is None and math.isfinite(ranked[0][1]):  # the space just scored: its best, for aten's time
            self._remember([prob], [ranked[0][1]])
        aten = float(bmm.aten_ms(self, [prob])[0]) if bmm.has_aten(self) else None
        prefer = aten is not None and bool(decisions.cublas_preferred(aten, ranked[0][1]))
        return Candidates(configs=tuple(c for c, _ in ranked[:k]), predicted_ms=tuple(t for _, t in ranked[:k]),
                          cublas_ms=aten, prefer_cublas=prefer)

    @property
    def _call_head(self) -> str | None:
        """The model's cuBLAS call head for this kernel mode (perfmodel call-head), or None."""
        name = CALL_STATIC if self._static else CALL
        return name if _output_source(self.bundle, name) is not None else None

    def prefers_cublas_many(self, problems: Sequence[GemmProblem]) -> np.ndarray:
        """For each problem, whether cuBLAS (aten::bmm for a bmm) is predicted faster than the best Triton config
        of the model's config space (1-D bool): predict_cublas_many below rank(p, top_k=1)'s time -- with a
        call head, its call. RuntimeError if the model has no cuBLAS head."""
        problems = _check_problems(problems)
        if bmm.batched(problems):
            if not bmm.has_aten(self):
                bmm.require(self, bmm.BMM_CALL, problems[0].batch)
            return decisions.cublas_preferred(bmm.aten_ms(self, problems), self.space_best_ms(problems))
        if not self.has_cublas:
            raise RuntimeError(f"{self.source}: this model has no cuBLAS head")
        best = self.space_best_ms(problems)
        return decisions.cublas_preferred(self._cublas_shown(problems, best), best)

    def _call_scores(self, name: str, x: torch.Tensor) -> np.ndarray:
        """A call head's output (or the problem network's call output) on the problems' cuBLAS features x
        (below 0: cuBLAS wins)."""
        with torch.inference_mode():
            return problem_output(self.bundle, name).score(x).double().numpy().reshape(-1)

    def pad(self, pp: PadProblem) -> PadDecision:
        """Whether padding pp's operands to the dtype alignment pays off (Inductor's pad_mm decision):
        should_pad = padded_ms * pad_threshold < orig_ms. A problem already aligned is never padded
        (padded_ms == orig_ms). Both times floored at their problem's roofline (the padded one's at the
        padded problem's). RuntimeError if the model has no pad head."""
        if not isinstance(pp, PadProblem):
            raise TypeError(f"pp: expected a PadProblem, got {type(pp).__name__}")
        if not self.has_pad:
            raise RuntimeError(f"{self.source}: this model has no pad head")
        seen = self.as_trained([pp], "pad")[0]
        with torch.inference_mode():
            x = self.bundle.encoders["pad"].encode_pad(pad_tensor([seen]))
        ms = self._ms("pad", x, f"pp {pp}").reshape(-1, 2)[0]  # (orig, padded)
        # the rooflines of the problem as it is and padded (whose dims may pass MAX_DIM: no GemmProblem of them)
        (m, k, n), (pm, pk, pn) = (pp.m, pp.k, pp.n), pp.padded_dims()
        orig, padded = roofline_ms(self.spec, [m, pm], [n, pn], [k, pk], pp.dtype, pp.allow_tf32)
        return decisions.pad_decision(max(float(ms[0]), float(orig)), max(float(ms[1]), float(padded)),
                                      self.pad_threshold, pp.needs_padding())

    def __repr__(self) -> str:
        return (f"Predictor(source={self.source!r}, backend={self.backend!r}, device={self.spec.name!r}, "
                f"kernel={self.kernel!r})")


def _output_source(bundle: ModelBundle, name: str) -> tuple[str, int | None] | None:
    """(head, column) that gives the output `name` (cublas, call, call_static): the folder's own head of that
    name (column None: its whole output), else the problem network's column; None where the model has none."""
    if name in bundle.heads:
        return name, None
    col = problem_columns(bundle).get(name)
    return None if col is None else (PROBLEM, col)
