"""Inductor's batched GEMM template (`triton::bmm`), compiled as Inductor compiles it.

The body is the `bmm_template` of torch/_inductor/kernel/bmm.py (templates/triton_bmm.py.jinja) as
torch 2.11 -- the GPU machine's -- renders it: C[q] = A[q] @ B[q] for each batch index q, a 2-D grid of
(cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), BATCH) programs, program_id(0) in grouped (GROUP_M) order over the
tiles of one matrix and program_id(1) the batch index; rows/cols wrapped (% M, % N) so that the
operand loads need no M/N mask, with a contiguity hint when the operand is dense in either order (no
`M >= BLOCK_M` guard: unlike the mm template, bmm's has none); K walked down from K by BLOCK_K with
pointer increments, loads masked unless EVEN_K; `tl.dot(a, b, allow_tf32=ALLOW_TF32)` accumulating
in fp32; a masked store of the output in its dtype. Inductor compiles its templates for static shapes:
every size and stride is a constant of the kernel source, so here every size and stride is a constexpr
and one compile serves one (shape, strides, dtype, config) -- any batch (the batch only sizes the
grid; the batch stride is a constant). torch 2.13's template differs in three places that do not
change the compiled kernel for BATCH <= 65535 but for the index arithmetic: the M >= BLOCK_M and
K > 1 guard on the hints, a batch index split over grid y and z, and the batch index clamped to
BATCH - 1 with a batch mask on the store.
"""
from __future__ import annotations

import hashlib
import inspect

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources


@triton.jit
def bmm_kernel(
    # Pointers: A (BATCH, M, K), B (BATCH, K, N), C (BATCH, M, N), any strides
    A, B, C,
    # Matrix dimensions and strides (elements), constants as in Inductor's static compile
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
    stride_aq: tl.constexpr, stride_am: tl.constexpr, stride_ak: tl.constexpr,
    stride_bq: tl.constexpr, stride_bk: tl.constexpr, stride_bn: tl.constexpr,
    stride_cq: tl.constexpr, stride_cm: tl.constexpr, stride_cn: tl.constexpr,
    # Meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    ALLOW_TF32: tl.constexpr,  # fp32 inputs: tf32 tensor cores (Inductor: torch's matmul precision)
    EVEN_K: tl.constexpr,      # K % BLOCK_K == 0: no K mask
):
    # based on triton.ops.matmul
    pid = tl.program_id(0).to(tl.int32)
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
    if (stride_am == 1 and stride_ak == M) or (stride_am == K and stride_ak == 1):
        ram = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)
    else:
        ram = rm % M
    if (stride_bk == 1 and stride_bn == K) or (stride_bk == N and stride_bn == 1):
        rbn = tl.max_contiguous(tl.multiple_of(rn % N, BLOCK_N), BLOCK_N)
    else:
        rbn = rn % N

    rk = tl.arange(0, BLOCK_K)

    idx_q = tl.program_id(1).to(tl.int32)  # batch dimension for BMM
    A = A + (ram[:, None] * stride_am + rk[None, :] * stride_ak + idx_q * stride_aq)  # (BM, BK)
    B = B + (rk[:, None] * stride_bk + rbn[None, :] * stride_bn + idx_q * stride_bq)  # (BK, BN)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(K, 0, -BLOCK_K):
        if EVEN_K:
            a = tl.load(A)
            b = tl.load(B)
        else:
            a = tl.load(A, mask=rk[None, :] < k, other=0.)
            b = tl.load(B, mask=rk[:, None] < k, other=0.)
        acc += tl.dot(a, b, allow_tf32=ALLOW_TF32)
        A += BLOCK_K * stride_ak
        B += BLOCK_K * stride_bk

    # rematerialize rm and rn to save registers
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    idx_q = tl.program_id(1).to(tl.int32)  # batch dimension for BMM
    idx_m = rm[:, None]
    idx_n = rn[None, :]
    mask = (idx_m < M) & (idx_n < N)

    # inductor's suffix: the output in its dtype at its (q, m, n) strides
    tl.store(C + (idx_q * stride_cq + idx_m * stride_cm + idx_n * stride_cn), acc.to(C.dtype.element_ty), mask)


def kernel_mode() -> str:
    """What the bmm rows' kernel is, recorded in every `bmm` shard header (`perfmodel data info`)."""
    return ("bmm static: inductor's bmm template (torch 2.11) with every size and stride a constexpr, as "
            "inductor compiles it for static shapes (one compile per shape, layout, dtype and config)")


def kernel_source_hash() -> str:
    """Hash of the kernel's source: a `bmm` shard refuses rows from another kernel version."""
    return hashlib.sha256(inspect.getsource(bmm_kernel.fn).encode()).hexdigest()[:16]


def grid(batch: int, M: int, N: int, block_m: int, block_n: int) -> tuple[int, int, int]:
    """Inductor's bmm_grid (torch 2.11): (tiles of one matrix, batch, 1)."""
    return triton.cdiv(M, block_m) * triton.cdiv(N, block_n), batch, 1


