"""perfmodel.serve.compile, the whole-model set-up: its choice filter and decisions on synthetic Inductor choices
(stand-ins with the attributes Inductor's KernelTemplateChoice has; no GPU, no compile), and the shipped model's
predictions. The GPU test compiles a small model with the set-up."""
from __future__ import annotations

import pytest
import torch

from perfmodel import GemmProblem, Predictor
from perfmodel.configs import inductor_default_configs
from perfmodel.serve import compile as pc
from tests._inductor import MMInputs, choice


CFGS = list(inductor_default_configs())[:6]


def _mm_call(aten=("aten::mm",)):
    return ([choice(a) for a in aten] + [choice("triton::mm", c) for c in CFGS]
            + [choice("decompose_k"), choice("triton::mm_persistent_tma"), choice("contiguous_mm")])


def _uids(cs):
    return [c.template.uid for c in cs]


def test_filter_keeps_the_ranked_configs_and_default_modes_aten_choice():
    call = _mm_call()
    tri = [c for c in call if c.template.uid == "triton::mm"]
    out = pc.filter_choices(call, "mm", True, [2, 4], pc.Policy(top_k=2))
    assert out == [call[0], tri[2], tri[4]]  # Inductor's order, the other templates gone
    alone = pc.filter_choices(call, "mm", True, [2], pc.Policy(keep_aten=False))
    assert alone == [tri[2]]  # no aten: nothing left to benchmark
    assert pc.filter_choices(call, "mm", False, [], pc.Policy()) == [call[0]]


def test_filter_picks_cublaslt_bias_epilogue_for_addmm():
    # under max_autotune_gemm aten::addmm gets the bias expanded (a copy, then beta=1); aten::bias_addmm is
    # default mode's kernel
    call = _mm_call(aten=("aten::bias_addmm", "aten::addmm"))
    assert _uids(pc.filter_choices(call, "addmm", False, [], pc.Policy())) == ["aten::bias_addmm"]
    call = _mm_call(aten=("aten::addmm",))
    assert _uids(pc.filter_choices(call, "addmm", False, [], pc.Policy())) == ["aten::addmm"]


def test_filter_leaves_other_ops_to_aten_and_never_empties_a_call():
    bmm = [choice("aten::bmm")] + [choice("triton::bmm", c) for c in CFGS]
    assert _uids(pc.filter_choices(bmm, "bmm", False, [], pc.Policy())) == ["aten::bmm"]
    conv = [choice("aten::convolution"), choice("triton::convolution2d")]
    assert _uids(pc.filter_choices(conv, "convolution", False, [], pc.Policy())) == ["aten::convolution"]
    only_templates = [choice("triton::mm", c) for c in CFGS]
    # a call with nothing the set-up keeps stays as Inductor made it (an empty list would fail the compile)
    assert pc.filter_choices(only_templates, "mm", False, [], pc.Policy()) == only_templates


@pytest.mark.parametrize("kw,field", [({"top_k": 0}, "top_k"), ({"triton_gain": -1.0}, "triton_gain"),
                                      ({"triton_gain": True}, "triton_gain"), ({"keep_aten": 1}, "keep_aten"),
                                      ({"keep_aten": False, "top_k": 2}, "top_k")])
def test_policy_refuses_bad_settings_naming_the_field(kw, field):
    with pytest.raises((ValueError, TypeError), match=field):
        pc.Policy(**kw)


@pytest.fixture(scope="module")
def predictor():
    p = Predictor.load(device="h100-sxm")
    return p.with_kernel("inductor") if p.has_static else p


PROBLEMS = [GemmProblem(m=8, n=4096, k=4096, dtype="bfloat16", transpose_right=True),
            GemmProblem(m=4096, n=3072, k=768, dtype="float16"),
            GemmProblem(m=1000, n=1000, k=1000, dtype="float16")]


@pytest.mark.parametrize("prob", PROBLEMS)
def test_decide_follows_the_models_times(predictor, prob):
    keep, best, cublas = pc.decide(predictor, prob, CFGS, pc.Policy(top_k=3))
    ranked = predictor.rank(prob, CFGS, top_k=3)
    assert [CFGS[i] for i, _ in best] == [c for c, _ in ranked]
    assert cublas == pytest.approx(predictor.predict_cublas(prob), rel=1e-6)
    assert keep == (best[0][1] <= cublas)  # triton_gain 0: kept where predicted at least as fast
    # a gain nothing can reach keeps aten alone; inf never keeps Triton
    assert pc.decide(predictor, prob, CFGS, pc.Policy(triton_gain=1e6))[0] is False
    assert pc.decide(predictor, prob, CFGS, pc.Policy(triton_gain=float("inf")))[0] is False
    assert pc.decide(predictor, prob, CFGS, pc.Policy(triton_gain=-0.999))[0] is True


