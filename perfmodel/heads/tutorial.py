"""The tutorial head: kernel="tutorial", the Triton tutorial's matmul as an `@triton.autotune` user writes it
(grouped program order, K-masked loads, no contiguity hints, sizes and strides run-time arguments). Fitted like the
inductor head (train/tutorial_head.py: the config network on the gemm rows and the folders' `gemm_tutorial` rows,
its mode flag folded in) and stored as TUTORIAL_GEMM on the gemm encoder's features; the gemm head keeps serving
kernel="autotune" (the dataset's kernel, Inductor's template body with its hints)."""
from __future__ import annotations

from typing import Any

from .inductor import per_device_figures
from .spec import HeadSpec

TUTORIAL_GEMM = "gemm_tutorial"  # perfmodel/bundle.py MODE_HEADS serves kernel="tutorial" by it (re-exported there)


def tutorial_head_card(meta: dict[str, Any]) -> str:
    """The card's line on the tutorial head: per device with tutorial rows, the ranking of the tutorial kernel on
    its held-out problems, with the head and with the autotune mode."""
    m = meta.get("tutorial_metrics")
    if not m:
        return ""
    return (f"- Tutorial head (`kernel=\"tutorial\"`, the Triton tutorial's matmul as an `@autotune` user writes it; "
            f"`perfmodel build --only gemm_tutorial`): the config network fitted beside the gemm head on "
            f"{m.get('rows', '-')} rows of the data folders' gemm and gemm_tutorial parts, split by "
            f"{m.get('split', '-')}; ranking the tutorial kernel on the held-out problems' times, "
            f"{per_device_figures(m, 'the autotune mode')}.\n")


TUTORIAL = HeadSpec(
    name=TUTORIAL_GEMM, encoder="gemm", outputs=("log_ms",), floors=("log_roofline_ms",),
    targets="log ms of the data folders' (problem, Triton config) rows and gemm_tutorial rows (the Triton tutorial's "
            "matmul), a kernel-mode input, within-problem ranking; stored with the mode held at the tutorial kernel",
    step="tutorial", card=tutorial_head_card)
