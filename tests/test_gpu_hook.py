"""The Inductor hook on a real max-autotune compile (skipped where no CUDA device is visible): it sees
Inductor's own KernelTemplateChoices for triton::mm and keeps at most top_k of them."""
from __future__ import annotations

import pytest

from perfmodel import GemmProblem

pytestmark = pytest.mark.gpu

TOP_K = 3


@pytest.mark.parametrize("space", ["DEFAULT", "EXHAUSTIVE"])
def test_max_autotune_hook_keeps_top_k_real_choices(space, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from torch._inductor import config as inductor_config

    import perfmodel.serve.choices as sc
    import perfmodel.serve.inductor as si

    seen = []
    real = sc.select

    def spy(choices, kernel_inputs, op_name, *a, **kw):
        kept = real(choices, kernel_inputs, op_name, *a, **kw)
        n_mm = sum(si._uid(c) == "triton::mm" for c in choices)
        kept_mm = sum(si._uid(c) == "triton::mm" for c in kept)
        seen.append((op_name, si.problem_from_kernel_inputs(kernel_inputs), n_mm, kept_mm))
        return kept

    monkeypatch.setattr(sc, "select", spy)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # a fresh cache
    torch._dynamo.reset()
    a = torch.randn(512, 256, device="cuda", dtype=torch.float16)
    b = torch.randn(256, 384, device="cuda", dtype=torch.float16)
    try:
        # cublas_margin=None: Triton is kept wherever cuBLAS is predicted faster, so the ranking is what is tested
        with si.installed(top_k=TOP_K, cublas_margin=None) as ok, inductor_config.patch(
                force_disable_caches=True, max_autotune_gemm_search_space=space):
            assert ok, "the Inductor hook did not install on this torch"
            out = torch.compile(lambda x, y: torch.mm(x, y), mode="max-autotune-no-cudagraphs")(a, b)
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(out, a @ b, rtol=1e-2, atol=1e-2)
    mm = [s for s in seen if s[0] == "mm" and s[1] == GemmProblem(m=512, n=384, k=256, dtype="float16")]
    assert mm, f"the hook saw no mm of this problem: {seen}"
    for _, _, n_mm, kept_mm in mm:
        assert n_mm > TOP_K, f"Inductor offered only {n_mm} triton::mm choices"  # real choices, more than kept
        if space == "EXHAUSTIVE":  # the whole space is ranked (num_warps=1 configs included), none passes unranked
            assert n_mm > 500, n_mm
        assert 1 <= kept_mm <= TOP_K
