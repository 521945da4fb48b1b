"""The Inductor hook on Inductor's EXHAUSTIVE space: every config it emits for the mm template is one the
model ranks (num_warps=1 16x16 tiles included), so the hook keeps exactly top_k of them and none passes
through unranked. Choices are stand-ins for KernelTemplateChoice (the fields the hook reads; see
tests/test_serve_hooks.py); the predictor is a random-weight model (synthetic, as that test's)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from perfmodel import GemmConfig
from perfmodel.configs import exhaustive_space, pruned_space
from perfmodel.devices import get_spec
from perfmodel.serve import Predictor
from tests._inductor import MMInputs
from tests._synthetic import write_synthetic_model

pytest.importorskip("triton")
from perfmodel.serve import inductor as si  # noqa: E402
from test_serve_hooks import _KTC  # noqa: E402


@pytest.fixture(scope="module")
def pt(tmp_path_factory: pytest.TempPathFactory) -> Predictor:
    return Predictor.load(write_synthetic_model(tmp_path_factory.mktemp("synthetic") / "m", onnx=False))


def _choice(c: GemmConfig) -> _KTC:
    return _KTC("triton::mm", BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m,
                num_stages=c.num_stages, num_warps=c.num_warps, EVEN_K=True, ACC_TYPE="tl.float32")


def test_every_exhaustive_config_is_a_gemm_config():
    space = exhaustive_space()
    assert sum(c.num_warps == 1 for c in space) == 25
    for c in space:  # what Inductor passes the hook, read back
        assert si.kwargs_to_gemm(_choice(c).params.to_kwargs()) == c


@pytest.mark.parametrize("m,n,k", [(32, 4096, 4096), (8, 14336, 4096), (2048, 2048, 2048)])
def test_hook_ranks_the_whole_exhaustive_space(pt: Predictor, m: int, n: int, k: int):
    aten = _KTC("aten::mm")
    tri = [_choice(c) for c in pruned_space("float16", get_spec("h100-sxm"))]
    assert any(t.params.kw["num_warps"] == 1 for t in tri)
    out = si.filter_template_choices([aten, *tri], MMInputs(m, n, k, torch.float16), "mm", pt, top_k=5)
    kept = [c for c in out if c is not aten]
    assert out[0] is aten and len(kept) == 5  # top_k of ~1,200 Triton configs: none passed through unranked
    # the configs Predictor.rank puts first (the one ranking rule: screen, then the gemm head)
    best5 = pt.rank(si.problem_from_kernel_inputs(MMInputs(m, n, k, torch.float16)),
                    [si.kwargs_to_gemm(t.params.to_kwargs()) for t in tri], top_k=5)
    assert [si.kwargs_to_gemm(t.params.to_kwargs()) for t in kept] == sorted(
        (c for c, _ in best5), key=[si.kwargs_to_gemm(t.params.to_kwargs()) for t in tri].index)


class _RankStub:
    """A stand-in predictor whose best Triton config on any problem takes `ms` (synthetic, for the rule)."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def rank(self, prob, configs=None, top_k=5):
        return [(GemmConfig(64, 64, 32, 8, 3, 4), self.ms)]


def test_pad_decision_weighs_unpadded_triton_against_padded_cublas():
    # GPT-2's lm head as measured on the H100: padded cuBLAS 0.185 ms, unpadded Triton 0.164 ms -> no pad
    from perfmodel import PadDecision, PadProblem

    pp = PadProblem(m=1024, k=768, n=50257, dtype="float16")
    pad = PadDecision(should_pad=True, orig_ms=0.25, padded_ms=0.185)
    assert si.unpadded_triton_instead(_RankStub(0.164), pp, pad) == PadDecision(False, 0.25, 0.185)
    assert si.unpadded_triton_instead(_RankStub(0.200), pp, pad) is pad  # Triton slower: pad for cuBLAS
    # GPT-2's lm head in NN layout as the shipped model saw it: Triton predicted 0.256 ms, padded 0.273 ms
    # (6 % apart) -- within the margin, so pad (it measured 0.38 ms unpadded Triton, 0.17-0.20 ms padded)
    near = PadDecision(should_pad=True, orig_ms=0.45, padded_ms=0.273)
    assert si.unpadded_triton_instead(_RankStub(0.256), pp, near) is near
    assert si.unpadded_triton_instead(_RankStub(0.256), pp, near, margin=0.0) == PadDecision(False, 0.45, 0.273)


class _ConfigRankStub:
    """A stand-in predictor (synthetic times, for the rule): each config's time is given in a dict."""

    def __init__(self, times: dict) -> None:
        self.times = times

    def rank(self, prob, configs=None, top_k=5):
        pool = self.times if configs is None else {c: self.times[c] for c in configs}
        return sorted(pool.items(), key=lambda kv: kv[1])[:top_k]


