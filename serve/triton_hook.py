"""Pruning Triton's autotuner with the model: benchmark only the configs it ranks best.

    @triton.autotune(configs, key=["M", "N", "K"],
                     prune_configs_by={"early_config_prune": perfmodel_prune(top_k=5)})
    @triton.jit
    def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, ..., BLOCK_M: tl.constexpr, ...): ...

Triton 3.6's Autotuner.prune_configs calls early_config_prune(configs, named_args, **kwargs) with the
positional arguments by name (named_args) and the keyword arguments of the launch; it then, when a
perf_model is given, keeps the top_k configs by perf_model(**named_args, **kwargs, **config.all_kwargs()).
perfmodel_prune ranks every config in one batched call; perfmodel_perf_model is the per-config form.

The problem is read from the launch arguments: M, N, K from integer arguments (names configurable) or
else from the shapes of the operand tensors (A is (M, K), B is (K, N)); dtype and layout (column-major
operands) from the tensors. Config kwargs BLOCK_M/BLOCK_N/BLOCK_K/GROUP_M (or BLOCK_SIZE_M/..., or
lower-case) and num_stages/num_warps map to GemmConfig. A config outside the model's space (e.g.
num_warps=16) cannot be ranked: it is kept (and benchmarked) by default, see `unknown`.
"""
from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Sequence

from perfmodel.schema import GemmConfig, GemmProblem, is_column_major

from .arguments import _check_kernel
from .decisions import kept_positions
from .gemm_decisions import rank_positions
from .kernel_inputs import kwargs_to_gemm
from .predictor import Predictor


def config_to_gemm(config: Any) -> GemmConfig:
    """A triton.Config (or anything with all_kwargs() / a kwargs dict) -> GemmConfig.
    ValueError/TypeError when it is not a config of the canonical GEMM template's space."""
    if hasattr(config, "all_kwargs"):
        kw = dict(config.all_kwargs())
    elif isinstance(config, dict):
        kw = dict(config)
    else:
        raise TypeError(f"config: expected a triton.Config, got {type(config).__name__}")
    return kwargs_to_gemm(kw)


class _LazyPredictor:
    """Loads the model at the first launch, not when the decorated module is imported."""

    def __init__(self, predictor: Predictor | None, model: Any, backend: str | None, kernel: str | None = None) -> None:
        if kernel is not None:
            _check_kernel(kernel)  # at decoration, not at the first launch
        self._predictor = predictor if predictor is None or kernel is None else predictor.with_kernel(kernel)
        self._model, self._backend, self._kernel = model, backend, kernel or "autotune"
        self._lock = threading.Lock()

    def get(self) -> Predictor:
        with self._lock:
            if self._predictor is None:
                self._predictor = Predictor.load(self._model, backend=self._backend, kernel=self._kernel)
            return self._predictor


class ProblemReader:
    """Reads the GEMM problem of a launch from its arguments (named_args and kwargs merged)."""

    def __init__(self, a: str = "a", b: str = "b", m: str = "M", n: str = "N", k: str = "K",
                 dtype: Any = None, allow_tf32: bool | None = None) -> None:
        self.a, self.b, self.m, self.n, self.k = a, b, m, n, k
        self.dtype, self.allow_tf32 = dtype, allow_tf32

    def _tensor(self, args: dict[str, Any], name: str) -> Any:
        for key in (name, f"{name}_ptr"):
            t = args.get(key)
            if t is not None and hasattr(t, "shape") and hasattr(t, "stride"):
                return t
        return None

    def __call__(self, args: dict[str, Any]) -> GemmProblem:
        a, b = self._tensor(args, self.a), self._tensor(args, self.b)
        dims = {}
        for field, name, fallback in (("m", self.m, (a, -2)), ("n", self.n, (b, -1)), ("k", self.k, (a, -1))):
            if name in args:
                dims[field] = int(args[name])
            elif fallback[0] is not None and len(fallback[0].shape) >= 2:
                dims[field] = int(fallback[0].shape[fallback[1]])
            else:
                raise ValueError(f"{field}: no argument {name!r} and no 2-D tensor {self.a!r}/{self.b!r} "
                                 "to read it from")
        dtype = self.dtype
        if dtype is None:
            if a is None:
                raise ValueError(f"dtype: no tensor {self.a!r} to read it from; pass dtype=")
            dtype = a.dtype
        allow_tf32 = self.allow_tf32
        if allow_tf32 is None:
            flag = args.get("ALLOW_TF32", args.get("allow_tf32"))
            # tl.dot's default input precision for float32 is tf32.
            allow_tf32 = True if flag is None else bool(flag)
        is_fp32 = str(dtype).removeprefix("torch.") == "float32"
        return GemmProblem(m=dims["m"], n=dims["n"], k=dims["k"], dtype=dtype, allow_tf32=allow_tf32 and is_fp32,
                           transpose_left=a is not None and is_column_major(a.shape, a.stride()),
                           transpose_right=b is not None and is_column_major(b.shape, b.stride()))


