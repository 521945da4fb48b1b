"""The pad head: a PadProblem's time unpadded and padded (Inductor's pad_mm decision)."""
from __future__ import annotations

from .spec import HeadSpec

PAD = HeadSpec(
    name="pad", encoder="pad", outputs=("orig_log_ms", "padded_log_ms"),
    floors=("log_roofline_ms", "log_padded_roofline_ms"),
    targets="log ms of each pad row's torch.mm, unpadded and with its operands padded", step="train")
