"""Heads of older folder layouts, each an alternative to a registered head: a folder holding one is converted
once by perfmodel/migrate.py, never branched on at load.

screen       -- a small screen head; the student screens now (metadata "screen_head": "student")
static       -- a head added to the gemm head's score for kernel="inductor"; the config network now
cublas, call, call_static -- one head per output; the problem network's columns now
"""
from __future__ import annotations

from .spec import HeadSpec

LEGACY: dict[str, HeadSpec] = {s.name: s for s in (
    HeadSpec("screen", "gemm", ("log_ms",), ("log_roofline_ms",), "the gemm head's log ms", "train"),
    HeadSpec("static", "gemm", ("log_ms",), ("",), "static log ms - the gemm head's score", "static"),
    HeadSpec("cublas", "cublas", ("log_ms",), ("log_roofline_ms",), "torch.mm's log ms", "train"),
    HeadSpec("call", "cublas", ("call",), ("",), "log(cuBLAS ms / best Triton ms)", "call"),
    HeadSpec("call_static", "cublas", ("call",), ("",), "log(cuBLAS ms / best static Triton ms)", "call"),
)}
