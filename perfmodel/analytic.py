"""A Triton-style analytic GEMM time estimate (after triton.ops.matmul_perf_model.estimate_matmul_time,
which Triton shipped for its own autotuner's pruning). A baseline, and a sanity reference; batched."""
from __future__ import annotations

import torch

from .devices import DeviceSpec


def estimate_ms(problems: torch.Tensor, configs: torch.Tensor, spec: DeviceSpec) -> torch.Tensor:
    """problems (..., 8) and configs (..., 6) as in perfmodel.features, broadcastable -> (...) ms."""
    lead = torch.broadcast_shapes(problems.shape[:-1], configs.shape[:-1])
    p = problems.to(torch.float64).expand(*lead, problems.shape[-1])
    c = configs.to(torch.float64).expand(*lead, configs.shape[-1])
    m, n, k, db, _, tf32 = (p[..., i] for i in range(6))
    bm, bn, bk, _, _, warps = c.unbind(-1)
    cta_m, cta_n = torch.ceil(m / bm), torch.ceil(n / bn)
    ctas = cta_m * cta_n
    sms = spec.sm_count
    # Compute: peak scaled by the share of SMs busy and by how many warps feed the tensor cores.
    peak = torch.where(db == 2, torch.full_like(m, spec.peak_flops("float16")),
                       torch.where(tf32 > 0, torch.full_like(m, spec.peak_flops("float32", True)),
                                   torch.full_like(m, spec.peak_flops("float32"))))
    active = torch.clamp(ctas / sms, max=1.0)
    warp_eff = torch.clamp(ctas * warps / (sms * 4), max=1.0)
    # Padded work: a tile computes its whole BM x BN x BK-rounded block.
    work = 2 * (cta_m * bm) * (cta_n * bn) * (torch.ceil(k / bk) * bk)
    compute_ms = work / (peak * torch.clamp(active * warp_eff, min=1e-3)) * 1e3
    # Memory: 32 active CTAs saturate DRAM; re-reads of A (per CTA column) and B (per CTA row) hit L2 80%.
    dram_bw = spec.peak_bytes_per_s() * (torch.clamp(ctas / 32, max=1.0) * 0.95
                                         + torch.clamp((ctas - 32) / (sms - 32), 0.0, 1.0) * 0.05)
    l2_bw = 4 * spec.peak_bytes_per_s()
    a_bytes, b_bytes = m * k * db, k * n * db
    dram = a_bytes * (1 + 0.2 * (cta_n - 1)) + b_bytes * (1 + 0.2 * (cta_m - 1))
    l2 = (a_bytes * (cta_n - 1) + b_bytes * (cta_m - 1)) * 0.8
    load_ms = (dram / dram_bw + l2 / l2_bw) * 1e3
    store_ms = m * n * db / dram_bw * 1e3
    launch_ms = 0.004
    return torch.maximum(compute_ms, load_ms) + store_ms + launch_ms
