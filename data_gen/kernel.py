"""The canonical Triton GEMM kernel (Triton's matmul tutorial / Inductor's mm template), in one place.

A 1-D grid of cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N) programs in grouped (GROUP_M) order, masked loads
along K, tl.dot accumulating in fp32, the result cast to the output dtype, masked store.
M and N are not specialised (they only enter masks and the grid); K and the strides are, so the
compiled kernel depends on the config, dtype, layout and the 16-divisibility of K and the strides.
"""
from __future__ import annotations

import hashlib
import inspect

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["M", "N"])
def matmul_kernel(
    # Pointers
    a_ptr, b_ptr, c_ptr,
    # Matrix dimensions
    M, N, K,
    # Strides (elements)
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    # Meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,  # "tf32" or "ieee" for fp32 inputs (Inductor's ALLOW_TF32)
    A_M_CONTIGUOUS: tl.constexpr = False,  # A column-major (stride_am == 1)
    B_N_CONTIGUOUS: tl.constexpr = False,  # B row-major (stride_bn == 1)
):
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    # Rows/cols wrap (% M, % N) so A/B loads need no mask along M/N; the store is masked.
    # M and N are not specialised, so where M (N) is A's (B's) contiguous dim, say what Inductor's mm
    # template says: the wrapped offsets are contiguous runs -- else those loads are not vectorised.
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    if A_M_CONTIGUOUS:
        offs_am = tl.max_contiguous(tl.multiple_of(offs_am, BLOCK_M), BLOCK_M)
    if B_N_CONTIGUOUS:
        offs_bn = tl.max_contiguous(tl.multiple_of(offs_bn, BLOCK_N), BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)  # (BM, BK)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)  # (BK, BN)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c = acc.to(c_ptr.dtype.element_ty)

    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    tl.store(c_ptrs, c, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


def kernel_source_hash() -> str:
    """Hash of the kernel's source: a shard refuses rows from another kernel version."""
    return hashlib.sha256(inspect.getsource(matmul_kernel.fn).encode()).hexdigest()[:16]


def input_precision(dtype: torch.dtype, allow_tf32: bool) -> str:
    return "tf32" if (dtype == torch.float32 and allow_tf32) else "ieee"


def grid_size(M: int, N: int, block_m: int, block_n: int) -> int:
    return triton.cdiv(M, block_m) * triton.cdiv(N, block_n)


def launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, cfg, allow_tf32: bool = False, *,
           hints: bool = True, kernel=None) -> None:
    """c = a @ b with one config (a: (M, K), b: (K, N), any strides; c: (M, N) row-major).
    hints=False leaves out the contiguity hints (kernel v1's behaviour); kernel: another compile of
    this source (the GPU check scripts compare specialisations), default matmul_kernel."""
    M, K = a.shape
    _, N = b.shape
    (kernel or matmul_kernel)[(grid_size(M, N, cfg.block_m, cfg.block_n),)](
        a, b, c, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        INPUT_PRECISION=input_precision(a.dtype, allow_tf32),
        A_M_CONTIGUOUS=hints and a.stride(0) == 1, B_N_CONTIGUOUS=hints and b.stride(1) == 1,
        num_stages=cfg.num_stages, num_warps=cfg.num_warps,
    )


def matmul(a: torch.Tensor, b: torch.Tensor, cfg, allow_tf32: bool = False) -> torch.Tensor:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} do not multiply")
    c = torch.empty((a.shape[0], b.shape[1]), device=a.device, dtype=a.dtype)
    launch(a, b, c, cfg, allow_tf32)
    return c


def warmup(dtype: torch.dtype, strides: tuple[int, ...], K: int, cfg, allow_tf32: bool) -> None:
    """Compile (no launch) the kernel for one specialisation, as a worker process does."""
    matmul_kernel.warmup(
        dtype, dtype, dtype, 1024, 1024, K, *strides,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        INPUT_PRECISION=input_precision(dtype, allow_tf32),
        A_M_CONTIGUOUS=strides[0] == 1, B_N_CONTIGUOUS=strides[3] == 1,
        num_stages=cfg.num_stages, num_warps=cfg.num_warps, grid=(1,),
    )