def constexprs(M: int, N: int, K: int, strides: tuple[int, ...], cfg, allow_tf32: bool) -> dict:
    """Every constexpr of one compile: the sizes, the nine strides (A q/m/k, B q/k/n, C q/m/n), the
    config, ALLOW_TF32 and EVEN_K (Inductor: K % BLOCK_K == 0), with num_stages and num_warps."""
    names = ("stride_aq", "stride_am", "stride_ak", "stride_bq", "stride_bk", "stride_bn",
             "stride_cq", "stride_cm", "stride_cn")
    if len(strides) != 9:
        raise ValueError(f"strides: expected 9 (A, B, C: batch, row, col), got {len(strides)}")
    return {"M": M, "N": N, "K": K, **dict(zip(names, strides)),
            "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "GROUP_M": cfg.group_m,
            "ALLOW_TF32": bool(allow_tf32), "EVEN_K": K % cfg.block_k == 0,
            "num_stages": cfg.num_stages, "num_warps": cfg.num_warps}


def tensor_strides(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[int, ...]:
    return (*a.stride(), *b.stride(), *c.stride())


def _launch_args(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, cfg, allow_tf32: bool):
    if a.dim() != 3 or b.dim() != 3 or c.dim() != 3:
        raise ValueError(f"bmm: expected 3-D operands, got {a.dim()}-D, {b.dim()}-D, {c.dim()}-D")
    batch, M, K = a.shape
    if tuple(b.shape[:2]) != (batch, K) or tuple(c.shape) != (batch, M, b.shape[2]):
        raise ValueError(f"bmm: shapes {tuple(a.shape)}, {tuple(b.shape)} -> {tuple(c.shape)} do not multiply")
    N = b.shape[2]
    meta = constexprs(M, N, K, tensor_strides(a, b, c), cfg, allow_tf32)
    return grid(batch, M, N, cfg.block_m, cfg.block_n), meta


def launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, cfg, allow_tf32: bool = False) -> None:
    """c = a @ b batch by batch with one config (a: (B, M, K), b: (B, K, N), c: (B, M, N), any strides)."""
    g, meta = _launch_args(a, b, c, cfg, allow_tf32)
    bmm_kernel[g](a, b, c, **meta)


def prepare(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, cfg, allow_tf32: bool = False) -> None:
    """Load the kernel `launch` runs onto the device without launching it (kernel.prepare's protocol:
    Triton's warmup finds the compiled kernel where a worker put it, `_init_handles` loads the module).
    Raises OutOfResources for a config the device cannot run (shared memory, threads at the kernel's
    register count). Under TRITON_INTERPRET=1 there is nothing to load."""
    g, meta = _launch_args(a, b, c, cfg, allow_tf32)
    compiled = bmm_kernel.warmup(a, b, c, **meta, grid=g)
    if compiled is None:  # the interpreter compiles nothing
        return
    compiled._init_handles()
    threads = compiled.metadata.num_warps * triton.runtime.driver.active.get_current_target().warp_size
    if threads > compiled.n_max_threads:
        raise OutOfResources(threads, compiled.n_max_threads, "threads")


def warmup(dtype: torch.dtype, M: int, N: int, K: int, strides: tuple[int, ...], cfg, allow_tf32: bool) -> None:
    """Compile (no launch) the kernel of one shape, layout and config into Triton's cache, as a worker
    process does (pointers as dtypes: 16-byte aligned, as fresh tensors are)."""
    bmm_kernel.warmup(dtype, dtype, dtype, **constexprs(M, N, K, strides, cfg, allow_tf32), grid=(1,))


def bmm(a: torch.Tensor, b: torch.Tensor, cfg, allow_tf32: bool = False) -> torch.Tensor:
    """The allocating entry point: a (B, M, K) @ b (B, K, N) -> a new contiguous (B, M, N)."""
    c = torch.empty((a.shape[0], a.shape[1], b.shape[2]), device=a.device, dtype=a.dtype)
    launch(a, b, c, cfg, allow_tf32)
    return c


_POINTER_TYPES = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32"}


def compile_for_target(dtype: torch.dtype, M: int, N: int, K: int, strides: tuple[int, ...], cfg, allow_tf32: bool,
                       capability: int = 90):
    """Compile the kernel for a CUDA target without a GPU (Triton's own ptxas), as a worker's warmup
    would for a device of that compute capability: the CPU tests check that the source compiles for the
    H100 (sm_90), and its shared memory (`metadata.shared`), before a GPU session is spent on it."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    meta = constexprs(M, N, K, strides, cfg, allow_tf32)
    options = {"num_warps": meta.pop("num_warps"), "num_stages": meta.pop("num_stages")}
    signature = {"A": _POINTER_TYPES[dtype], "B": _POINTER_TYPES[dtype], "C": _POINTER_TYPES[dtype],
                 **{name: "constexpr" for name in meta}}
    aligned = [["tt.divisibility", 16]]  # fresh tensors' pointers, as Triton specialises them
    src = ASTSource(bmm_kernel, signature, constexprs=meta, attrs={(0,): aligned, (1,): aligned, (2,): aligned})
    return triton.compile(src, target=GPUTarget("cuda", capability, 32), options=options)
