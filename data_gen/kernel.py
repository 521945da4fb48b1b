"""The canonical Triton GEMM kernel of the dataset (kernel v4): Inductor's mm template, compiled as its
users get it.

The body is Inductor's `triton_mm` template (torch/_inductor/kernel/templates/triton_mm.py.jinja, torch
2.11-2.13): a 1-D grid of cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N) programs in grouped (GROUP_M) order,
rows/cols wrapped (% M, % N) so that the operand loads need no M/N mask, K loads masked unless EVEN_K,
`tl.dot` accumulating in fp32, the result cast to the output dtype, masked store. What Inductor decides
at compile time from its static shapes is decided here on the host and passed as constexprs, with the
same rules: EVEN_K (K % BLOCK_K == 0) and the contiguity hints on the wrapped row/col offsets
(`_hints`). M, N, K and the strides get Triton's default specialisation (equal to 1, divisible by 16),
which is what a `@triton.autotune` user's kernel gets; Inductor bakes the shapes in as constants, so it
also knows that 1000 divides by 8 (vectorised 16-byte loads and stores of fp16 rows): sizes that are
neither 1 nor multiples of 16 are passed divided by their power-of-two divisor, which the kernel
multiplies back by a constexpr (`divisor`). Measured on the H100 before that (kernel_fidelity): 1000^3
fp16 ran 1.77x slower than Inductor's compile per config, aligned shapes 1.03-1.08x.
`benchmarks/studies/kernel_fidelity.py` times this kernel beside Inductor's own compile of the template.

`matmul_kernel_v3` is the dataset's previous kernel (M and N not specialised, hints only on column-major
A / row-major B, K always masked), kept to compare against.
"""
from __future__ import annotations

import hashlib
import inspect

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from .shards import STATIC_KIND  # noqa: F401  (the shard kind of rows timed with static_kernel_mode)


@triton.jit
def matmul_kernel(
    # Pointers
    a_ptr, b_ptr, c_ptr,
    # Matrix dimensions, each divided by its DIV_ (see `divisors`)
    M_q, N_q, K_q,
    # Strides (elements), likewise
    stride_am_q, stride_ak_q, stride_bk_q, stride_bn_q, stride_cm_q, stride_cn_q,
    # Meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,  # "tf32" or "ieee" for fp32 inputs (Inductor's ALLOW_TF32)
    EVEN_K: tl.constexpr,           # K % BLOCK_K == 0: no K mask
    A_HINT: tl.constexpr,           # the wrapped A rows are contiguous runs of BLOCK_M (see _hints)
    B_HINT: tl.constexpr,           # the wrapped B cols are contiguous runs of BLOCK_N
    # Power-of-two divisors (1, 2, 4 or 8) of the sizes that are neither 1 nor multiples of 16
    DIV_M: tl.constexpr, DIV_N: tl.constexpr, DIV_K: tl.constexpr, DIV_AM: tl.constexpr, DIV_AK: tl.constexpr,
    DIV_BK: tl.constexpr, DIV_BN: tl.constexpr, DIV_CM: tl.constexpr, DIV_CN: tl.constexpr,
):
    # A size times a constant: the compiler knows it divides by DIV_ (vectorised loads and stores), as
    # Inductor's compile knows from its constant shapes. 1 and multiples of 16 are Triton's own
    # specialisation (DIV_ = 1 there).
    M = M_q * DIV_M
    N = N_q * DIV_N
    K = K_q * DIV_K
    stride_am = stride_am_q * DIV_AM
    stride_ak = stride_ak_q * DIV_AK
    stride_bk = stride_bk_q * DIV_BK
    stride_bn = stride_bn_q * DIV_BN
    stride_cm = stride_cm_q * DIV_CM
    stride_cn = stride_cn_q * DIV_CN
    pid = tl.program_id(0)
    grid_m = (M + BLOCK_M - 1) // BLOCK_M
    grid_n = (N + BLOCK_N - 1) // BLOCK_N

    # re-order program ID for better L2 performance
    width = GROUP_M * grid_n
    group_id = pid // width
    group_size = min(grid_m - group_id * GROUP_M, GROUP_M)
    pid_m = group_id * GROUP_M + (pid % group_size)
    pid_n = (pid % width) // (group_size)
    tl.assume(pid_m >= 0)
    tl.assume(pid_n >= 0)

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if A_HINT:
        offs_a_m = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)
    else:
        offs_a_m = rm % M
    if B_HINT:
        offs_b_n = tl.max_contiguous(tl.multiple_of(rn % N, BLOCK_N), BLOCK_N)
    else:
        offs_b_n = rn % N
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)

    for k_idx in range(0, tl.cdiv(K, BLOCK_K)):
        a_k_idx_vals = offs_k[None, :] + (k_idx * BLOCK_K)  # (1, BK)
        b_k_idx_vals = offs_k[:, None] + (k_idx * BLOCK_K)  # (BK, 1)
        a_ptrs = a_ptr + (offs_a_m[:, None] * stride_am + a_k_idx_vals * stride_ak)  # (BM, BK)
        b_ptrs = b_ptr + (b_k_idx_vals * stride_bk + offs_b_n[None, :] * stride_bn)  # (BK, BN)
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=offs_k[None, :] < (K - k_idx * BLOCK_K), other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < (K - k_idx * BLOCK_K), other=0.0)
        acc += tl.dot(a, b, input_precision=INPUT_PRECISION, out_dtype=tl.float32)

    # rematerialize rm and rn to save registers
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    idx_m = rm[:, None]
    idx_n = rn[None, :]
    mask = (idx_m < M) & (idx_n < N)
    tl.store(c_ptr + (idx_m * stride_cm + idx_n * stride_cn), acc.to(c_ptr.dtype.element_ty), mask)


