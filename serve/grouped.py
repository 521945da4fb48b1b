"""Grouped GEMMs (MoE experts as `torch._grouped_mm`) in the whole-model set-up and the max-autotune hook.

Inductor lowers `aten._grouped_mm` (torch/_inductor/kernel/mm_grouped.py) outside the InductorChoices path the
mm/bmm decisions take: it appends aten's `_grouped_mm` and one `triton_grouped_mm` choice per config that its
`early_config_prune(g, m, dtsize, configs, named_args)` keeps of `_NV_CONFIGS` (up to 144; ~55-76 after the
prune), then benchmarks them all -- stock max-autotune spent 29-49 s of a 2-layer MoE's compile on it
(benchmarks/results/model_bench_serving_h200.md). Under the set-up's `max_autotune_gemm` it did the same.

`installed(predictor)` wraps three of that module's functions for the duration of a compile:

- `grouped_mm_args` (as it is, noting the operands' sizes and dtype: the prune is not given N and K);
- `early_config_prune`: Inductor's own prune first, then, where the model has a `grouped` head, only the
  head's top_k of those configs, else none (aten's `_grouped_mm` alone, default mode's kernel);
- `autotune_select_algorithm`: in the set-up (`alone=True`) the one choice decided -- the head's top-1 config,
  or aten above ATEN_ABOVE rows per expert -- so nothing is benchmarked; in the max-autotune hook Inductor
  benchmarks the top_k beside aten as before.

The head scores a grouped problem as the batched GEMM it equals under even routing (train/grouped_head.py):
M = the tokens per expert, batch = the experts. Decisions are recorded (`decisions()`), for the set-up's summary.
"""
from __future__ import annotations

import contextlib
import math
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from perfmodel.configs import spill_scores
from perfmodel.features import BMM_PROBLEM_COLUMNS, configs_tensor
from perfmodel.schema import GemmConfig

GROUPED = "grouped"        # the head's name in a model folder
ENCODER = "bmm"            # the encoder it is fitted on
# Configs the max-autotune hook keeps beside aten by default (it benchmarks them; its top_k overrides). The set-up
# benchmarks nothing: the head's top-1 config alone, or aten alone (ATEN_ABOVE).
TOP_K = 2
# Rows per expert (at the compile's size hint) above which the set-up keeps aten's _grouped_mm: in the H200's grouped
# sweep (data/h200, 51 problems with both timed) the best Triton config beat aten at every size up to 512 rows per
# expert (1.03-1.55x) and lost at 4,096 (0.93x); held out by family the head's top-1 beat aten on all but that one.
ATEN_ABOVE = 1024
GROUP_M = 8                # the grouped template has no GROUP_M; the head saw this constant


@dataclass(frozen=True)
class GroupedDecision:
    """One grouped GEMM the set-up saw: experts g, total rows m (tokens x top-k), n, k, dtype, whether B is
    K-major, the configs Inductor offered and those kept (none: aten's `_grouped_mm` alone)."""

    g: int
    m: int
    n: int
    k: int
    dtype: str
    b_k_major: bool
    offered: int
    kept: tuple[tuple[int, int, int, int, int], ...]   # (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps)
    predicted_ms: tuple[float, ...] = ()


_records: list[GroupedDecision] = []
_lock = threading.Lock()
_local = threading.local()


def decisions() -> list[GroupedDecision]:
    with _lock:
        return list(_records)


def reset() -> None:
    with _lock:
        _records.clear()


def _hint(x: Any) -> int:
    """An int for a size that may be symbolic: its value, else Inductor's size hint (the compile's example)."""
    try:
        return int(x)
    except TypeError:
        from torch._inductor.virtualized import V

        return int(V.graph.sizevars.size_hint(x, fallback=8192))


def rank(head: Any, encoder: Any, g: int, m: int, n: int, k: int, dtype: str, b_k_major: bool,
         configs: list[tuple[int, int, int, int, int]]) -> np.ndarray:
    """The head's score of each config (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps) on the grouped problem,
    as the batched GEMM it equals (M = ceil(m / g) tokens per expert, batch g); lower is faster. A config whose
    accumulator spills ranks last (perfmodel/configs.py SPILL_REGISTERS)."""
    per = max(1, math.ceil(m / max(g, 1)))
    prob = [per, n, k, 4 if dtype == "float32" else 2, float(dtype == "bfloat16"), 0.0, 0.0, float(b_k_major), g]
    cfgs = [GemmConfig(block_m=c[0], block_n=c[1], block_k=c[2], group_m=GROUP_M, num_stages=c[3], num_warps=c[4])
            for c in configs]
    p = torch.tensor([prob], dtype=torch.float64).reshape(1, len(BMM_PROBLEM_COLUMNS))
    with torch.inference_mode():
        x = encoder.encode_cross(p, configs_tensor(cfgs))
        scores = head.eval().score(x).double().numpy().reshape(-1)
    c = np.asarray(configs, dtype=np.float64).reshape(-1, 5)
    return scores + spill_scores(c[:, 0], c[:, 1], c[:, 4])


def _config_tuple(c: Any) -> tuple[int, int, int, int, int]:
    kw = c.kwargs
    return (int(kw["BLOCK_M"]), int(kw["BLOCK_N"]), int(kw["BLOCK_K"]), int(c.num_stages), int(c.num_warps))


