"""perfmodel.serve.triton_hook (Triton autotuner pruning) and perfmodel.serve.inductor (Inductor choices
handler), on the CPU with a SYNTHETIC random-weight model: they check that the model's order is what
survives, not its quality."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from perfmodel import GemmConfig, GemmProblem
from perfmodel.serve import Predictor
from tests._inductor import MMInputs
from tests._synthetic import write_synthetic_model

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from perfmodel.serve import choices as sc  # noqa: E402
from perfmodel.serve import inductor as si  # noqa: E402
from perfmodel.serve import notices, pad_hook  # noqa: E402
from perfmodel.serve.triton_hook import (config_to_gemm, perfmodel_perf_model, perfmodel_prune,  # noqa: E402
                               prune_configs_by)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_model(tmp_path_factory.mktemp("hooks") / "model", seed=4, onnx=False)


@pytest.fixture(scope="module")
def pt(model_dir: Path) -> Predictor:
    return Predictor.load(model_dir, backend="torch")


def _configs(names=("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")) -> list:
    bm, bn, bk, gm = names
    return [triton.Config({bm: m, bn: n, bk: k, gm: 8}, num_stages=s, num_warps=w)
            for m in (32, 64, 128) for n in (32, 64, 128) for k in (32, 64) for s in (2, 3) for w in (4, 8)]


# The decorated kernels are never launched here: Autotuner.prune_configs is called as Autotuner.run would.
@triton.jit
def _kernel(a, b, c, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
            GROUP_M: tl.constexpr):
    pass


@triton.jit
def _kernel_no_sizes(a, b, c, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                     BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr):
    pass


def _prune(tuner, *args, **kwargs) -> list:
    tuner.nargs = dict(zip(tuner.arg_names, args))
    try:
        return tuner.prune_configs(kwargs)
    finally:
        tuner.nargs = None


def _expected(pt: Predictor, prob: GemmProblem, configs: list, top_k: int) -> list[str]:
    gemm = [config_to_gemm(c) for c in configs]  # distinct configs: a rank entry names its position
    return [str(configs[gemm.index(c)]) for c, _ in pt.rank(prob, gemm, top_k=top_k)]


def test_early_prune_keeps_top_k_in_model_order(pt: Predictor) -> None:
    cfgs = _configs()
    tuner = triton.autotune(cfgs, key=["M", "N", "K"],
                            prune_configs_by={"early_config_prune": perfmodel_prune(top_k=5, predictor=pt)})(_kernel)
    a = torch.empty(1000, 300, dtype=torch.float16)
    b = torch.empty(600, 300, dtype=torch.float16).t()  # column-major B
    kept = _prune(tuner, a, b, None, 1000, 600, 300)
    prob = GemmProblem(m=1000, n=600, k=300, dtype="float16", transpose_right=True)
    assert [str(c) for c in kept] == _expected(pt, prob, cfgs, 5)
    assert all(c in cfgs for c in kept)  # the caller's own Config objects


def test_sizes_from_tensor_shapes_and_other_names(pt: Predictor) -> None:
    cfgs = _configs(("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M"))
    tuner = triton.autotune(cfgs, key=[], prune_configs_by=prune_configs_by(3, predictor=pt, a="a", b="b"))(
        _kernel_no_sizes)
    a = torch.empty(64, 4096, dtype=torch.float32).t()  # (4096, 64) column-major A
    b = torch.empty(64, 8, dtype=torch.float32)
    kept = _prune(tuner, a, b, None)
    prob = GemmProblem(m=4096, n=8, k=64, dtype="float32", allow_tf32=True, transpose_left=True)  # tl.dot's fp32 default
    assert [str(c) for c in kept] == _expected(pt, prob, cfgs, 3)


def test_perf_model_form_matches(pt: Predictor) -> None:
    cfgs = _configs()
    tuner = triton.autotune(cfgs, key=["M", "N", "K"],
                            prune_configs_by={"perf_model": perfmodel_perf_model(predictor=pt), "top_k": 4})(_kernel)
    a, b = torch.empty(256, 512, dtype=torch.bfloat16), torch.empty(512, 128, dtype=torch.bfloat16)
    kept = _prune(tuner, a, b, None, 256, 128, 512)
    assert [str(c) for c in kept] == _expected(pt, GemmProblem(m=256, n=128, k=512, dtype="bfloat16"), cfgs, 4)


def test_unknown_configs_kept_or_dropped(pt: Predictor) -> None:
    cfgs = _configs()[:10] + [triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}, num_warps=16)]
    a, b = torch.empty(128, 128, dtype=torch.float16), torch.empty(128, 128, dtype=torch.float16)
    args = {"a": a, "b": b, "M": 128, "N": 128, "K": 128}
    with pytest.warns(UserWarning, match="outside the model's config space"):
        kept = perfmodel_prune(top_k=2, predictor=pt)(cfgs, args)
    assert len(kept) == 3 and kept[-1] is cfgs[-1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert len(perfmodel_prune(top_k=2, predictor=pt, unknown="drop")(cfgs, args)) == 2
    with pytest.raises(ValueError, match="top_k"):
        perfmodel_prune(top_k=0)


def test_prune_loads_model_lazily(model_dir: Path, tmp_path: Path) -> None:
    prune = perfmodel_prune(top_k=1, model=tmp_path / "missing")  # nothing loaded yet: no error
    args = {"a": torch.empty(8, 8), "b": torch.empty(8, 8)}
    with pytest.raises(FileNotFoundError):
        prune(_configs()[:3], args)
    assert len(perfmodel_prune(top_k=1, model=model_dir)(_configs()[:3], args)) == 1


KERNEL_SCRIPT = textwrap.dedent('''
    import sys, time
    import torch, triton, triton.language as tl
    from perfmodel.serve import Predictor
    from perfmodel.serve.triton_hook import perfmodel_prune

    p = Predictor.load(sys.argv[1])
    cfgs = [triton.Config({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 8},
                          num_stages=s, num_warps=w)
            for bm in (16, 32) for bn in (16, 32) for bk in (16, 32) for s in (2, 3) for w in (2, 4)]
    prune = perfmodel_prune(top_k=3, predictor=p)
    kept = []

    def early(configs, named_args, **kw):
        kept.extend(prune(configs, named_args, **kw))
        return kept

    def cpu_bench(fn, quantiles=None):  # the interpreter has no GPU driver for triton's do_bench
        t = time.perf_counter(); fn(); t = (time.perf_counter() - t) * 1e3
        return [t, t, t]

    @triton.autotune(cfgs, key=["M", "N", "K"], prune_configs_by={"early_config_prune": early}, do_bench=cpu_bench)
    @triton.jit
    def mm(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
           BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
           GROUP_SIZE_M: tl.constexpr):
        pid = tl.program_id(0)
        pid_m = pid // tl.cdiv(N, BLOCK_SIZE_N)
        pid_n = pid % tl.cdiv(N, BLOCK_SIZE_N)
        rm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
        rn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        rk = tl.arange(0, BLOCK_SIZE_K)
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_SIZE_K):
            a = tl.load(a_ptr + rm[:, None] * stride_am + (k0 + rk)[None, :] * stride_ak,
                        mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K), other=0.0)
            b = tl.load(b_ptr + (k0 + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
                        mask=((k0 + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc += tl.dot(a, b)
        tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc,
                 mask=(rm[:, None] < M) & (rn[None, :] < N))

    M, N, K = 40, 24, 48
    a, b, c = torch.randn(M, K), torch.randn(K, N), torch.empty(M, N)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_SIZE_M"]) * triton.cdiv(N, meta["BLOCK_SIZE_N"]),)
    mm[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-4)
    assert len(kept) == 3, kept
    assert sorted(map(str, mm.configs_timings)) == sorted(map(str, kept)), "benchmarked exactly the kept configs"
    assert mm.best_config in kept
    print("ok", len(cfgs), "->", len(mm.configs_timings))
''')


@pytest.mark.slow
def test_autotune_under_triton_interpreter(model_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "autotune_mm.py"  # @triton.jit needs its source in a file
    script.write_text(KERNEL_SCRIPT)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, str(script), str(model_dir)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ok 32 -> 3" in r.stdout


# ---------------------------------------------------------------------------------------- Inductor
class _Template:
    def __init__(self, uid: str) -> None:
        self.uid = uid


class _Params:
    def __init__(self, **kw) -> None:
        self.kw = kw

    def to_kwargs(self) -> dict:
        return dict(self.kw)


class _KTC:
    """The parts of torch._inductor.kernel_template_choice.KernelTemplateChoice the hook reads."""

    def __init__(self, uid: str, **kw) -> None:
        self.template, self.params, self.extra_kwargs = _Template(uid), _Params(**kw), {"ALLOW_TF32": False}

    @property
    def choice(self):
        raise AssertionError("the hook must not build ChoiceCallers")


def _triton_choices() -> list[_KTC]:
    return [_KTC("triton::mm", BLOCK_M=m, BLOCK_N=n, BLOCK_K=k, GROUP_M=8, num_stages=s, num_warps=w, EVEN_K=True,
                 ACC_TYPE="tl.float32") for m in (32, 64, 128) for n in (64, 128) for k in (32, 64)
            for s, w in ((2, 4), (3, 8))]


def test_filter_keeps_top_k_triton_mm_and_passes_the_rest(pt: Predictor) -> None:
    aten, tma = _KTC("aten::mm"), _KTC("triton::persistent_tma_mm", BLOCK_M=128, BLOCK_N=128, BLOCK_K=64)
    tri = _triton_choices()
    choices = [aten, *tri, tma]
    ki = MMInputs(2048, 1024, 512, b_col_major=True)
    out = si.filter_template_choices(choices, ki, "mm", pt, top_k=4)
    assert out[0] is aten and out[-1] is tma and len(out) == 6
    prob = GemmProblem(m=2048, n=1024, k=512, dtype="float16", transpose_right=True)
    gemm = [GemmConfig(**{f: c.params.kw[n] for f, n in (
        ("block_m", "BLOCK_M"), ("block_n", "BLOCK_N"), ("block_k", "BLOCK_K"), ("group_m", "GROUP_M"),
        ("num_stages", "num_stages"), ("num_warps", "num_warps"))}) for c in tri]
    best = {id(tri[gemm.index(c)]) for c, _ in pt.rank(prob, gemm, top_k=4)}  # the one ranking rule
    assert {id(c) for c in out[1:-1]} == best
    # other ops, unsupported dtypes and batched problems: untouched
    assert si.filter_template_choices(choices, ki, "bmm", pt, top_k=4) is choices
    assert si.filter_template_choices(choices, MMInputs(64, 64, 64, torch.int8), "mm", pt, top_k=4) is choices
    assert si.filter_template_choices(choices, ki, "mm", pt, top_k=100) is choices


def test_filter_cublas_margin_drops_triton(pt: Predictor) -> None:
    aten = _KTC("aten::mm")
    choices = [aten, *_triton_choices()]
    out = si.filter_template_choices(choices, MMInputs(512, 512, 512), "mm", pt, top_k=2, cublas_margin=-1.0 + 1e-9)
    assert out == [aten]  # margin ~ -1: cuBLAS always "faster"
    out = si.filter_template_choices(choices, MMInputs(512, 512, 512), "mm", pt, top_k=2, cublas_margin=1e9)
    assert len(out) == 3
    # margin 0 compares the predicted times (decisions.triton_dropped, never the call head): Triton stays
    # exactly when its best config is predicted faster than cuBLAS
    prob = GemmProblem(m=512, n=512, k=512, dtype="float16")
    tri = [c for c in choices if c is not aten]
    gemm = [si.kwargs_to_gemm(c.params.to_kwargs()) for c in tri]
    triton_faster = pt.rank(prob, gemm, top_k=1)[0][1] <= pt.predict_cublas(prob)
    out = si.filter_template_choices(choices, MMInputs(512, 512, 512), "mm", pt, top_k=2, cublas_margin=0.0)
    assert (len(out) == 3) == triton_faster and aten in out


@pytest.mark.parametrize("margin", [-1.0, -2, float("nan"), float("inf"), True, "0.1"])
def test_install_refuses_a_bad_cublas_margin(pt: Predictor, margin) -> None:
    with pytest.raises(ValueError, match="cublas_margin"):
        si.install(top_k=2, predictor=pt, cublas_margin=margin)
    assert not si.is_installed()


def test_install_uninstall_and_context(pt: Predictor) -> None:
    from torch._inductor.choices import InductorChoices
    from torch._inductor.virtualized import V

    assert si.check_torch_api() is None
    before = V.choices
    assert si.install(top_k=3, predictor=pt) is True
    assert si.is_installed() and isinstance(V.choices, InductorChoices) and V.choices.perfmodel is pt
    assert si.install(top_k=2, predictor=pt)  # re-install replaces, keeps the original to restore
    assert V.choices.perfmodel_top_k == 2
    assert si.uninstall() is True and V.choices is before and not si.is_installed()
    assert si.uninstall() is False
    with si.installed(4, pt) as ok:
        assert ok and V.choices.perfmodel_top_k == 4
    assert V.choices is before
    with pytest.raises(TypeError, match="predictor"):
        si.install(3, predictor="not a predictor")
    with pytest.raises(ValueError, match="top_k"):
        si.install(0, predictor=pt)


def test_install_fails_soft_on_api_drift(pt: Predictor, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._inductor.choices import InductorChoices

    monkeypatch.delattr(InductorChoices, "_finalize_template_configs")
    monkeypatch.setattr(notices, "_warned", set())
    with pytest.warns(RuntimeWarning, match="_finalize_template_configs"):
        assert si.install(3, predictor=pt) is False
    assert not si.is_installed()


def test_hook_falls_back_when_structures_change(pt: Predictor, monkeypatch: pytest.MonkeyPatch) -> None:
    """A choice object without .params (say, a renamed field): the handler returns Inductor's list."""
    monkeypatch.setattr(notices, "_warned", set())
    handler = si._handler_class()(pt, 2, si.MM_OPS, si.TRITON_MM_TEMPLATES, None)
    odd = [SimpleNamespace(template=_Template("triton::mm"))] * 3
    with pytest.warns(RuntimeWarning, match="default choices"):
        out = handler._finalize_template_configs({"triton::mm": iter(odd)}, MMInputs(256, 256, 256), [], "mm")
    assert out == odd