@triton.jit(do_not_specialize=["M", "N"])
def matmul_kernel_v3(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, A_M_CONTIGUOUS: tl.constexpr = False, B_N_CONTIGUOUS: tl.constexpr = False,
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
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    if A_M_CONTIGUOUS:
        offs_am = tl.max_contiguous(tl.multiple_of(offs_am, BLOCK_M), BLOCK_M)
    if B_N_CONTIGUOUS:
        offs_bn = tl.max_contiguous(tl.multiple_of(offs_bn, BLOCK_N), BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
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


def kernel_mode() -> str:
    """What the dataset's kernel is, recorded in every shard header (`perfmodel data info`)."""
    return "v4: inductor mm template body, triton default specialisation, EVEN_K and hints as inductor"


def static_kernel_mode() -> str:
    """The kernel mode of `gemm_static` shards: the v4 source compiled for one problem's shape, as
    Inductor compiles its mm template (`matmul_kernel` with static=True)."""
    return ("v4 static: the v4 source with every size and stride a constexpr, as inductor compiles its mm "
            "template for static shapes (one compile per problem and config)")


def kernel_source_hash() -> str:
    """Hash of the kernel's source: a shard refuses rows from another kernel version."""
    return hashlib.sha256(inspect.getsource(matmul_kernel.fn).encode()).hexdigest()[:16]


def input_precision(dtype: torch.dtype, allow_tf32: bool) -> str:
    return "tf32" if (dtype == torch.float32 and allow_tf32) else "ieee"


def grid_size(M: int, N: int, block_m: int, block_n: int) -> int:
    return triton.cdiv(M, block_m) * triton.cdiv(N, block_n)


def _hints(M: int, N: int, K: int, strides: tuple[int, ...], cfg) -> dict[str, bool]:
    """The constexprs Inductor's template derives from its static shapes, by the same rules: EVEN_K, and
    the contiguity hint on A's rows (B's cols) when A (B) is dense in either order and the dim spans at
    least one block (else `rm % M` wraps inside a block and is no contiguous run)."""
    sam, sak, sbk, sbn = strides[:4]
    return {
        "EVEN_K": K % cfg.block_k == 0,
        "A_HINT": ((sam == 1 and sak == M) or (sam == K and sak == 1)) and M >= cfg.block_m and K > 1,
        "B_HINT": ((sbk == 1 and sbn == K) or (sbk == N and sbn == 1)) and N >= cfg.block_n and K > 1,
    }


_DIV_NAMES = ("DIV_M", "DIV_N", "DIV_K", "DIV_AM", "DIV_AK", "DIV_BK", "DIV_BN", "DIV_CM", "DIV_CN")


def divisor(v: int) -> int:
    """The power of two a size is passed divided by: 1 for 1 and multiples of 16 (Triton specialises
    those itself), else the largest power of two dividing it (1, 2, 4 or 8)."""
    return 1 if v == 1 or v % 16 == 0 else v & -v


def _args(M: int, N: int, K: int, strides: tuple[int, ...], cfg, dtype: torch.dtype, allow_tf32: bool,
          static: bool = False) -> tuple[list[int], dict]:
    """(the integer arguments, divided by their divisors; the constexprs) of one launch or compile.
    static: every size and stride a constant, as Inductor compiles its template for one shape -- passed
    as 1 times a DIV_ equal to it, so that the compiler folds it (one compile per shape and config; the
    "v4 static" kernel of benchmarks/studies/kernel_fidelity.py and benchmarks/static_retime.py)."""
    sizes = (M, N, K, *strides)
    divs = list(sizes) if static else [divisor(v) for v in sizes]
    meta = dict(zip(_DIV_NAMES, divs))
    meta.update(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                INPUT_PRECISION=input_precision(dtype, allow_tf32), **_hints(M, N, K, strides, cfg),
                num_stages=cfg.num_stages, num_warps=cfg.num_warps)
    return [v // d for v, d in zip(sizes, divs)], meta


def _launch_args(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, cfg, allow_tf32: bool, static: bool = False
                 ) -> tuple[tuple[int], list[int], dict]:
    """(grid, integer arguments, constexprs) of c = a @ b with one config."""
    M, K = a.shape
    _, N = b.shape
    strides = (a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    ints, meta = _args(M, N, K, strides, cfg, a.dtype, allow_tf32, static)
    return (grid_size(M, N, cfg.block_m, cfg.block_n),), ints, meta


def launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, cfg, allow_tf32: bool = False,
           static: bool = False) -> None:
    """c = a @ b with one config (a: (M, K), b: (K, N), any strides; c: (M, N) row-major); static: the
    shape's own compile (_args)."""
    grid, ints, meta = _launch_args(a, b, c, cfg, allow_tf32, static)
    matmul_kernel[grid](a, b, c, *ints, **meta)


def prepare(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, cfg, allow_tf32: bool = False,
            static: bool = False) -> None:
    """Load the kernel that `launch` with these arguments runs onto the device, without launching it:
    Triton's warmup finds the compiled kernel (in its cache, where a worker put it) and `_init_handles`
    loads its module. Raises Triton's OutOfResources for a config the device cannot run (shared memory;
    threads at the kernel's register count), so that a caller that times the first launch learns it
    before recording any event, and the cold load is not timed. Under TRITON_INTERPRET=1 there is
    nothing to load."""
    grid, ints, meta = _launch_args(a, b, c, cfg, allow_tf32, static)
    compiled = matmul_kernel.warmup(a, b, c, *ints, **meta, grid=grid)
    if compiled is None:  # the interpreter compiles nothing
        return
    compiled._init_handles()
    # Triton raises the thread limit once, after loading the module; a second call returns early and
    # leaves a launcher that raises at launch. Checked here on every call, as Triton does.
    threads = compiled.metadata.num_warps * triton.runtime.driver.active.get_current_target().warp_size
    if threads > compiled.n_max_threads:
        raise OutOfResources(threads, compiled.n_max_threads, "threads")


def launch_v3(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, cfg, allow_tf32: bool = False) -> None:
    """c = a @ b with the previous dataset kernel (kernel v3), for side-by-side comparisons."""
    M, K = a.shape
    _, N = b.shape
    matmul_kernel_v3[(grid_size(M, N, cfg.block_m, cfg.block_n),)](
        a, b, c, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        INPUT_PRECISION=input_precision(a.dtype, allow_tf32),
        A_M_CONTIGUOUS=a.stride(0) == 1, B_N_CONTIGUOUS=b.stride(1) == 1,
        num_stages=cfg.num_stages, num_warps=cfg.num_warps,
    )


def matmul(a: torch.Tensor, b: torch.Tensor, cfg, allow_tf32: bool = False) -> torch.Tensor:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} do not multiply")
    c = torch.empty((a.shape[0], b.shape[1]), device=a.device, dtype=a.dtype)
    launch(a, b, c, cfg, allow_tf32)
    return c


def warmup(dtype: torch.dtype, M: int, N: int, K: int, strides: tuple[int, ...], cfg, allow_tf32: bool,
           static: bool = False) -> None:
    """Compile (no launch) the kernel for the specialisation of (M, N, K, strides), as a worker does: the
    compiled kernel serves every problem with the same spec_key (data_gen/gemm_sweep.py)."""
    ints, meta = _args(M, N, K, strides, cfg, dtype, allow_tf32, static)
    matmul_kernel.warmup(dtype, dtype, dtype, *ints, **meta, grid=(1,))