def _dtype_name(dt: Any) -> str:
    return str(dt).replace("torch.", "")


class _Pruner:
    """The wrapped `early_config_prune`: Inductor's prune, then the head's top_k (or nothing: aten alone). alone:
    the set-up's decision, nothing benchmarked -- the head's top-1 alone, or aten alone above ATEN_ABOVE rows per
    expert (the choice is made in `_Select`, which sees aten's choice beside the template's)."""

    def __init__(self, original: Any, head: Any, encoder: Any, top_k: int, alone: bool = False) -> None:
        self.original, self.head, self.encoder = original, head, encoder
        self.top_k, self.alone = (1 if alone else top_k), alone

    def __call__(self, g: Any, m: Any, dtsize: Any, configs: Any, named_args: Any) -> list:
        pruned = list(self.original(g, m, dtsize, configs, named_args))
        sizes = getattr(_local, "sizes", None)
        if sizes is None:                  # grouped_mm_args not seen: leave Inductor's choice alone
            return pruned
        n, k, dtype = sizes
        gi, mi = _hint(g), _hint(m)
        b_k_major = bool(named_args.get("B_IS_K_MAJOR", False))
        kept: list = []
        scores: np.ndarray = np.zeros(0)
        if self.head is not None and pruned and named_args.get("A_IS_2D") and not named_args.get("B_IS_2D"):
            tuples = [_config_tuple(c) for c in pruned]
            scores = rank(self.head, self.encoder, gi, mi, n, k, dtype, b_k_major, tuples)
            order = np.argsort(scores, kind="stable")[:self.top_k]
            kept = [pruned[i] for i in order]
            scores = scores[order]
            if self.alone and math.ceil(mi / max(gi, 1)) > ATEN_ABOVE:
                kept, scores = [], np.zeros(0)
        _local.alone = self.alone and self.head is not None  # _Select: one choice, nothing benchmarked
        d = GroupedDecision(gi, mi, n, k, dtype, b_k_major, len(pruned), tuple(_config_tuple(c) for c in kept),
                            tuple(float(np.exp(s)) for s in scores))
        with _lock:  # one record a problem: Inductor calls the prune again on the kept config (seen on an H200)
            if not any((r.g, r.m, r.n, r.k, r.dtype, r.b_k_major) == (gi, mi, n, k, dtype, b_k_major) for r in _records):
                _records.append(d)
        return kept


class _Select:
    """The wrapped `autotune_select_algorithm` of the grouped lowering: where the set-up decided (alone), the one
    choice it kept -- the head's Triton config, else aten's `_grouped_mm` -- so Inductor benchmarks nothing (it
    takes a lone choice as it is); otherwise Inductor's own selection over what the pruner kept."""

    def __init__(self, original: Any) -> None:
        self.original = original

    def __call__(self, name: Any, choices: Any, *a: Any, **kw: Any) -> Any:
        if getattr(_local, "alone", False) and len(choices) > 1:
            from torch._inductor.select_algorithm import ExternKernelCaller

            triton = [c for c in choices if not isinstance(c, ExternKernelCaller)]
            aten = [c for c in choices if isinstance(c, ExternKernelCaller)]
            choices = triton[:1] or aten[:1]
        _local.alone = False
        return self.original(name, choices, *a, **kw)


@contextlib.contextmanager
def installed(predictor: Any, top_k: int = TOP_K, alone: bool = False) -> Iterator[None]:
    """Within: Inductor's grouped_mm lowering keeps the model's top_k configs of its own (a model folder with a
    `grouped` head) or aten's `_grouped_mm` alone (without one). A torch without the module or its two functions
    is left as it is, with one warning."""
    try:
        import torch._inductor.kernel.mm_grouped as mg
        prune, args, select = mg.early_config_prune, mg.grouped_mm_args, mg.autotune_select_algorithm
    except (ImportError, AttributeError) as e:
        warnings.warn(f"perfmodel: this torch's Inductor has no grouped_mm lowering to decide ({e}); grouped GEMMs "
                      "are left to Inductor", stacklevel=2)
        yield
        return
    head = predictor.bundle.heads.get(GROUPED)
    encoder = predictor.bundle.encoders.get(GROUPED)  # the "bmm" encoder, with the served device's spec

    def sized_args(mat_a: Any, mat_b: Any, *a: Any, **kw: Any) -> Any:
        out = args(mat_a, mat_b, *a, **kw)   # (m1_size, m2_size, layout, mat_a, mat_b, offs)
        m1, m2 = out[0], out[1]
        try:
            _local.sizes = (_hint(m2[-1]), _hint(m1[-1]), _dtype_name(out[3].get_dtype()))
        except Exception:  # noqa: BLE001 -- a size we cannot read: leave this GEMM to Inductor
            _local.sizes = None
        return out

    mg.early_config_prune = _Pruner(prune, head, encoder, top_k, alone)
    mg.grouped_mm_args = sized_args
    mg.autotune_select_algorithm = _Select(select)
    try:
        yield
    finally:
        mg.early_config_prune, mg.grouped_mm_args, mg.autotune_select_algorithm = prune, args, select
        _local.sizes = None
        _local.alone = False
