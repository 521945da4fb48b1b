"""float32 GEMMs on TF32 in both Inductor hooks: the problem the model ranks has allow_tf32 as the compile has
it -- the configs' own ALLOW_TF32 (Inductor's templates turn TF32 on only above a size threshold), else torch's
float32 matmul setting. On SYNTHETIC Inductor choices (stand-ins with the attributes Inductor's
KernelTemplateChoice and MMKernelInputs have) and a random-weight model folder: no GPU, no compile."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from perfmodel import GemmProblem, Predictor
from perfmodel.configs import inductor_default_configs
from perfmodel.serve import compile as pc
from perfmodel.serve import gemm_decisions as gd
from perfmodel.serve import inductor as si
from tests._inductor import MMInputs, choice
from tests._synthetic import write_synthetic_model

CFGS = list(inductor_default_configs())[:8]


@pytest.fixture(scope="module")
def pred(tmp_path_factory: pytest.TempPathFactory) -> Predictor:
    return Predictor.load(write_synthetic_model(tmp_path_factory.mktemp("tf32") / "m", hidden=(16,), onnx=False),
                          backend="torch")


@pytest.fixture
def precision():
    """Sets torch's float32 matmul precision ("tf32" / "ieee") for one test, and puts the old one back."""
    mm = torch.backends.cuda.matmul
    old = mm.fp32_precision

    def set_(value: str) -> None:
        mm.fp32_precision = value
    yield set_
    mm.fp32_precision = old


def _mm_call(tf32: bool) -> list:
    return [choice("aten::mm")] + [choice("triton::mm", c, tf32) for c in CFGS]


def _inputs(dtype=torch.float32) -> MMInputs:
    """x @ W.T of a 4096x768 activation and a 768x768 weight."""
    return MMInputs(4096, 768, 768, dtype, b_col_major=True)


IEEE = GemmProblem(m=4096, n=768, k=768, dtype="float32", transpose_right=True)
TF32 = GemmProblem(m=4096, n=768, k=768, dtype="float32", allow_tf32=True, transpose_right=True)


def test_the_matmul_setting_and_the_configs_flag_decide_tf32(precision):
    ki = _inputs()
    precision("tf32")
    assert si.fp32_matmul_on_tf32()
    assert si.problem_from_kernel_inputs(ki) == TF32
    assert si.problem_from_kernel_inputs(ki, False) == IEEE          # a template below Inductor's TF32 threshold
    precision("ieee")
    assert not si.fp32_matmul_on_tf32()
    assert si.problem_from_kernel_inputs(ki) == IEEE
    assert si.problem_from_kernel_inputs(ki, True) == TF32
    assert si.template_allow_tf32(_mm_call(True)) is True
    assert si.template_allow_tf32(_mm_call(False)) is False
    assert si.template_allow_tf32([choice("aten::mm")] + [SimpleNamespace(template=None)]) is False
    assert si.template_allow_tf32([SimpleNamespace(template=None)]) is None
    # half precision never carries the flag
    half = _inputs(torch.float16)
    precision("tf32")
    assert not si.problem_from_kernel_inputs(half).allow_tf32


@pytest.mark.parametrize("tf32, want", [(True, TF32), (False, IEEE)])
def test_the_max_autotune_hook_ranks_the_problem_its_configs_compile(pred, precision, monkeypatch, tf32, want):
    """Matmuls on TF32: the hook ranks a TF32 problem where the configs have ALLOW_TF32, an IEEE one where
    Inductor left it off."""
    precision("tf32")
    seen = []
    rank = gd.rank_positions
    monkeypatch.setattr(gd, "rank_positions", lambda p, prob, *a, **k: (seen.append(prob), rank(p, prob, *a, **k))[1])
    out = si.filter_template_choices(_mm_call(tf32), _inputs(), "mm", pred, top_k=3)
    assert seen == [want]
    kept = [c for c in out if c.template.uid == "triton::mm"]
    assert len(kept) == 3 and {str(si.kwargs_to_gemm(c.params.to_kwargs())) for c in kept} == \
        {str(c) for c, _ in pred.rank(want, CFGS, top_k=3)}


@pytest.mark.parametrize("setting, tf32, want", [("tf32", True, TF32), ("tf32", False, IEEE), ("ieee", False, IEEE)])
def test_the_whole_model_set_up_decides_the_problem_its_configs_compile(pred, precision, setting, tf32, want):
    """The set-up records (and decides) the TF32 problem where the configs run on TF32: before, every float32
    problem was decided as IEEE float32, whose cuBLAS and Triton times are several times longer."""
    pytest.importorskip("torch._inductor.choices")
    precision(setting)
    pc.reset()
    try:
        handler = pc._handler_class()(pred, pc.Policy(triton_gain=-0.999, top_k=2))
        handler._finalize_template_configs({"all": iter(_mm_call(tf32))}, _inputs(), [], "mm")
        (d,) = pc.decisions()
        assert d.problem == {**d.problem, "allow_tf32": want.allow_tf32, "dtype": "float32"}
        assert d.configs == [str(c) for c, _ in pred.rank(want, CFGS, top_k=2)]
    finally:
        pc.reset()


@pytest.mark.gpu
@pytest.mark.parametrize("setting", ["tf32", "ieee"])
def test_the_set_up_decides_a_float32_model_as_its_matmuls_run_on_the_gpu(precision, setting):
    """A float32 MLP compiled by the whole-model set-up on the GPU: every decided GEMM is a TF32 problem with
    TF32 on (the 2048x3072x768 sizes are above Inductor's threshold), an IEEE one without; the output matches
    eager under the same setting."""
    dev = torch.device("cuda")
    precision(setting)
    model = torch.nn.Sequential(torch.nn.Linear(768, 3072), torch.nn.GELU(), torch.nn.Linear(3072, 768)).to(dev).eval()
    x = torch.randn(2048, 768, device=dev)
    pc.reset()
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            ref = model(x)
            out = pc.compile(model)(x).clone()
        assert ((out - ref).norm() / ref.norm()).item() < 1e-2
        probs = [d.problem for d in pc.decisions()]
        assert probs and all(p["dtype"] == "float32" and p["allow_tf32"] == (setting == "tf32") for p in probs), probs
    finally:
        pc.reset()
        torch._dynamo.reset()
