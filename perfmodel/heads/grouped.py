"""The grouped-GEMM head: Inductor's grouped-mm template for MoE experts (`torch._grouped_mm`), a grouped problem
encoded as the batched GEMM it equals under even routing (train/grouped_head.py; served by serve/grouped.py)."""
from __future__ import annotations

from typing import Any

from .spec import HeadSpec, figure


def grouped_card(meta: dict[str, Any]) -> str:
    """The card's line on the grouped head, where the folder has its figures."""
    m = meta.get("grouped_metrics")
    if not m:
        return ""
    pooled = (m.get("heldout_by_family") or {}).get("pooled") or {}
    held = (f"; held out by model family, top-1 / top-5 {figure(pooled['top1'], 3)} / {figure(pooled['top5'], 3)}"
            if "top1" in pooled and "top5" in pooled else "")
    return (f"- grouped head (`torch._grouped_mm`, MoE experts; `perfmodel build --only grouped`): fitted on "
            f"{m.get('problems', '-')} problems ({m.get('rows', '-')} rows) of `{(m.get('data') or {}).get('path', '-')}`'s "
            f"grouped rows ({m.get('device', '-')}){held}.\n")


GROUPED = HeadSpec(
    name="grouped", encoder="bmm", outputs=("log_ms",), floors=("log_bmm_roofline_ms",),
    targets="geomean log ms over the sweep's routings of each config of Inductor's grouped-mm template, with a share "
            "of the device's bmm rows", step="grouped", card=grouped_card)