def test_the_default_policy_keeps_the_models_top_three_beside_aten(predictor):
    """Synthetic choices and a synthetic model (the conftest's): Policy() keeps TOP_K = 3 Triton configs where
    Triton is kept, in the model's order; without keep_aten it keeps the top-1 alone."""
    pytest.importorskip("torch._inductor.choices")
    assert pc.Policy().top_k == pc.TOP_K == 3 and pc.Policy(keep_aten=False).top_k == 1
    pc.reset()
    handler = pc._handler_class()(predictor, pc.Policy(triton_gain=-0.999))
    out = handler._finalize_template_configs({"all": iter(_mm_call())}, MMInputs(2048, 3072, 768), [], "mm")
    assert _uids(out) == ["aten::mm"] + ["triton::mm"] * 3
    top3 = [str(c) for c, _ in predictor.rank(GemmProblem(m=2048, n=3072, k=768, dtype="float16"), CFGS, top_k=3)]
    (d,) = pc.decisions()
    assert d.configs == top3 and d.choices_kept == 4


def test_handler_decides_records_and_summarises(predictor):
    pytest.importorskip("torch._inductor.choices")
    pc.reset()
    handler = pc._handler_class()(predictor, pc.Policy(triton_gain=-0.999, top_k=1))  # Triton wherever it can
    call = _mm_call()
    out = handler._finalize_template_configs({"all": iter(call)}, MMInputs(2048, 3072, 768), [], "mm")
    assert _uids(out) == ["aten::mm", "triton::mm"]
    kept_cfg = out[1].params.to_kwargs()
    best = predictor.rank(GemmProblem(m=2048, n=3072, k=768, dtype="float16"), CFGS, top_k=1)[0][0]
    assert (kept_cfg["BLOCK_M"], kept_cfg["BLOCK_N"], kept_cfg["BLOCK_K"]) == (best.block_m, best.block_n,
                                                                               best.block_k)
    # an op the set-up does not rank keeps aten alone (bmm: tests/test_bmm_serve.py)
    conv = [choice("aten::convolution"), choice("triton::convolution2d")]
    assert _uids(handler._finalize_template_configs({"all": iter(conv)}, MMInputs(64, 64, 64), [],
                                                    "convolution")) == ["aten::convolution"]
    (d,) = pc.decisions()
    assert d.op == "mm" and d.triton and d.configs == [str(best)] and d.choices_kept == 2
    text = pc.summary()
    assert "mm 2048x768x3072 float16 NN" in text and "Triton" in text and "convolution x1" in text
    never = pc._handler_class()(predictor, pc.Policy(triton_gain=float("inf")))
    out = never._finalize_template_configs({"all": iter(_mm_call())}, MMInputs(2048, 3072, 768), [], "mm")
    assert _uids(out) == ["aten::mm"]
    pc.reset()
    assert pc.decisions() == []


def test_compile_refuses_mode_and_unknown_options():
    with pytest.raises(ValueError, match="mode"):
        pc.compile(torch.nn.Linear(4, 4), mode="max-autotune")
    with pytest.raises(ValueError, match="options"):
        pc.compile(torch.nn.Linear(4, 4), options={"no_such_inductor_option": 1})


@pytest.mark.gpu
def test_compile_runs_a_model_on_the_gpu():
    dev = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(768, 3072), torch.nn.GELU(), torch.nn.Linear(3072, 768)).to(
        dev, torch.float16).eval()
    x = torch.randn(2048, 768, device=dev, dtype=torch.float16)
    pc.reset()
    with torch.no_grad():
        ref = model(x)
        out = pc.compile(model)(x).clone()
    assert ((out.float() - ref.float()).norm() / ref.float().norm()).item() < 1e-2
    ops = {d.op for d in pc.decisions()}
    assert ops and ops <= {"mm", "addmm"}  # no bmm in this model


@pytest.mark.gpu
def test_compile_decides_the_backward_on_the_gpu():
    """On CUDA, autograd runs the backward (and AOTAutograd's lazy backward compile) on its own thread."""
    dev = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(768, 3072), torch.nn.GELU(), torch.nn.Linear(3072, 768)).to(
        dev, torch.bfloat16)
    x = torch.randn(2048, 768, device=dev, dtype=torch.bfloat16)
    pc.reset()
    pc.compile(model)(x).float().square().mean().backward()
    shapes = {(d.problem["m"], d.problem["k"], d.problem["n"]) for d in pc.decisions()}
    assert (768, 2048, 3072) in shapes or (3072, 2048, 768) in shapes, shapes  # a weight gradient


