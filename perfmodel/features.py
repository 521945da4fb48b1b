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

ENCODER_VERSION = 3  # 2: ten layout features for the pad head; 3: the device's max SM clock, L2 and shared memory
# Versions this code encodes (and so loads model folders of): a folder records the version it was trained with.
SUPPORTED_ENCODER_VERSIONS = (2, 3)
# Device features added in version 3, the last three problem features (so of every head but pr156851); with
# log_sm_count, log_peak_tflops (the row's dtype/tf32 peak) and log_dram_gbs they describe the device.
# Shared memory is the per-block opt-in limit (what one CTA may use: the per-SM figure less 1 KB on Hopper).
DEVICE_FEATURES = ("log_max_sm_clock_ghz", "log_l2_mb", "log_smem_optin_kb")

PROBLEM_COLUMNS = ("m", "n", "k", "dtype_bytes", "is_bf16", "allow_tf32", "transpose_left", "transpose_right")
CONFIG_COLUMNS = ("block_m", "block_n", "block_k", "group_m", "num_stages", "num_warps")
# A batched GEMM (bmm): the problem columns and its batch (the "bmm" and "bmm_aten" encoders).
BMM_PROBLEM_COLUMNS = PROBLEM_COLUMNS + ("batch",)
# What the bmm encoders add to the GEMM ("bmm") and problem ("bmm_aten") features of one matrix of the
# batch: the batch, the whole bmm's roofline (flops and bytes scaled by the batch: the physical floor's
# column) and, for a config, the grid Inductor's bmm template launches -- tiles x batch programs -- in waves
# over the SMs.
BMM_FEATURES = ("log_batch", "log_bmm_roofline_ms", "log_bmm_waves", "bmm_last_wave_fill")
BMM_ATEN_FEATURES = BMM_FEATURES[:2]
PAD_COLUMNS = ("m", "k", "n", "dtype_bytes", "is_bf16", "allow_tf32", "transpose_left", "transpose_right",
               "prepadded_left", "prepadded_right", "alignment")

# The 12 features of PR 156851's model, in its order (all log'd).
PR156851_FEATURES = ("dtype_size", "dim_m", "dim_n", "dim_k", "total_gb", "total_gflop", "flops_per_byte",
                     "config_block_k", "config_block_m", "config_block_n", "config_num_stages", "config_num_warps")


def problems_array(problems: Sequence[GemmProblem]) -> np.ndarray:
    """(P, len(PROBLEM_COLUMNS)) float64, from each problem's cached packed row (GemmProblem.packed)."""
    if len(problems) == 1:  # one problem (a rank call): its packed row as it is, no join
        return np.frombuffer(problems[0].packed, dtype=np.float64).reshape(1, len(PROBLEM_COLUMNS))
    return np.frombuffer(b"".join([p.packed for p in problems]), dtype=np.float64).reshape(-1, len(PROBLEM_COLUMNS))


def problems_tensor(problems: Sequence[GemmProblem], device: torch.device | str = "cpu") -> torch.Tensor:
    """(P, len(PROBLEM_COLUMNS)) float64."""
    return torch.from_numpy(problems_array(problems).copy()).to(device)


def configs_tensor(configs: Sequence[GemmConfig], device: torch.device | str = "cpu") -> torch.Tensor:
    """(C, len(CONFIG_COLUMNS)) float64. Joins each config's cached packed row (GemmConfig.packed):
    ~10x faster than converting the fields of a few hundred configs per call (a hot path in serving)."""
    buf = bytearray(b"".join([c.packed for c in configs]))
    return torch.frombuffer(buf, dtype=torch.float64).reshape(-1, len(CONFIG_COLUMNS)).to(device) if buf \
        else torch.empty(0, len(CONFIG_COLUMNS), dtype=torch.float64, device=device)


def bmm_problems_tensor(problems: Sequence[GemmProblem], device: torch.device | str = "cpu") -> torch.Tensor:
    """(P, len(BMM_PROBLEM_COLUMNS)) float64: the problem columns and each problem's batch."""
    batch = np.array([[p.batch] for p in problems], dtype=np.float64).reshape(-1, 1)
    return torch.from_numpy(np.concatenate([problems_array(problems), batch], 1)).to(device)


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


