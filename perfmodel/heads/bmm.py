"""The batched GEMM (torch.bmm / baddbmm) heads: a GemmProblem with batch > 1 is served by them."""
from __future__ import annotations

from typing import Any

from .spec import HeadSpec


def bmm_card(meta: dict[str, Any]) -> str:
    """The card's line on the bmm heads, where the folder has their held-out figures."""
    m = meta.get("bmm_metrics")
    if not m or "test/all/top1_eff" not in m:
        return ""
    data = (meta.get("bmm_settings") or {}).get("data") or {}
    data = data if isinstance(data, list) else [data]  # one record per device's folder fitted on
    where = " and ".join(f"`{d.get('path', '-')}`'s bmm rows (sha256 `{d.get('sha256', '-')}`)" for d in data)
    return (f"- bmm heads (`perfmodel build --only bmm`; `GemmProblem(batch > 1)`): Inductor's bmm template configs "
            f"and aten::bmm, fitted on {where}, split by "
            f"shape (seed {(meta.get('bmm_settings') or {}).get('split_seed', '-')}): train {m.get('train/problems', '-')}, "
            f"val {m.get('val/problems', '-')}, test {m.get('test/problems', '-')} problems; table below.\n")


BMM = HeadSpec(
    name="bmm", encoder="bmm", outputs=("log_ms",), floors=("log_bmm_roofline_ms",),
    targets="log ms of a config of Inductor's bmm template, as Inductor compiles it, on every bmm row "
            "(and a share of the static batch-1 rows)", step="bmm", card=bmm_card)

BMM_ATEN = HeadSpec(
    name="bmm_aten", encoder="bmm_aten", outputs=("log_ms",), floors=("log_bmm_roofline_ms",),
    targets="log ms of aten::bmm on each bmm problem (optional: without it aten::bmm's time is the one the "
            "call implies)", step="bmm")

BMM_CALL = HeadSpec(
    name="bmm_call", encoder="bmm_aten", outputs=("call",), floors=("",),
    targets="log(aten::bmm ms / the best Triton config's ms) of each bmm problem (below 0: aten::bmm wins; "
            "only its score is served)", step="bmm")