def test_real_compile_calls_the_hook(pt: Predictor, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile on the CPU: the installed handler sees the real MMKernelInputs (aten-only on CPU)."""
    seen = []
    real = sc.select

    def spy(choices, kernel_inputs, op_name, *a, **kw):
        seen.append((op_name, si.problem_from_kernel_inputs(kernel_inputs)))
        return real(choices, kernel_inputs, op_name, *a, **kw)

    monkeypatch.setattr(sc, "select", spy)
    torch._dynamo.reset()
    a, b = torch.randn(64, 32), torch.randn(48, 32).t()
    from torch._inductor import config as inductor_config

    # A cached graph would skip lowering (and the hook): compile from scratch.
    with si.installed(3, pt), inductor_config.patch(force_disable_caches=True):
        out = torch.compile(lambda x, y: x @ y)(a, b)
    torch._dynamo.reset()
    torch.testing.assert_close(out, a @ b)
    assert ("mm", GemmProblem(m=64, n=48, k=32, dtype="float32", transpose_right=True)) in seen


def test_pad_hook_decides_pad_mm_with_the_model(pt: Predictor, monkeypatch: pytest.MonkeyPatch) -> None:
    """install(pad=True) replaces pad_mm._should_pad by the model's decision and uninstall restores it.
    (The synthetic model's decisions mean nothing; the test checks they are the ones used.)"""
    from torch._inductor.fx_passes import pad_mm

    from perfmodel import PadProblem

    calls = []

    def original(match, mat1, mat2, op, input=None):
        calls.append(tuple(mat1.shape))
        return "inductor's own"

    monkeypatch.setattr(pad_mm, "_should_pad", original)
    monkeypatch.setattr(pad_mm, "should_exclude_padding_time", lambda match, name: name == "mat2")
    assert si.install(3, pt, pad=True)
    try:
        hooked = pad_mm._should_pad
        assert hooked is not original
        a, b = torch.randn(63, 65, dtype=torch.float16), torch.randn(33, 65, dtype=torch.float16).t()
        got = hooked(None, a, b, torch.ops.aten.mm)
        pp = PadProblem(m=63, k=65, n=33, dtype="float16", transpose_right=True, prepadded_right=True)
        assert got is pt.pad(pp).should_pad
        assert si.pad_decisions() == [(pp, pt.pad(pp))]
        monkeypatch.setattr(pad_hook, "PAD_LOG_SIZE", 2)  # the log keeps the most recent decisions only
        pad_hook.clear_log()
        for _ in range(3):
            hooked(None, a, b, torch.ops.aten.mm)
        assert si.pad_decisions() == [(pp, pt.pad(pp))] * 2
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode() as mode:  # as inside Inductor's post-grad passes
            assert hooked(None, mode.from_tensor(a), mode.from_tensor(b), torch.ops.aten.mm) is got
        # Aligned, addmm, 3-D and int operands: Inductor's own logic.
        assert hooked(None, torch.randn(64, 64), torch.randn(64, 64), torch.ops.aten.mm) == "inductor's own"
        assert hooked(None, a, b, torch.ops.aten.addmm) == "inductor's own"
        assert hooked(None, torch.randn(2, 63, 65), torch.randn(2, 65, 3), torch.ops.aten.bmm) == "inductor's own"
        assert hooked(None, torch.ones(63, 65, dtype=torch.int32), torch.ones(65, 3, dtype=torch.int32),
                      torch.ops.aten.mm) == "inductor's own"
        assert len(calls) == 4
        assert si.install(3, pt) and pad_mm._should_pad is original  # re-install without pad restores
        assert si.install(3, pt, pad=True) and pad_mm._should_pad is not original
    finally:
        si.uninstall()
    assert pad_mm._should_pad is original
    with pytest.raises(TypeError, match="pad"):
        si.install(3, pt, pad="yes")


def test_pad_problem_layouts() -> None:
    from torch._inductor.fx_passes import pad_mm

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pad_mm, "should_exclude_padding_time", lambda match, name: False)
        p = si.pad_problem_from_match(None, torch.randn(10, 7).t(), torch.randn(10, 5))
        assert (p.m, p.k, p.n, p.transpose_left, p.transpose_right, p.dtype) == (7, 10, 5, True, False, "float32")
        assert si.pad_problem_from_match(None, torch.randn(8, 8)[:, ::2], torch.randn(4, 4)) is None  # no unit stride


def test_prune_never_keeps_a_config_the_device_cannot_run(pt: Predictor) -> None:
    # 256x256x128 with 5 stages needs 655 KB of fp16 shared memory: inf, dropped while a runnable one exists
    big = triton.Config({"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8}, num_stages=5, num_warps=8)
    small = [triton.Config({"BLOCK_M": bm, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=3, num_warps=4)
             for bm in (32, 64)]
    args = {"a": torch.empty(512, 512, dtype=torch.float16), "b": torch.empty(512, 512, dtype=torch.float16)}
    kept = perfmodel_prune(top_k=3, predictor=pt)([big, *small], args)
    assert big not in kept and set(map(id, kept)) == set(map(id, small))
    assert perfmodel_prune(top_k=2, predictor=pt)([big], args) == [big]  # nothing runnable: Triton's own failure


def test_an_addmm_keeps_bias_addmm_in_place_of_aten_addmm(pt: Predictor) -> None:
    """Offered both, an addmm keeps aten::bias_addmm (the 1-D bias in cuBLASLt's epilogue, default mode's kernel)
    and loses aten::addmm (the bias expanded and copied): alone where Triton is dropped, so nothing is
    benchmarked. A lone aten::addmm stays; other ops are untouched (SYNTHETIC choices)."""
    plain, bias = _KTC("aten::addmm"), _KTC("aten::bias_addmm")
    tri = _triton_choices()
    out = si.filter_template_choices([plain, bias, *tri], MMInputs(512, 512, 512), "addmm", pt, top_k=2,
                                     cublas_margin=None)
    assert plain not in out and bias in out and len(out) == 3
    assert si.filter_template_choices([plain, bias, *tri], MMInputs(512, 512, 512), "addmm", pt, top_k=2,
                                      cublas_margin=-1.0 + 1e-9) == [bias]
    assert si.filter_template_choices([plain, *tri], MMInputs(512, 512, 512), "addmm", pt, top_k=2,
                                      cublas_margin=-1.0 + 1e-9) == [plain]
    assert si.prefer_bias_addmm([plain, bias], "mm") == [plain, bias]
    assert si.prefer_bias_addmm([plain, bias], "addmm") == [bias]