def test_pad_decision_weighs_only_the_configs_in_play(monkeypatch: pytest.MonkeyPatch):
    # The unpadded Triton path counts only with the configs autotuning will offer: in the DEFAULT space a
    # fast config outside Inductor's default list must not stop the pad that helps cuBLAS.
    from torch._inductor import config as inductor_config

    from perfmodel import PadDecision, PadProblem
    from perfmodel.configs import exhaustive_space, inductor_default_configs

    defaults = set(inductor_default_configs())
    outside = next(c for c in exhaustive_space() if c not in defaults)
    times = {c: 0.30 for c in defaults} | {outside: 0.15}
    pp = PadProblem(m=1024, k=768, n=50257, dtype="float16")
    pad = PadDecision(should_pad=True, orig_ms=0.45, padded_ms=0.27)
    stub = _ConfigRankStub(times)
    # inductor_config.patch, not monkeypatch: monkeypatch's undo deletes the option from Inductor's config module
    # (its __delattr__), and every later read of it (the pad hook's _configs_in_play) then raises AttributeError
    with inductor_config.patch(max_autotune_gemm_search_space="DEFAULT"):
        assert si.unpadded_triton_instead(stub, pp, pad, si._configs_in_play()) is pad
    with inductor_config.patch(max_autotune_gemm_search_space="EXHAUSTIVE"):
        assert si._configs_in_play() is None
        assert si.unpadded_triton_instead(stub, pp, pad, si._configs_in_play()) == PadDecision(False, 0.45, 0.27)


def test_hook_keeps_ranks_choice_with_the_shipped_model():
    # The shipped model serves predict() with its distilled student; the hooks must keep what rank()
    # (the screen, then the gemm ensemble: the evaluated rule) puts first, not the student's order.
    shipped = Predictor.load()
    aten = _KTC("aten::mm")
    tri = [_choice(c) for c in pruned_space("float16", get_spec("h100-sxm"))]
    gemm = [si.kwargs_to_gemm(t.params.to_kwargs()) for t in tri]
    for m, n, k in [(32, 4096, 4096), (1000, 1000, 1000), (2048, 11008, 4096)]:
        prob = si.problem_from_kernel_inputs(MMInputs(m, n, k, torch.float16))
        out = si.filter_template_choices([aten, *tri], MMInputs(m, n, k, torch.float16), "mm", shipped, top_k=5)
        assert {si.kwargs_to_gemm(t.params.to_kwargs()) for t in out[1:]} == {c for c, _ in shipped.rank(prob, gemm, 5)}


class _CublasStub(_RankStub):
    """_RankStub with a cuBLAS head (synthetic times, for the rule): every problem takes `cublas_ms`."""

    def __init__(self, ms: float, cublas_ms: float) -> None:
        super().__init__(ms)
        self.cublas_ms = cublas_ms
        self.has_cublas = True
        self.spec = get_spec("h100-sxm")

    def predict_cublas(self, prob):
        assert prob.n % 8 == 0  # asked about the padded problem
        return self.cublas_ms


def test_padded_path_is_the_cublas_head_plus_the_pad_copies_where_that_is_less():
    # GPT-2's lm head under EXHAUSTIVE on the H100: the whole space's best Triton config predicted 0.220 ms,
    # the pad head's padded time 0.273 ms (timed with eager F.pad), the cuBLAS head's padded mm 0.138 ms;
    # the padded path ran 0.193 ms, the unpadded Triton configs kept 0.325 ms
    from perfmodel import PadDecision, PadProblem

    pp = PadProblem(m=1024, k=768, n=50257, dtype="float16")
    copies = (768 * 50257 + 768 * 50264) * 2 / (3350.0 * 1e6)  # B read and written once at 3,350 GB/s
    assert si.pad_copy_floor_ms(pp, 3350.0) == pytest.approx(copies) and 0.04 < copies < 0.05
    assert si.pad_copy_floor_ms(PadProblem(m=1024, k=768, n=50257, prepadded_right=True), 3350.0) == 0.0
    pad = PadDecision(should_pad=True, orig_ms=0.45, padded_ms=0.273)
    assert si.unpadded_triton_instead(_RankStub(0.220), pp, pad) == PadDecision(False, 0.45, 0.273)  # the pad head alone
    assert si.padded_path_ms(_CublasStub(0.220, 0.138), pp, pad) == pytest.approx(0.138 + copies)
    assert si.unpadded_triton_instead(_CublasStub(0.220, 0.138), pp, pad) is pad
    # a cuBLAS head slower than the pad head's time changes nothing
    assert si.padded_path_ms(_CublasStub(0.220, 0.5), pp, pad) == 0.273
    assert si.unpadded_triton_instead(_CublasStub(0.220, 0.5), pp, pad) == PadDecision(False, 0.45, 0.273)
