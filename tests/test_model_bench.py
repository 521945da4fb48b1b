"""benchmarks/model_bench.py's CPU side: which workloads a --workloads value names (the GPU runs are not
tested here)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _model_bench():
    spec = importlib.util.spec_from_file_location("model_bench", ROOT / "benchmarks" / "model_bench.py")
    mb = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("model_bench", mb)  # its dataclasses look their module up there
    spec.loader.exec_module(mb)
    return sys.modules["model_bench"]


def test_workload_prefixes_with_and_without_commas():
    mb = _model_bench()
    names = lambda spec: [w.name for w in mb.select_workloads(spec)]  # noqa: E731
    # "," separates prefixes; "Llama" names both Llama workloads, in WORKLOADS' order
    assert names("T5,BERT") == ["BERT-large (4 layers), fp16, 16x384", "T5-base, bf16, 8x512 -> 128"]
    assert len(names("Llama")) == 2
    # a prefix that holds a comma: ";" separates, so prefill and decode can be named apart
    assert names("Llama-3-8B widths (2 layers), bf16, decode;Swin") == [
        "Llama-3-8B widths (2 layers), bf16, decode 8x1", "Swin-T, fp16, batch 32"]
    assert names("no such model") == []