def perfmodel_prune(top_k: int = 5, *, predictor: Predictor | None = None, model: Any = None,
                    backend: str | None = None, a: str = "a", b: str = "b", m: str = "M", n: str = "N",
                    k: str = "K", dtype: Any = None, allow_tf32: bool | None = None,
                    unknown: str = "keep", kernel: str | None = None) -> Callable[..., list]:
    """An `early_config_prune` for triton.autotune that keeps the model's top_k configs, fastest first.

    predictor: a loaded Predictor (default: Predictor.load(model, backend=backend) at the first launch).
    a, b: names of the A (M, K) and B (K, N) tensor arguments; m, n, k: names of the integer size
    arguments (read from the tensors' shapes when absent). dtype / allow_tf32: override what the
    arguments say (allow_tf32 defaults to an ALLOW_TF32 argument, else True, tl.dot's fp32 default).
    unknown: "keep" (benchmark configs the model cannot rank, after the ranked ones) or "drop".
    kernel: the kernel mode ranked (Predictor.load's kernel): None -- the given predictor's, else "autotune" (the
    dataset's kernel, Inductor's template body with its contiguity hints); "tutorial" for the Triton tutorial's
    matmul as written there (no hints, K always masked), where the model has a tutorial head.
    """
    from .predictor import _check_top_k

    top_k = _check_top_k(top_k)
    if unknown not in ("keep", "drop"):
        raise ValueError(f"unknown: expected 'keep' or 'drop', got {unknown!r}")
    lazy = _LazyPredictor(predictor, model, backend, kernel)
    read = ProblemReader(a, b, m, n, k, dtype, allow_tf32)
    warned = threading.Event()

    def early_config_prune(configs: Sequence[Any], named_args: dict[str, Any], **kwargs: Any) -> list:
        configs = list(configs)
        prob = read({**named_args, **kwargs})
        ranked, ranked_cfgs, others = [], [], []
        for c in configs:
            try:
                g = config_to_gemm(c)
            except (ValueError, TypeError):
                others.append(c)
                continue
            ranked.append(c)
            ranked_cfgs.append(g)
        if others and not warned.is_set():
            warned.set()
            warnings.warn(f"perfmodel_prune: {len(others)} config(s) are outside the model's config space and "
                          f"are {'kept unranked' if unknown == 'keep' else 'dropped'} (first: {others[0]})",
                          stacklevel=2)
        if not ranked:
            return configs
        # A config the device cannot run (over its shared memory or registers) ranks last at inf: never
        # kept while a runnable one exists (decisions.kept_positions).
        kept = [ranked[i] for i in kept_positions(rank_positions(lazy.get(), prob, ranked_cfgs, top_k))]
        return kept + (others if unknown == "keep" else [])

    early_config_prune.top_k = top_k  # type: ignore[attr-defined]
    return early_config_prune


def perfmodel_perf_model(*, predictor: Predictor | None = None, model: Any = None, backend: str | None = None,
                         a: str = "a", b: str = "b", m: str = "M", n: str = "N", k: str = "K",
                         dtype: Any = None, allow_tf32: bool | None = None,
                         kernel: str | None = None) -> Callable[..., float]:
    """A `perf_model` for triton.autotune's prune_configs_by={"perf_model": ..., "top_k": k}: Triton
    calls it once per config with (**named_args, **kwargs, **config.all_kwargs()) and keeps the top_k
    lowest. A config outside the model's space gets +inf (benchmarked last, if at all).
    perfmodel_prune does the same ranking in one batched call; prefer it for long config lists. kernel: as
    perfmodel_prune's."""
    lazy = _LazyPredictor(predictor, model, backend, kernel)
    read = ProblemReader(a, b, m, n, k, dtype, allow_tf32)

    def perf_model(**all_args: Any) -> float:
        try:
            cfg = kwargs_to_gemm(all_args)
        except (ValueError, TypeError):
            return float("inf")
        return float(lazy.get().predict(read(all_args), [cfg])[0])

    return perf_model


def prune_configs_by(top_k: int = 5, **kwargs: Any) -> dict[str, Any]:
    """The whole prune_configs_by dict: {"early_config_prune": perfmodel_prune(top_k, **kwargs)}."""
    return {"early_config_prune": perfmodel_prune(top_k, **kwargs)}
