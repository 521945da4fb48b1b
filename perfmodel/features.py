"""The feature encoder: one versioned, batched, pure-torch object shared by training and serving.

Tensors in, tensors out; no pandas and no per-row Python. Problems and configs are numeric tensors
(columns below) that broadcast against each other, so P problems x C configs encode in one call.
Log-scale features are log()'d here; standardisation statistics live in the model artifact.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from .devices import DeviceSpec
from .schema import DTYPE_BYTES, GemmConfig, GemmProblem, PadProblem

ENCODER_VERSION = 1

PROBLEM_COLUMNS = ("m", "n", "k", "dtype_bytes", "is_bf16", "allow_tf32", "transpose_left", "transpose_right")
CONFIG_COLUMNS = ("block_m", "block_n", "block_k", "group_m", "num_stages", "num_warps")
PAD_COLUMNS = ("m", "k", "n", "dtype_bytes", "is_bf16", "allow_tf32", "transpose_left", "transpose_right",
               "prepadded_left", "prepadded_right", "alignment")

# The 12 features of PR 156851's model, in its order (all log'd).
PR156851_FEATURES = ("dtype_size", "dim_m", "dim_n", "dim_k", "total_gb", "total_gflop", "flops_per_byte",
                     "config_block_k", "config_block_m", "config_block_n", "config_num_stages", "config_num_warps")


def problems_tensor(problems: Sequence[GemmProblem], device: torch.device | str = "cpu") -> torch.Tensor:
    """(P, len(PROBLEM_COLUMNS)) float64."""
    rows = [(p.m, p.n, p.k, DTYPE_BYTES[p.dtype], p.dtype == "bfloat16", p.allow_tf32, p.transpose_left,
             p.transpose_right) for p in problems]
    # via numpy: torch.tensor on nested Python lists is several times slower (a hot path in serving)
    return torch.from_numpy(np.array(rows, dtype=np.float64).reshape(-1, len(PROBLEM_COLUMNS))).to(device)


def configs_tensor(configs: Sequence[GemmConfig], device: torch.device | str = "cpu") -> torch.Tensor:
    """(C, len(CONFIG_COLUMNS)) float64."""
    rows = [(c.block_m, c.block_n, c.block_k, c.group_m, c.num_stages, c.num_warps) for c in configs]
    return torch.from_numpy(np.array(rows, dtype=np.float64).reshape(-1, len(CONFIG_COLUMNS))).to(device)


def pad_tensor(problems: Sequence[PadProblem], device: torch.device | str = "cpu") -> torch.Tensor:
    rows = [(p.m, p.k, p.n, DTYPE_BYTES[p.dtype], p.dtype == "bfloat16", p.allow_tf32, p.transpose_left,
             p.transpose_right, p.prepadded_left, p.prepadded_right, p.alignment) for p in problems]
    return torch.from_numpy(np.array(rows, dtype=np.float64).reshape(-1, len(PAD_COLUMNS))).to(device)


def _stack(cols: list[torch.Tensor], lead: torch.Size) -> torch.Tensor:
    """Broadcast every column to the leading shape and stack: (N, F) float32, N = prod(lead).
    Written feature-major (each feature a contiguous row: cheap broadcast copies) and returned as
    its transpose, a strided (N, F) view that Linear layers read directly."""
    out = torch.empty(len(cols), *lead, dtype=torch.float32)
    for i, col in enumerate(cols):
        out[i] = col
    return out.reshape(len(cols), -1).T


def _cdiv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.ceil(a / b)


class FeatureEncoder:
    """Problem (+ config) columns -> raw feature matrix (float32), for one device.

    kind: "gemm" (problem x Triton config), "cublas" (problem only), "pad" (PadProblem),
    "pr156851" (the 12 log features of the PR 156851 baseline).
    """

    def __init__(self, spec: DeviceSpec, kind: str = "gemm") -> None:
        if kind not in ("gemm", "cublas", "pad", "pr156851"):
            raise ValueError(f"kind: unknown encoder kind {kind!r}")
        self.spec = spec
        self.kind = kind
        self.version = ENCODER_VERSION
        self.names = list(self._names())

    def _names(self) -> tuple[str, ...]:
        problem = ("log_m", "log_n", "log_k", "dtype_bytes", "is_bf16", "allow_tf32", "fp32_ieee",
                   "transpose_left", "transpose_right", "log_total_gb", "log_total_gflop", "log_flops_per_byte",
                   "m_mod16", "n_mod16", "k_mod16", "m_mod8", "n_mod8", "k_mod8",
                   "log_roofline_ms", "log_compute_ms", "log_memory_ms", "log_sm_count", "log_peak_tflops",
                   "log_dram_gbs")
        if self.kind == "cublas":
            return problem
        if self.kind == "pr156851":
            return PR156851_FEATURES
        if self.kind == "pad":
            return problem + ("prepadded_left", "prepadded_right", "log_pad_copy_gb", "pad_m_frac", "pad_k_frac",
                              "pad_n_frac", "log_padded_roofline_ms", "padded_all_aligned")
        return problem + ("log_block_m", "log_block_n", "log_block_k", "log_group_m", "num_stages", "num_warps",
                          "log_tiles", "log_waves", "last_wave_fill", "tile_waste_mn", "tile_waste_k",
                          "log_k_iters", "log_smem_stage_kb", "smem_frac", "log_acc_regs", "log_tile_intensity",
                          "log_tiled_load_gb", "log_tiled_load_ms", "log_full_waves", "log_grouped_rows")

    def __len__(self) -> int:
        return len(self.names)

    def _peak(self, dbytes: torch.Tensor, tf32: torch.Tensor) -> torch.Tensor:
        s = self.spec
        fp16 = s.peak_flops("float16")
        return torch.where(dbytes == 2, torch.full_like(dbytes, fp16),
                           torch.where(tf32 > 0, torch.full_like(dbytes, s.peak_flops("float32", True)),
                                       torch.full_like(dbytes, s.peak_flops("float32"))))

    def _problem_feats(self, m, n, k, db, bf16, tf32, tl, tr) -> list[torch.Tensor]:
        s = self.spec
        flops = 2 * m * n * k
        nbytes = (m * k + k * n + m * n) * db
        peak = self._peak(db, tf32)
        compute_ms = flops / peak * 1e3
        memory_ms = nbytes / s.peak_bytes_per_s() * 1e3
        ones = torch.ones_like(m)
        return [
            m.log(), n.log(), k.log(), db, bf16, tf32, ((db == 4) & (tf32 == 0)).to(m.dtype), tl, tr,
            (nbytes / 1e9).log(), (flops / 1e9).log(), (flops / nbytes).log(),
            (m % 16 == 0).to(m.dtype), (n % 16 == 0).to(m.dtype), (k % 16 == 0).to(m.dtype),
            (m % 8 == 0).to(m.dtype), (n % 8 == 0).to(m.dtype), (k % 8 == 0).to(m.dtype),
            torch.maximum(compute_ms, memory_ms).log(), compute_ms.log(), memory_ms.log(),
            ones * math.log(s.sm_count), (peak / 1e12).log(), ones * math.log(s.dram_bw_gbs),
        ]

    def encode_cross(self, problems: torch.Tensor, configs: torch.Tensor) -> torch.Tensor:
        """Every problem (P, 8) with every config (C, 6) -> (P * C, F), problem-major."""
        return self.encode(problems[:, None, :], configs[None, :, :])

    def encode(self, problems: torch.Tensor, configs: torch.Tensor | None = None) -> torch.Tensor:
        """problems (..., 8) [and configs (..., 6)], leading dims broadcastable -> (N, F) float32."""
        if self.kind == "pad":
            return self.encode_pad(problems)
        p = problems.to(torch.float64)
        if self.kind == "cublas":
            cols = self._problem_feats(*p.unbind(-1))
            return torch.stack(cols, -1).reshape(-1, len(self.names)).to(torch.float32)
        if configs is None:
            raise ValueError("configs: required for a GEMM encoder")
        c = configs.to(torch.float64)
        lead = torch.broadcast_shapes(p.shape[:-1], c.shape[:-1])
        # Problem-only and config-only features are computed on the unexpanded rows (P and C of them,
        # not P * C) and broadcast when stacked: most ops then touch a handful of elements.
        m, n, k, db, bf16, tf32, tl, tr = p.contiguous().unbind(-1)
        bm, bn, bk, gm, st, wp = c.contiguous().unbind(-1)
        if self.kind == "pr156851":
            flops = 2 * m * n * k
            nbytes = (m * k + k * n + m * n) * db
            cols = [db * 8, m, n, k, nbytes / 1e9, flops / 1e9, flops / nbytes, bk, bm, bn, st, wp]
            return _stack([x.log() for x in cols], lead)
        s = self.spec
        tiles_m, tiles_n = _cdiv(m, bm), _cdiv(n, bn)
        tiles = tiles_m * tiles_n
        waves = tiles / s.sm_count
        full_waves = _cdiv(tiles, torch.full_like(tiles, s.sm_count))
        k_iters = _cdiv(k, bk)
        smem_stage = (bm + bn) * bk * db
        # Bytes the tiled kernel loads from L2/DRAM: A is re-read per column of tiles, B per row of tiles.
        tiled_load = (m * k * tiles_n + k * n * tiles_m) * db + m * n * db
        tiled_load_ms = tiled_load / (s.peak_bytes_per_s() * 4) * 1e3  # L2 bandwidth ~4x DRAM, as a scale only
        cols = self._problem_feats(m, n, k, db, bf16, tf32, tl, tr) + [
            bm.log(), bn.log(), bk.log(), gm.log(), st, wp,
            tiles.log(), waves.log(), tiles / (full_waves * s.sm_count),
            (tiles_m * bm * tiles_n * bn / (m * n)).log(), (k_iters * bk / k).log(),
            k_iters.log(), (smem_stage / 1024).log(), smem_stage * st / s.shared_memory_per_block_optin,
            (bm * bn / (wp * 32)).log(), (bm * bn / (bm + bn)).log(),
            (tiled_load / 1e9).log(), tiled_load_ms.log(), full_waves.log(), torch.minimum(gm, tiles_m).log(),
        ]
        return _stack(cols, lead)

    def encode_pad(self, pads: torch.Tensor) -> torch.Tensor:
        """pads (N, len(PAD_COLUMNS)) -> (N, F)."""
        x = pads.to(torch.float64)
        m, k, n, db, bf16, tf32, tl, tr, ppl, ppr, al = x.unbind(-1)

        def up(d: torch.Tensor) -> torch.Tensor:
            return torch.where(d == 1, d, torch.ceil(d / al) * al)

        mp, kp, np_ = up(m), up(k), up(n)
        # Copies made by padding (zero-filled new operands), unless prepadded.
        copy_a = torch.where(((mp != m) | (kp != k)) & (ppl == 0), (mp * kp + m * k) * db, torch.zeros_like(m))
        copy_b = torch.where(((kp != k) | (np_ != n)) & (ppr == 0), (kp * np_ + k * n) * db, torch.zeros_like(m))
        padded = self._problem_feats(mp, np_, kp, db, bf16, tf32, torch.zeros_like(tl), torch.zeros_like(tr))
        cols = self._problem_feats(m, n, k, db, bf16, tf32, tl, tr) + [
            ppl, ppr, ((copy_a + copy_b) / 1e9 + 1e-9).log(), mp / m - 1, kp / k - 1, np_ / n - 1,
            padded[18], ((mp % 16 == 0) & (kp % 16 == 0) & (np_ % 16 == 0)).to(m.dtype),
        ]
        return torch.stack(cols, -1).reshape(-1, len(self.names)).to(torch.float32)
