"""Stand-ins for the parts of Inductor's KernelTemplateChoice and MMKernelInputs that the hooks read (SYNTHETIC:
no GPU, no compile), shared by the hook tests."""
from __future__ import annotations

from types import SimpleNamespace

import torch


def choice(uid: str, cfg=None, tf32: bool = False):
    """A KernelTemplateChoice: template.uid, params.to_kwargs() as Inductor's mm heuristics give them for a Triton
    config (cfg: a GemmConfig), and extra_kwargs' ALLOW_TF32."""
    kw = {} if cfg is None else {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
                                 "GROUP_M": cfg.group_m, "num_stages": cfg.num_stages, "num_warps": cfg.num_warps,
                                 "EVEN_K": True, "ACC_TYPE": "tl.float32"}
    return SimpleNamespace(template=SimpleNamespace(uid=uid), params=SimpleNamespace(to_kwargs=lambda: dict(kw)),
                           extra_kwargs={"ALLOW_TF32": tf32})


class MMInputs:
    """MMKernelInputs of an mm: nodes (mat1 [m, k] row-major, mat2 [k, n], column-major where b_col_major)."""

    def __init__(self, m: int, n: int, k: int, dtype=torch.float16, b_col_major: bool = False) -> None:
        self.m, self.n, self.k, self.dtype_ = m, n, k, dtype
        self.b_col_major = b_col_major
        self._mat1_idx, self._mat2_idx = 0, 1

    def nodes(self) -> list:
        return [object(), object()]

    def shapes_hinted(self):
        return ((self.m, self.k), (self.k, self.n))

    def strides_hinted(self):
        return ((self.k, 1), (1, self.k) if self.b_col_major else (self.n, 1))

    def mnk_hinted(self):
        return self.m, self.n, self.k

    def dtypes(self):
        return (self.dtype_, self.dtype_)