def test_expected_gain_rule_on_synthetic_times():
    from perfmodel.serve.decisions import triton_expected_gain

    assert triton_expected_gain(1.0, 0.9, 0.1) is True      # 0.9 x 1.1 = 0.99 <= 1.0
    assert triton_expected_gain(1.0, 0.95, 0.1) is False    # 1.045 > 1.0
    assert triton_expected_gain(1.0, 1.0, 0.0) is True      # as fast: kept at gain 0
    assert triton_expected_gain(1.0, 0.1, float("inf")) is False
    assert triton_expected_gain(1.0, float("inf"), -0.5) is False  # an unrunnable best is never kept
    assert triton_expected_gain(None, 0.5, 0.0) is True and triton_expected_gain(None, 0.5, 0.1) is False


@pytest.mark.slow
def test_compile_runs_through_inductor_on_the_cpu(tmp_path, monkeypatch):
    """The set-up end to end on the CPU: real Inductor lowering, real MMKernelInputs reaching the handler (the
    private API it relies on), aten kernels (no Triton template runs on the CPU), outputs equal to eager."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 32)).eval()
    x = torch.randn(48, 64)
    pc.reset()
    compiled = pc.compile(model)
    assert compiled.training is False and compiled._orig_mod is model  # attributes pass through
    with torch.no_grad():
        out = compiled(x)
        ref = model(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    ds = pc.decisions()
    assert ds, "the handler saw no mm/addmm"
    shapes = {(d.problem["m"], d.problem["k"], d.problem["n"]) for d in ds}
    assert shapes <= {(48, 64, 96), (48, 96, 32)} and all(d.problem["dtype"] == "float32" for d in ds)
    assert not any(d.triton for d in ds)  # no Triton template is offered on the CPU
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("as_mm", [False, True])
def test_1x1_convolution_stays_a_convolution_unless_asked(tmp_path, monkeypatch, as_mm):
    """Real Inductor lowering on the CPU: under max_autotune_gemm Inductor turns a channels-last 1x1 convolution
    into an mm; the set-up keeps default mode's convolution unless Policy(conv_1x1_as_mm=True)."""
    from torch._inductor import lowering

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    conv = lowering.lowerings[torch.ops.aten.convolution.default]
    model = torch.nn.Conv2d(32, 48, 1, bias=False).eval()
    x = torch.randn(2, 32, 8, 8).to(memory_format=torch.channels_last)
    pc.reset()
    with torch.no_grad():
        out = pc.compile(model, policy=pc.Policy(conv_1x1_as_mm=as_mm))(x)
        ref = model(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    shapes = {(d.op, d.problem["m"], d.problem["k"], d.problem["n"]) for d in pc.decisions()}
    assert shapes == ({("mm", 128, 32, 48)} if as_mm else set())
    assert lowering.lowerings[torch.ops.aten.convolution.default] is conv  # the lowering is put back
    torch._dynamo.reset()


def test_policy_refuses_a_non_bool_conv_flag():
    with pytest.raises(TypeError, match="conv_1x1_as_mm"):
        pc.Policy(conv_1x1_as_mm=1)


@pytest.mark.slow
def test_the_backward_graph_gets_the_set_up_too(tmp_path, monkeypatch):
    """A training step on the CPU through real Inductor: AOTAutograd compiles the backward at the first
    backward call, outside the forward call (on a GPU, on autograd's own thread); the set-up's handler
    decides its GEMMs as well (the weight and input gradients), and gradients equal eager's."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 96)
    ref_model = torch.nn.Linear(64, 96)
    ref_model.load_state_dict(model.state_dict())
    x = torch.randn(48, 64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    pc.reset()
    pc.compile(model)(x).square().sum().backward()
    ref_model(x_ref).square().sum().backward()
    torch.testing.assert_close(model.weight.grad, ref_model.weight.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-4)
    shapes = {(d.problem["m"], d.problem["k"], d.problem["n"]) for d in pc.decisions()}
    assert (48, 64, 96) in shapes                       # the forward's addmm
    assert {(48, 96, 64), (96, 48, 64)} <= shapes      # grad input and grad weight
    torch._dynamo.reset()
