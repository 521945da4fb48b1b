"""Helpers shared by the sweeps: dtypes, operands in a layout, the device header."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from perfmodel.devices import DeviceSpec, get_spec, live_device_info, match_spec
from perfmodel.schema import GemmProblem

_TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def torch_dtype(name: str) -> torch.dtype:
    return _TORCH_DTYPES[name]


def make_operands(p: GemmProblem, device: torch.device, gen: torch.Generator | None = None):
    """Random A (m, k) and B (k, n) in the problem's layout (column-major = a transposed view)."""
    dt = torch_dtype(p.dtype)
    a = (torch.randn(p.k, p.m, device=device, dtype=dt, generator=gen).t() if p.transpose_left
         else torch.randn(p.m, p.k, device=device, dtype=dt, generator=gen))
    b = (torch.randn(p.n, p.k, device=device, dtype=dt, generator=gen).t() if p.transpose_right
         else torch.randn(p.k, p.n, device=device, dtype=dt, generator=gen))
    return a, b


def resolve_spec(spec_name: str | None) -> tuple[DeviceSpec, dict[str, Any]]:
    """The datasheet spec of the live device (or the one named), and the live device's properties."""
    live = live_device_info(torch.cuda.current_device())
    spec = get_spec(spec_name) if spec_name else match_spec(live["device_name"], live["sm_count"])
    if spec is None:
        raise RuntimeError(f"device: no datasheet spec for {live['device_name']!r}; pass --device-spec")
    if spec.sm_count != live["sm_count"]:
        raise RuntimeError(f"device: spec {spec.name} has {spec.sm_count} SMs, the live device {live['sm_count']}")
    return spec, live


def device_header(live: dict[str, Any], spec: DeviceSpec) -> dict[str, Any]:
    return {**live, "device_spec": spec.name, "spec": spec.as_dict()}


@contextlib.contextmanager
def cublas_tf32(enabled: bool) -> Iterator[None]:
    """torch.mm (cuBLAS) with tf32 on or off for the block, restoring the caller's setting after."""
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
