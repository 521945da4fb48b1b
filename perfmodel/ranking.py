"""The screened ranking rule, once (docs/design.md, "Ranking").

Serving (both backends), the held-out evaluation, the full-space agreement and the ONNX ranking graph
all rank configs with `screened_rank`: the screen head scores every config, the gemm head scores the
screen's best `keep` per problem (when there are more than 2 * keep configs, else every config), the
floors turn its scores into log ms, and configs are sorted by the gemm head's score, ties in config
order. The ONNX graph is traced from this function (perfmodel/artifact.py), not written beside it.

With a lead (an ensemble gemm head, the model's `lead_keep` > 0): the ensemble's first member scores
the screen's `keep` configs, and the whole ensemble only that member's best `lead_keep` of them, reusing
the member's outputs -- when k <= lead_keep (`refines`). The ensemble's hidden layers are most of a
ranking's arithmetic; on the held-out problems its top-1 is the same with lead_keep 12 of keep 24
(docs/model.md).

Sorting by the score before the floors sorts the floored log ms too: the overhead floor is increasing,
and the physical floor of a GEMM is a property of the problem (the same for every config), so
max(score, floor) never reorders; it only makes configs below the floor equal, and the score keeps the
model's order among them.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

# gemm(rows, lead) -> (score, log ms) of the gemm head on rows of the (P * C) problem-major grid (rows None:
# all); lead: the lead member's outputs on those rows (LeadFn's second output), or None
GemmFn = Callable[[Optional[torch.Tensor], Optional[torch.Tensor]], "tuple[torch.Tensor, torch.Tensor]"]
# lead(rows) -> (score, outputs) of the gemm ensemble's lead member on rows: the score orders rows as the
# member's log ms; the outputs are what gemm(rows, lead) completes the ensemble from
LeadFn = Callable[[torch.Tensor], "tuple[torch.Tensor, torch.Tensor]"]


def screens(has_screen: bool, n_configs: int, keep: int) -> bool:
    """Whether the screen runs: a screen head and more than twice `keep` configs."""
    return has_screen and n_configs > 2 * keep


def refines(lead_keep: int, keep: int, k: int) -> bool:
    """Whether a screened ranking of k configs goes through the lead member: a lead_keep below keep, and k
    at most lead_keep (a longer ranking scores all `keep` with the whole ensemble)."""
    return 0 < lead_keep < keep and k <= lead_keep


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
                  keep: int, k: int, by_config: bool = False, lead: LeadFn | None = None,
                  lead_keep: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The k configs predicted fastest per problem: (config indices, log ms), each (P, min(k, kept)),
    fastest first, ties in config order.

    gemm: the gemm head on rows of the problem-major (P * C) grid (flat indices, or None for all), given
        the lead member's outputs on them or None: (score, log ms), each (rows,); score orders rows as
        log ms does (before the floors).
    screen: (P, C) screen scores (lower = faster) when screens(...) holds, else None: the gemm head
        scores every config.
    lead, lead_keep: the ensemble's lead member, and how many of the screen's `keep` it passes on to the
        whole ensemble, when refines(lead_keep, keep, k) (else, or with lead None, the ensemble scores
        all `keep`).
    by_config: gemm and lead get the configs' indices (P, n) in place of flat rows (the ONNX graph, which
        gathers each problem's rows itself: no flat row arithmetic in it), and gemm the lead's outputs
        (P, lead_keep) with their places among the `keep` rows the lead scored (P, lead_keep).
    """
    if screen is None:
        score, log_ms = gemm(None, None)
        score, log_ms = score.reshape(n_problems, n_configs), log_ms.reshape(n_problems, n_configs)
        order = _stable_argsort(score)[:, :k]
        return order, log_ms.gather(1, order)

    def rows(cand: torch.Tensor) -> torch.Tensor:
        return cand if by_config else (cand + torch.arange(screen.shape[0]).unsqueeze(1) * n_configs).reshape(-1)

    # the screen's best `keep`, back in config order (so that ties below sort by it)
    cand = _sorted_values(_stable_smallest(screen, keep), keep)                          # (P, keep)
    width, carry = keep, None
    if lead is not None and refines(lead_keep, keep, k):
        lead_score, lead_out = lead(rows(cand))
        # the lead's best lead_keep, as positions in cand, back in its (config) order
        pick = _sorted_values(_stable_smallest(lead_score.reshape(-1, keep), lead_keep), lead_keep)
        cand, width = cand.gather(1, pick), lead_keep                                    # (P, lead_keep)
        carry = lead_out.reshape(-1, keep).gather(1, pick)
    if carry is not None:  # by_config: with the picked configs' places among the screen's keep
        carry = (carry, pick) if by_config else carry.reshape(-1)
    score, log_ms = gemm(rows(cand), carry)
    score, log_ms = score.reshape(-1, width), log_ms.reshape(-1, width)
    # k <= width columns: in the ONNX graph one TopK of the constant k (no Shape/Slice nodes)
    order = _stable_smallest(score, k)
    return cand.gather(1, order), log_ms.gather(1, order)
