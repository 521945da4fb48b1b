"""The inductor head: a config network's inductor mode fitted beside the gemm head, for a model whose gemm head
is not one (`perfmodel build --only gemm_inductor`, train/inductor_head.py). Stored as INDUCTOR_GEMM on the gemm
encoder's features (the kernel-mode flag folded in), it serves kernel="inductor" as a config network's inductor
mode does; the gemm head keeps serving kernel="autotune"."""
from __future__ import annotations

from typing import Any

from .gemm import INDUCTOR_GEMM
from .spec import HeadSpec, figure


def per_device_figures(m: dict[str, Any], without: str) -> str:
    """A mode head's metrics m (train/inductor_head.py fit_inductor_head) as the card says them: per device, its
    test problems' top-1 / top-5 with the head, then in the autotune mode (named `without`); "-" for none."""
    per = []
    for dev, d in (m.get("devices") or {}).items():
        def f(mode: str, key: str) -> str:
            return figure(d.get(f"test_static/{mode}/{key}"), 3)

        per.append(f"{dev}: {d.get('test_static/problems', 0)} test problems, top-1 / top-5 "
                   f"{f('static_head', 'all/top1_eff')} / {f('static_head', 'all/top5_eff')} ({without} "
                   f"{f('without', 'all/top1_eff')} / {f('without', 'all/top5_eff')})")
    return "; ".join(per) or "-"


# how the inductor head's card names its autotune-mode figures (the gemm head was not fitted on the head's split)
AUTOTUNE_ELSEWHERE = "the gemm head's autotune mode, its own split not this one,"


def inductor_head_card(meta: dict[str, Any]) -> str:
    """The card's line on the inductor head: per device, the ranking of Inductor's template on its test problems'
    static rows, with the head and with the autotune mode."""
    m = meta.get("inductor_metrics")
    if not m:
        return ""
    return (f"- Inductor head (`kernel=\"inductor\"`, the kernel as Inductor compiles it; `perfmodel build --only "
            f"gemm_inductor`): the config network fitted beside the gemm head on {m.get('rows', '-')} rows of the data "
            f"folders' gemm and static parts, split by {m.get('split', '-')}; ranking Inductor's template on the "
            f"held-out problems' static times, {per_device_figures(m, AUTOTUNE_ELSEWHERE)}.\n")


INDUCTOR = HeadSpec(
    name=INDUCTOR_GEMM, encoder="gemm", outputs=("log_ms",), floors=("log_roofline_ms",),
    targets="log ms of every data folder's (problem, Triton config) rows and static rows (Inductor's mm template), "
            "a kernel-mode input, within-problem ranking; stored with the mode held at inductor",
    step="inductor", card=inductor_head_card)