class FeatureEncoder:
    """Problem (+ config) columns -> raw feature matrix (float32), for one device.

    kind: "gemm" (problem x Triton config), "cublas" (problem only), "pad" (PadProblem),
    "pr156851" (the 12 log features of the PR 156851 baseline), "bmm" (a batched problem, BMM_PROBLEM_COLUMNS,
    x a config of Inductor's bmm template: the gemm features of one matrix and BMM_FEATURES), "bmm_aten" (a
    batched problem alone: the cublas features of one matrix and BMM_ATEN_FEATURES).
    """

    KINDS = ("gemm", "cublas", "pad", "pr156851", "bmm", "bmm_aten")
    # the encoder whose features a bmm encoder's start with
    _BASE = {"bmm": "gemm", "bmm_aten": "cublas"}

    def __init__(self, spec: DeviceSpec, kind: str = "gemm", version: int = ENCODER_VERSION) -> None:
        if kind not in self.KINDS:
            raise ValueError(f"kind: unknown encoder kind {kind!r}")
        if version not in SUPPORTED_ENCODER_VERSIONS:
            raise ValueError(f"version: encoder version {version!r} is not one of {SUPPORTED_ENCODER_VERSIONS}")
        self.spec = spec
        self.kind = kind
        self._base_kind = self._BASE.get(kind, kind)
        self.version = version
        # problem features: 24, plus the device features from version 3
        self._np = 24 + (len(DEVICE_FEATURES) if version >= 3 else 0)
        self.names = list(self._names())
        self._build_maps()

    def _names(self) -> tuple[str, ...]:
        problem = ("log_m", "log_n", "log_k", "dtype_bytes", "is_bf16", "allow_tf32", "fp32_ieee",
                   "transpose_left", "transpose_right", "log_total_gb", "log_total_gflop", "log_flops_per_byte",
                   "m_mod16", "n_mod16", "k_mod16", "m_mod8", "n_mod8", "k_mod8",
                   "log_roofline_ms", "log_compute_ms", "log_memory_ms", "log_sm_count", "log_peak_tflops",
                   "log_dram_gbs") + (DEVICE_FEATURES if self.version >= 3 else ())
        if self.kind == "cublas":
            return problem
        if self.kind == "bmm_aten":
            return problem + BMM_ATEN_FEATURES
        if self.kind == "pr156851":
            return PR156851_FEATURES
        if self.kind == "pad":
            return problem + ("prepadded_left", "prepadded_right", "log_pad_copy_gb", "pad_m_frac", "pad_k_frac",
                              "pad_n_frac", "log_padded_roofline_ms", "padded_all_aligned",
                              # leading dimensions (bytes) 16-aligned, before and after padding, and the
                              # two copies apart (a copy of a transposed operand is a strided read)
                              "lda_aligned16", "ldb_aligned16", "ldc_aligned16", "padded_lda_aligned16",
                              "padded_ldb_aligned16", "padded_ldc_aligned16", "log_copy_a_gb", "log_copy_b_gb",
                              "copy_a_transposed", "copy_b_transposed")
        return problem + ("log_block_m", "log_block_n", "log_block_k", "log_group_m", "num_stages", "num_warps",
                          "log_tiles", "log_waves", "last_wave_fill", "tile_waste_mn", "tile_waste_k",
                          "log_k_iters", "log_smem_stage_kb", "smem_frac", "log_acc_regs", "log_tile_intensity",
                          "log_tiled_load_gb", "log_tiled_load_ms", "log_full_waves", "log_grouped_rows") \
            + (BMM_FEATURES if self.kind == "bmm" else ())

    def __len__(self) -> int:
        return len(self.names)

    # ------------------------------------------------------------------------------------------------
    # Most features are logs of products and ratios of a few quantities, so they are computed as linear
    # maps (small matmuls) of a handful of logs. Serving one problem is bound by per-op dispatch (5-10 us
    # an op on a small CPU), not by arithmetic: this form needs ~50 ops where a feature-by-feature one
    # needs ~150. Only concatenation, no in-place writes, so the ONNX exporter traces it with dynamic
    # shapes. tests/test_features.py checks every feature against a feature-by-feature reference.
    def _build_maps(self) -> None:
        """The problem features' maps (every kind), then the GEMM encoders' (_build_gemm_maps)."""
        s, f64 = self.spec, torch.float64
        L = math.log
        # Problem: basis [log m, log n, log k, log dtype_bytes, log(mn + nk + km), log peak FLOP/s,
        # log roofline ms, dtype_bytes, is_bf16, allow_tf32, transpose_left, transpose_right,
        # m,n,k % 16 == 0, m,n,k % 8 == 0, fp32_ieee] @ block map + bias -> the 24 problem features (27 from
        # version 3: the device features, constants of the bias).
        # log compute ms and log memory ms (whose max is the roofline) come from the first six.
        roof = torch.zeros(6, 2, dtype=f64)
        roof[0:3, 0] = 1; roof[5, 0] = -1                                                   # compute ms
        roof[3:5, 1] = 1                                                                    # memory ms
        roof_bias = torch.tensor([L(2) + L(1e3), L(1e3) - L(s.peak_bytes_per_s())], dtype=f64)
        npf = self._np
        m = torch.zeros(19, npf, dtype=f64)
        m[0, 0] = m[1, 1] = m[2, 2] = 1                                                     # log m, n, k
        m[7, 3] = m[8, 4] = m[9, 5] = 1                                                     # bytes, bf16, tf32
        m[18, 6] = 1                                                                        # fp32_ieee
        m[10, 7] = m[11, 8] = 1                                                             # transposes
        m[3:5, 9] = 1                                                                       # total GB
        m[0:3, 10] = 1                                                                      # total GFLOP
        m[0:3, 11] = 1; m[3:5, 11] = -1                                                     # flops per byte
        for j in range(6):
            m[12 + j, 12 + j] = 1                                                           # alignment flags
        m[6, 18] = 1                                                                        # roofline
        m[0:6, 19] = roof[:, 0]; m[0:6, 20] = roof[:, 1]                                    # compute, memory
        m[5, 22] = 1                                                                        # peak TFLOP/s
        bias = torch.zeros(npf, dtype=f64)
        bias[9], bias[10], bias[11] = -L(1e9), L(2) - L(1e9), L(2)
        bias[19], bias[20] = roof_bias[0], roof_bias[1]
        bias[21], bias[22], bias[23] = L(s.sm_count), -L(1e12), L(s.dram_bw_gbs)
        if npf > 24:                                                                        # device (v3)
            bias[24:27] = torch.tensor([L(s.max_sm_clock_mhz / 1e3), L(s.l2_bytes / 2**20),
                                        L(s.shared_memory_per_block_optin / 1024)], dtype=f64)
        self._roof_map, self._roof_bias, self._block_map, self._block_bias = roof, roof_bias, m, bias
        # peak FLOP/s by key 2 * dtype_bytes + allow_tf32 (fp16/bf16 ignore the tf32 flag)
        peaks = torch.ones(10, dtype=f64)
        peaks[4] = peaks[5] = s.peak_flops("float16")
        peaks[8], peaks[9] = s.peak_flops("float32"), s.peak_flops("float32", True)
        self._peaks = peaks
        # p @ _peak_key: 2 * dtype_bytes + allow_tf32, the peak's index (fp16/bf16 ignore the tf32 flag)
        self._peak_key = torch.zeros(len(PROBLEM_COLUMNS), 1, dtype=f64)
        self._peak_key[3, 0], self._peak_key[5, 0] = 2, 1
        # p @ _flag_map: m/16, n/16, k/16, m/8, n/8, k/8 and (2 * dtype_bytes + allow_tf32)/8, each an integer
        # exactly when its flag holds (dyadic scalings: exact in float64). The last is fp32 without tf32:
        # that key is 8; fp16/bf16 give 4 or 5, fp32 with tf32 9.
        flag_map = torch.zeros(len(PROBLEM_COLUMNS), 7, dtype=f64)
        for j, mod in enumerate((16, 16, 16, 8, 8, 8)):
            flag_map[j % 3, j] = 1 / mod
        flag_map[3, 6], flag_map[5, 6] = 2 / 8, 1 / 8
        self._flag_map = flag_map
        self._rotate = torch.tensor([1, 2, 0])
        if self._base_kind == "gemm":
            self._build_gemm_maps()

    def _build_gemm_maps(self) -> None:
        """The GEMM encoders' maps (gemm, bmm): the config features as linear maps of a few logs."""
        s, f64, L, npf = self.spec, torch.float64, math.log, self._np
        # GEMM, three linear parts summed into the 20 config features:
        # cross  [log tiles_m, log tiles_n, log k_iters, log tiled load bytes, log full waves, log grouped rows,
        #         last wave fill, smem fraction]
        # config [log bm, log bn, log bk, log group_m, log(bm + bn), log warps, stages, warps, 1]
        # problem [log m, log n, log k, log dtype_bytes]
        z = torch.zeros(8, 20, dtype=f64)
        z[6, 8] = 1 / s.sm_count                        # last wave fill: tiles / (full waves * SMs), not log'd
        z[7, 13] = 1                                    # smem fraction (not log'd)
        z[0:2, 6] = 1                                   # log tiles
        z[0:2, 7] = 1                                   # log waves (- log SMs below)
        z[0:2, 9] = 1                                   # tile waste mn
        z[2, 10] = 1                                    # tile waste k
        z[2, 11] = 1                                    # log k iters
        z[3, 16] = z[3, 17] = 1                         # tiled load GB, ms
        z[4, 18] = 1                                    # log full waves
        z[5, 19] = 1                                    # log grouped rows
        c = torch.zeros(9, 20, dtype=f64)
        c[0, 0] = c[1, 1] = c[2, 2] = c[3, 3] = 1       # log block m/n/k, log group_m
        c[6, 4] = c[7, 5] = 1                           # stages, warps (not log'd)
        c[8, 7] = -L(s.sm_count)
        c[0:2, 9] = 1
        c[2, 10] = 1
        c[4, 12] = c[2, 12] = 1; c[8, 12] = -L(1024)    # log smem per stage KB (+ log dtype_bytes)
        c[0:2, 14] = 1; c[5, 14] = -1; c[8, 14] = -L(32)  # log accumulator registers per thread
        c[0:2, 15] = 1; c[4, 15] = -1                   # log tile intensity
        c[8, 16] = -L(1e9)
        c[8, 17] = L(1e3) - L(s.peak_bytes_per_s() * 4)  # L2 bandwidth ~4x DRAM, as a scale only
        q = torch.zeros(4, 20, dtype=f64)
        q[0:2, 9] = -1                                  # tile waste mn: / (m n)
        q[2, 10] = -1                                   # tile waste k: / k
        q[3, 12] = 1                                    # smem per stage: * dtype_bytes
        def wide(m: torch.Tensor) -> torch.Tensor:  # the 20 GEMM columns placed after the problem ones
            return torch.cat([torch.zeros(m.shape[0], npf, dtype=f64), m], 1)

        self._cross_map44 = wide(z).to(torch.float32)
        self._config_map44 = wide(c)
        # the problem part: basis @ block map, plus its first four columns (log m, n, k, dtype_bytes) @ q
        self._problem_map44 = torch.cat([self._block_map, torch.zeros(19, 20, dtype=f64)], 1)
        self._problem_map44[0:4] += wide(q)
        self._load_map = torch.zeros(3, 3, dtype=f64)                 # (mn, nk, km) db -> (nk, km, 0) db
        self._load_map[1, 0] = self._load_map[2, 1] = 1
        self._block_bias44 = torch.cat([self._block_bias, torch.zeros(20, dtype=f64)])
        self._sm = torch.tensor(float(s.sm_count), dtype=f64)
        self._smem_optin = torch.tensor(float(s.shared_memory_per_block_optin), dtype=f64)

    def _problem_block(self, p: torch.Tensor) -> torch.Tensor:
        """(..., 8) problem columns (float64) -> (..., 24 or 27) problem features (float64), in name order."""
        return self._problem_basis(p)[0] @ self._block_map + self._block_bias

    def _problem_basis(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the 19-column basis of the problem features, (mn, nk, km), (m, n, k)); the GEMM part
        reuses the last two."""
        mnk = p[..., 0:3]
        prods = mnk * mnk[..., self._rotate]                                   # mn, nk, km
        peak = self._peaks[(p @ self._peak_key).long()]                         # (..., 1)
        logs = torch.cat([p[..., 0:4], prods.sum(-1, keepdim=True), peak], -1).log()
        roofline = (logs @ self._roof_map + self._roof_bias).amax(-1, keepdim=True)
        q = p @ self._flag_map
        flags = (q == q.floor()).to(p.dtype)                                    # m,n,k % 16, % 8; fp32_ieee
        return torch.cat([logs, roofline, p[..., 3:8], flags], -1), prods, mnk

    def encode_problems_cross(self, problems: Sequence[GemmProblem], configs: torch.Tensor,
                              config_part: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """encode_cross on a list of GemmProblems (problems_tensor, then encode_cross)."""
        return self.encode_cross(problems_tensor(problems), configs, config_part)

    def encode_cross(self, problems: torch.Tensor, configs: torch.Tensor,
                     config_part: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Every problem (P, 8) with every config (C, 6) -> (P * C, F), problem-major.
        config_part: self.config_part(configs), when the caller keeps it."""
        return self.encode(problems[:, None, :], configs[None, :, :],
                           None if config_part is None else tuple(t.unsqueeze(0) for t in config_part))

    def encode(self, problems: torch.Tensor, configs: torch.Tensor | None = None,
               config_part: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """problems (..., 8) [and configs (..., 6)], leading dims broadcastable -> (N, F) float32."""
        if self.kind == "pad":
            return self.encode_pad(problems)
        if self.kind in self._BASE:
            return self._encode_bmm(problems, configs, config_part)
        p = problems.to(torch.float64)
        if self.kind == "cublas":
            return self._problem_block(p).reshape(-1, len(self.names)).to(torch.float32)
        if configs is None:
            raise ValueError("configs: required for a GEMM encoder")
        c = configs.to(torch.float64)
        if self.kind == "pr156851":
            lead = torch.broadcast_shapes(p.shape[:-1], c.shape[:-1])
            m, n, k, db = p.unbind(-1)[:4]
            bm, bn, bk, _, st, wp = c.unbind(-1)
            flops = 2 * m * n * k
            nbytes = (m * k + k * n + m * n) * db
            cols = [db * 8, m, n, k, nbytes / 1e9, flops / 1e9, flops / nbytes, bk, bm, bn, st, wp]
            return _stack([x.log() for x in cols], lead)
        cross, cfg_part, per_problem = self._gemm_parts(p, c, config_part)
        x = cross @ self._cross_map44 + cfg_part + per_problem
        return x.reshape(-1, len(self.names))

    def _encode_bmm(self, problems: torch.Tensor, configs: torch.Tensor | None,
                    config_part: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """problems (..., 9) BMM_PROBLEM_COLUMNS [and configs (..., 6)] -> (N, F): one matrix's gemm (or
        cublas) features, then BMM_FEATURES (BMM_ATEN_FEATURES)."""
        p = problems.to(torch.float64)
        one, log_b = p[..., :8], p[..., 8:9].log()                              # (..., 8), (..., 1)
        block = self._problem_block(one)
        roofline = block[..., 18:19] + log_b                                    # the whole batch's, log ms
        if self.kind == "bmm_aten":
            return torch.cat([block, log_b, roofline], -1).reshape(-1, len(self.names)).to(torch.float32)
        if configs is None:
            raise ValueError("configs: required for a GEMM encoder")
        c = configs.to(torch.float64)
        cross, cfg_part, per_problem = self._gemm_parts(one, c, config_part)
        x = (cross @ self._cross_map44 + cfg_part + per_problem)[..., : len(self.names) - len(BMM_FEATURES)]
        # the bmm template's grid: cdiv(m, BM) * cdiv(n, BN) tiles for each matrix of the batch
        programs = (torch.ceil(one[..., 0:1] / c[..., 0:1]) * torch.ceil(one[..., 1:2] / c[..., 1:2])
                    * p[..., 8:9])
        waves = torch.ceil(programs / self._sm)
        lead = x.shape[:-1]
        extra = torch.cat([log_b.expand(*lead, 1), roofline.expand(*lead, 1), (programs / self._sm).log(),
                           programs / (waves * self._sm)], -1).to(torch.float32)
        return torch.cat([x, extra], -1).reshape(-1, len(self.names))

    def cross_parts(self, problems: torch.Tensor, configs: torch.Tensor,
                    config_part: tuple[torch.Tensor, torch.Tensor] | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """encode_cross's three parts, float32: (cross (P, C, 8), config part (1, C, F), problem part
        (P, 1, F)), whose rows encode as cross @ cross_map + config part + problem part. For a graph that
        needs a few rows of the (P * C, F) features, or a linear map of them, not all of them."""
        return self._gemm_parts(problems[:, None, :].to(torch.float64), configs[None, :, :].to(torch.float64),
                                None if config_part is None else tuple(t.unsqueeze(0) for t in config_part))

    @property
    def cross_map(self) -> torch.Tensor:
        """(8, F) float32: the cross part's map into the features (cross_parts)."""
        return self._cross_map44

    def _gemm_parts(self, p: torch.Tensor, c: torch.Tensor,
                    config_part: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # Problem-only and config-only parts are computed on the unexpanded rows (P and C of them, not
        # P * C); only the tile counts and what depends on them are per (problem, config).
        cfg_part, cfg_smem = self.config_part(c) if config_part is None else config_part
        basis, prods, mnk = self._problem_basis(p)
        tiles_mnk = torch.ceil(mnk / c[..., 0:3])                              # tiles_m, tiles_n, k_iters
        tiles = tiles_mnk[..., 0:2].prod(-1, keepdim=True)
        full_waves = torch.ceil(tiles / self._sm)
        # Bytes the tiled kernel loads from L2/DRAM: A is re-read per column of tiles, B per row of
        # tiles, plus the output: (tiles_m nk + tiles_n km + mn) * dtype_bytes.
        db = p[..., 3:4]
        load_coef = (prods * db) @ self._load_map                              # nk db, km db, 0
        tiled_load = (tiles_mnk * load_coef).sum(-1, keepdim=True) + prods[..., 0:1] * db
        grouped = torch.minimum(c[..., 3:4], tiles_mnk[..., 0:1])
        cross = torch.cat([torch.cat([tiles_mnk, tiled_load, full_waves, grouped], -1).log(),
                           tiles / full_waves, cfg_smem * db], -1)
        # All three parts are written full width (44 features, 47 from version 3; zeros where they have no feature) and summed with
        # broadcasting: no expand/concatenate of the (P, C) result. float32 from here (the features'
        # type): the (P, C) arrays are the only large ones.
        per_problem = (basis @ self._problem_map44 + self._block_bias44).to(torch.float32)
        return cross.to(torch.float32), cfg_part, per_problem

    def config_part(self, configs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The config-only part of a GEMM encoding, (..., F) float32 and (..., 1): a caller that encodes many
        problems against one config set may compute it once and pass it to encode(config_part=...)."""
        c = configs.to(torch.float64)
        bm_plus_bn = c[..., 0:1] + c[..., 1:2]
        config_in = torch.cat([torch.cat([c[..., 0:4], bm_plus_bn, c[..., 5:6]], -1).log(), c[..., 4:6]], -1)
        part = (config_in @ self._config_map44[:8] + self._config_map44[8]).to(torch.float32)
        smem = bm_plus_bn * c[..., 2:3] * c[..., 4:5] / self._smem_optin      # smem fraction / dtype_bytes
        return part, smem

    def encode_pad(self, pads: torch.Tensor) -> torch.Tensor:
        """pads (N, len(PAD_COLUMNS)) -> (N, F)."""
        x = pads.to(torch.float64)
        m, k, n, db, bf16, tf32, tl, tr, ppl, ppr, al = x.unbind(-1)

        def up(d: torch.Tensor) -> torch.Tensor:
            return torch.where(d == 1, d, torch.ceil(d / al) * al)

        mp, kp, np_ = up(m), up(k), up(n)
        a_changed, b_changed = (mp != m) | (kp != k), (kp != k) | (np_ != n)
        # Copies made by padding (zero-filled new operands), unless prepadded.
        copy_a = torch.where(a_changed & (ppl == 0), (mp * kp + m * k) * db, torch.zeros_like(m))
        copy_b = torch.where(b_changed & (ppr == 0), (kp * np_ + k * n) * db, torch.zeros_like(m))
        zero = torch.zeros_like(tl)
        padded_roofline = self._problem_block(torch.stack([mp, np_, kp, db, bf16, tf32, zero, zero], -1))[..., 18]
        # Leading dimensions, elements: A (m, k) row-major -> k, transposed (a view of (k, m)) -> m; B (k, n)
        # -> n, transposed -> k; C -> n. A padded operand is a fresh row-major tensor (F.pad's output);
        # one that is not padded keeps its layout.
        lda, ldb = torch.where(tl > 0, m, k), torch.where(tr > 0, k, n)
        padded_lda, padded_ldb = torch.where(a_changed, kp, lda), torch.where(b_changed, np_, ldb)
        lds = torch.stack([lda, ldb, n, padded_lda, padded_ldb, np_], -1)
        aligned16 = (lds * db.unsqueeze(-1) % 16 == 0).to(m.dtype)
        extra = torch.stack([
            ppl, ppr, ((copy_a + copy_b) / 1e9 + 1e-9).log(), mp / m - 1, kp / k - 1, np_ / n - 1,
            padded_roofline, ((mp % 16 == 0) & (kp % 16 == 0) & (np_ % 16 == 0)).to(m.dtype),
        ], -1)
        copies = torch.stack([(copy_a / 1e9 + 1e-6).log(), (copy_b / 1e9 + 1e-6).log(),
                              ((copy_a > 0) & (tl > 0)).to(m.dtype), ((copy_b > 0) & (tr > 0)).to(m.dtype)], -1)
        cols = torch.cat([self._problem_block(torch.stack([m, n, k, db, bf16, tf32, tl, tr], -1)), extra,
                          aligned16, copies], -1)
        return cols.reshape(-1, len(self.names)).to(torch.float32)
