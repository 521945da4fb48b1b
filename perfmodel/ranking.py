"""The screened ranking rule, once (docs/design.md, "Ranking").

Serving (both backends), the held-out evaluation, the full-space agreement and the ONNX ranking graph
all rank configs with `screened_rank`: the screen head scores every config, the gemm head scores the
screen's best `keep` per problem (when there are more than 2 * keep configs, else every config), the
floors turn its scores into log ms, and configs are sorted by the gemm head's score, ties in config
order. The ONNX graph is traced from this function (perfmodel/artifact.py), not written beside it.

Sorting by the score before the floors sorts the floored log ms too: the overhead floor is increasing,
and the physical floor of a GEMM is a property of the problem (the same for every config), so
max(score, floor) never reorders; it only makes configs below the floor equal, and the score keeps the
model's order among them.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

# gemm(rows) -> (score, log ms) of the gemm head on rows of the (P * C) problem-major grid; rows None: all
GemmFn = Callable[[Optional[torch.Tensor]], "tuple[torch.Tensor, torch.Tensor]"]


def screens(has_screen: bool, n_configs: int, keep: int) -> bool:
    """Whether the screen runs: a screen head and more than twice `keep` configs."""
    return has_screen and n_configs > 2 * keep


def _stable_argsort(x: torch.Tensor) -> torch.Tensor:
    """Ascending order along dim 1, ties in index order. ONNX's TopK keeps the lower index first among
    equal values (the spec's rule), which is what torch's stable sort does in eager mode."""
    if torch.onnx.is_in_onnx_export():
        return torch.topk(x, x.shape[1], dim=1, largest=False, sorted=True)[1]
    return torch.sort(x, dim=1, stable=True)[1]


def _stable_smallest(x: torch.Tensor, n: int) -> torch.Tensor:
    """_stable_argsort(x)[:, :n]: in the ONNX graph one TopK of n (not a sort of every column)."""
    if torch.onnx.is_in_onnx_export():
        return torch.topk(x, n, dim=1, largest=False, sorted=True)[1]
    return torch.sort(x, dim=1, stable=True)[1][:, :n]


def _sorted_values(x: torch.Tensor, n: int) -> torch.Tensor:
    """torch.sort(x, dim=1)[0] of x with n columns: in the ONNX graph one TopK of the constant n."""
    if torch.onnx.is_in_onnx_export():
        return torch.topk(x, n, dim=1, largest=False, sorted=True)[0]
    return torch.sort(x, dim=1)[0]


def screened_rank(gemm: GemmFn, n_problems: int, n_configs: int, screen: torch.Tensor | None,
                  keep: int, k: int, by_config: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The k configs predicted fastest per problem: (config indices, log ms), each (P, min(k, kept)),
    fastest first, ties in config order.

    gemm: the gemm head on rows of the problem-major (P * C) grid (flat indices, or None for all):
        (score, log ms), each (rows,); score orders rows as log ms does (before the floors).
    screen: (P, C) screen scores (lower = faster) when screens(...) holds, else None: the gemm head
        scores every config.
    by_config: gemm gets the kept configs' indices (P, keep) in place of flat rows (the ONNX graph, which
        gathers each problem's rows itself: no flat row arithmetic in it).
    """
    if screen is None:
        score, log_ms = gemm(None)
        score, log_ms = score.reshape(n_problems, n_configs), log_ms.reshape(n_problems, n_configs)
        order = _stable_argsort(score)[:, :k]
        return order, log_ms.gather(1, order)
    else:
        # the screen's best `keep`, back in config order (so that ties below sort by it)
        cand = _sorted_values(_stable_smallest(screen, keep), keep)                      # (P, keep)
        if by_config:
            score, log_ms = gemm(cand)
        else:
            rows = cand + torch.arange(screen.shape[0]).unsqueeze(1) * n_configs
            score, log_ms = gemm(rows.reshape(-1))
        score, log_ms = score.reshape(-1, keep), log_ms.reshape(-1, keep)
        # k <= keep columns: in the ONNX graph one TopK of the constant k (no Shape/Slice nodes)
        order = _stable_smallest(score, k)
        return cand.gather(1, order), log_ms.gather(1, order)
