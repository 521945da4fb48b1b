"""Serving batched GEMMs (GemmProblem(batch > 1)): the Predictor's routing to the bmm heads in both backends,
its refusals, and the two Inductor hooks on bmm/baddbmm -- on a random-weight model folder with bmm heads
fitted to SYNTHETIC bmm shards (tests/_synthetic.py), and on SYNTHETIC Inductor choices (stand-ins with the
attributes Inductor's KernelTemplateChoice and MMKernelInputs have; no GPU, no compile). The GPU test
compiles a small bmm model with the whole-model set-up."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from perfmodel import GemmConfig, GemmProblem, Predictor, artifact
from perfmodel.configs import inductor_default_configs
from perfmodel.devices import get_spec
from perfmodel.features import bmm_problems_tensor, configs_tensor
from perfmodel.serve import bmm as sbmm
from perfmodel.serve import compile as pc
from perfmodel.serve import inductor as si
from perfmodel.serve import pad_hook
from perfmodel.train.bmm_head import BmmHeadSettings
from perfmodel.train.refit import refit_bmm
from tests._inductor import choice
from tests._synthetic import write_synthetic_bmm, write_synthetic_model

CFGS = list(inductor_default_configs())[:8]
PROB = GemmProblem(m=512, n=512, k=64, dtype="float16", transpose_right=True, batch=96)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("bmm-serve")
    model = write_synthetic_model(root / "m", hidden=(16, 16))
    # small and few epochs: the tests check the serving of the heads, not their fit (the call head's defaults, 5
    # members x 400 epochs, were most of the module's time)
    refit_bmm(BmmHeadSettings(model=model, data=write_synthetic_bmm(root / "h100", n_problems=32), hidden=(32, 32),
                              members=2, epochs=20, call_hidden=(16,), call_members=1, call_epochs=20),
              log=lambda *a: None)
    return model


@pytest.fixture(scope="module")
def plain_dir(tmp_path_factory: pytest.TempPathFactory):
    return write_synthetic_model(tmp_path_factory.mktemp("plain") / "m", hidden=(16,))


@pytest.fixture(scope="module", params=["torch", "onnx"])
def pred(model_dir, request) -> Predictor:
    if request.param == "onnx":
        pytest.importorskip("onnxruntime")
    return Predictor.load(model_dir, backend=request.param)


def _expected_log_ms(model_dir, prob: GemmProblem, cfgs) -> np.ndarray:
    """The bmm head's log ms, straight from the folder's weights (the unfolded module)."""
    b = artifact.load(model_dir)
    with torch.inference_mode():
        x = b.encoders[artifact.BMM].encode_cross(bmm_problems_tensor([prob]), configs_tensor(cfgs))
        return b.heads[artifact.BMM](x).double().numpy()


def test_batched_problems_are_served_by_the_bmm_head(pred, model_dir):
    ms = pred.predict(PROB, CFGS)
    # the onnx graph agrees with the weights to float rounding (the runner's own load check: rtol 1e-3)
    assert np.allclose(np.log(ms), _expected_log_ms(model_dir, PROB, CFGS), rtol=1e-3, atol=1e-4)
    assert not np.allclose(ms, pred.predict(GemmProblem(**{**PROB.as_dict(), "batch": 1}), CFGS))
    ranked = pred.rank(PROB, CFGS, top_k=3)
    assert [t for _, t in ranked] == sorted(t for _, t in ranked) and len(ranked) == 3
    # ties aside, the ranking is the predicted times' order
    assert ranked[0][1] == pytest.approx(ms.min(), rel=1e-5)
    many = pred.predict_many([PROB, GemmProblem(**{**PROB.as_dict(), "batch": 8})], CFGS)
    assert many.shape == (2, len(CFGS)) and np.allclose(many[0], ms, rtol=1e-6)
    assert [c for c, _ in pred.rank_many([PROB], CFGS, top_k=3)[0]] == [c for c, _ in ranked]


def test_the_physical_floor_is_the_whole_batchs(pred):
    spec = get_spec("h100-sxm")
    big = GemmProblem(m=8192, n=8192, k=8192, dtype="float16", batch=64)
    roof_ms = 1e3 * max(big.flops / spec.peak_flops("float16"), big.min_bytes / spec.peak_bytes_per_s())
    assert (pred.predict(big, CFGS) >= roof_ms * (1 - 1e-5)).all()
    assert pred.predict_cublas(big) >= roof_ms * (1 - 1e-5)


def test_candidates_and_the_aten_call(pred):
    """aten::bmm's time is the one the call implies against the whole space's best config: below it exactly
    where the call says aten wins; every caller (candidates, prefers_cublas_many, the hooks) weighs that one
    time against the best config it shows or offers (SYNTHETIC model)."""
    c = pred.candidates(PROB, CFGS, top_k=2, margin=0.0)
    aten = pred.predict_cublas(PROB)
    call = float(sbmm.call_scores(pred, [PROB])[0])  # the bmm call head: below 0, aten::bmm wins
    space = pred.candidates(PROB, top_k=2)
    assert c.cublas_ms == aten == space.cublas_ms
    assert aten == pytest.approx(space.best_ms * np.exp(call), rel=1e-12)
    assert c.prefer_cublas == (aten < c.best_ms)                # a list of the caller's own: its best's time
    assert space.prefer_cublas == (call < 0) == (aten < space.best_ms)
    assert list(c.configs) == [cfg for cfg, _ in pred.rank(PROB, CFGS, top_k=2)]
    assert pred.prefers_cublas_many([PROB]).tolist() == [call < 0]
    assert sbmm.aten_call_ms(pred, PROB) == aten                 # the hooks weigh the same time
    assert pred.has_bmm


def test_candidates_of_a_bmm_score_the_space_once(pred, monkeypatch):
    """candidates() over the model's own space scores it with the bmm head once (the implied aten::bmm time
    comes from that pass), and its cublas_ms is predict_cublas's (SYNTHETIC model)."""
    calls = []
    real = sbmm.scores
    monkeypatch.setattr(sbmm, "scores", lambda *a, **kw: calls.append(a[2]) or real(*a, **kw))
    c = pred.candidates(PROB, top_k=3)
    assert calls == [None]
    calls.clear()
    assert c.cublas_ms == pred.predict_cublas(PROB)
    assert calls == []  # the space's best is kept from candidates' pass (Predictor.space_best_ms)
    assert list(c.configs)[:3] == [cfg for cfg, _ in pred.rank(PROB, top_k=3)]


def test_a_config_the_device_cannot_run_ranks_last(pred):
    huge = GemmConfig(256, 256, 256, 8, 5, 4)  # fp32: far over the shared memory
    prob = GemmProblem(**{**PROB.as_dict(), "dtype": "float32"})
    ranked = pred.rank(prob, [huge, *CFGS[:3]], top_k=4)
    assert ranked[-1] == (huge, float("inf")) and all(np.isfinite(t) for _, t in ranked[:-1])
    assert huge not in pred.candidates(prob, [huge, *CFGS[:3]], top_k=4).configs


@pytest.mark.parametrize("batch, error", [(0, ValueError), (-2, ValueError), (2.5, TypeError), (True, TypeError),
                                          ("4", TypeError)])
def test_bad_batches_are_refused_naming_the_field(batch, error):
    with pytest.raises(error, match="batch"):
        GemmProblem(m=64, n=64, k=64, dtype="float16", batch=batch)


def test_mixing_plain_and_batched_problems_is_refused(pred):
    with pytest.raises(ValueError, match="batch"):
        pred.predict_many([PROB, GemmProblem(m=64, n=64, k=64, dtype="float16")], CFGS)


def test_a_model_without_bmm_heads_names_the_missing_head(plain_dir):
    p = Predictor.load(plain_dir, backend="torch")
    assert not p.has_bmm
    for call in (lambda: p.predict(PROB, CFGS), lambda: p.rank(PROB, CFGS), lambda: p.candidates(PROB, CFGS),
                 lambda: p.predict_cublas(PROB)):
        with pytest.raises(ValueError, match=r"batch.*'bmm(_aten)?' head"):
            call()


# ------------------------------------------------------------------ the hooks, on synthetic choices

class _BmmInputs:
    """A stand-in for MMKernelInputs of a bmm (SYNTHETIC): nodes (mat1 [b, m, k], mat2 [b, k, n]), mat2 a
    transposed view (its k stride 1); baddbmm: (bias, mat1, mat2)."""

    def __init__(self, p: GemmProblem, bias: bool = False) -> None:
        self.p, self.bias = p, bias
        self._mat1_idx, self._mat2_idx = -2, -1

    def nodes(self):
        return [object()] * (3 if self.bias else 2)

    def shapes_hinted(self):
        p = self.p
        return [(p.batch, p.m, p.n)] * self.bias + [(p.batch, p.m, p.k), (p.batch, p.k, p.n)]

    def strides_hinted(self):
        p = self.p
        return [(p.m * p.n, p.n, 1)] * self.bias + [(p.m * p.k, p.k, 1), (p.k * p.n, 1, p.k)]

    def mnk_hinted(self):
        return self.p.m, self.p.n, self.p.k

    def dtypes(self):
        return [torch.float16] * len(self.nodes())


def _bmm_call():
    return [choice("aten::bmm")] + [choice("triton::bmm", c) for c in CFGS] + [choice("triton::mm", CFGS[0])]


@pytest.mark.parametrize("op, bias", [("bmm", False), ("baddbmm", True)])
def test_the_max_autotune_hook_keeps_the_bmm_heads_top_k(model_dir, op, bias):
    pred = Predictor.load(model_dir, backend="torch")
    assert si.problem_from_kernel_inputs(_BmmInputs(PROB, bias)) == PROB
    call = _bmm_call()
    out = si.filter_template_choices(call, _BmmInputs(PROB, bias), op, pred, top_k=3)
    best = {str(c) for c, _ in pred.rank(PROB, CFGS, top_k=3)}
    kept = [c for c in out if c.template.uid == "triton::bmm"]
    assert {str(si.kwargs_to_gemm(c.params.to_kwargs())) for c in kept} == best and len(kept) == 3
    assert out[0] is call[0] and out[-1] is call[-1]  # aten::bmm and another template's choice pass through
    # a model without bmm heads leaves the call to Inductor
    assert si.filter_template_choices(call, _BmmInputs(PROB), op, Predictor.load(write_plain(model_dir)), 3) is call


def test_the_max_autotune_hook_keeps_bmm_top_k_bmm_configs(model_dir):
    """install's bmm_top_k (default BMM_TOP_K, 1) sizes the bmm ranking, top_k the mm one (SYNTHETIC choices)."""
    pytest.importorskip("torch._inductor.choices")
    pred = Predictor.load(model_dir, backend="torch")

    def kept(handler, op):
        out = handler._finalize_template_configs({"all": iter(_bmm_call())}, _BmmInputs(PROB), [], op)
        return [c for c in out if c.template.uid == "triton::bmm"]

    best = [str(c) for c, _ in pred.rank(PROB, CFGS, top_k=3)]
    for bmm_top_k, want in ((None, 3), (1, 1), (2, 2)):
        handler = si._handler_class()(pred, 3, si.RANKED_OPS, si.RANKED_TEMPLATES, None, bmm_top_k)
        got = [str(si.kwargs_to_gemm(c.params.to_kwargs())) for c in kept(handler, "bmm")]
        assert len(got) == want and set(got) == set(best[:want])
    assert si.BMM_TOP_K == 1
    with pytest.raises(ValueError, match="bmm_top_k: must be >= 1"):
        si.install(3, pred, bmm_top_k=0)
    with pytest.raises(TypeError, match="bmm_top_k: expected an int"):
        si.install(3, pred, bmm_top_k=1.5)
    assert not si.is_installed()


def test_the_set_ups_bmm_top_k(model_dir):
    """Policy(bmm_top_k=...) sizes the set-up's bmm ranking apart from top_k (SYNTHETIC choices)."""
    pytest.importorskip("torch._inductor.choices")
    pred = Predictor.load(model_dir, backend="torch")
    for bmm_top_k, want in ((None, 3), (1, 1)):
        pc.reset()
        handler = pc._handler_class()(pred, pc.Policy(triton_gain=-0.999, top_k=3, bmm_top_k=bmm_top_k))
        out = handler._finalize_template_configs({"all": iter(_bmm_call())}, _BmmInputs(PROB), [], "bmm")
        assert [c.template.uid for c in out].count("triton::bmm") == want
        (d,) = pc.decisions()
        assert d.configs == [str(c) for c, _ in pred.rank(PROB, CFGS, top_k=want)]
    pc.reset()
    with pytest.raises(ValueError, match="bmm_top_k: must be >= 1"):
        pc.Policy(bmm_top_k=0)
    with pytest.raises(ValueError, match="bmm_top_k: without keep_aten"):
        pc.Policy(keep_aten=False, bmm_top_k=2)
    assert pc.Policy().bmm_top_k == pc.BMM_TOP_K == 1  # the set-up's default: one Triton config for a bmm


def write_plain(model_dir):
    folder = model_dir.parent / "plain"
    if not folder.exists():
        write_synthetic_model(folder, hidden=(16,))
    return folder


def test_the_whole_model_handler_decides_a_bmm_by_the_models_call(model_dir):
    pytest.importorskip("torch._inductor.choices")
    pred = Predictor.load(model_dir, backend="torch")
    for gain, want in ((-0.999, ["aten::bmm", "triton::bmm"]), (float("inf"), ["aten::bmm"])):
        pc.reset()
        handler = pc._handler_class()(pred, pc.Policy(triton_gain=gain, top_k=1))
        out = handler._finalize_template_configs({"all": iter(_bmm_call())}, _BmmInputs(PROB), [], "bmm")
        assert [c.template.uid for c in out] == want
        (d,) = pc.decisions()
        assert d.op == "bmm" and d.problem["batch"] == 96 and d.triton == (len(want) == 2)
        best_ms = pred.rank(PROB, CFGS, top_k=1)[0][1]
        assert d.cublas_ms == pytest.approx(sbmm.aten_call_ms(pred, PROB, best_ms), rel=1e-6)
        if d.triton:
            assert d.configs == [str(pred.rank(PROB, CFGS, top_k=1)[0][0])]
        assert "bmm 96x512x64x512 float16 NT" in pc.summary()
    # without bmm heads: aten alone, as default mode
    pc.reset()
    plain = pc._handler_class()(Predictor.load(write_plain(model_dir)), pc.Policy(triton_gain=-0.999))
    out = plain._finalize_template_configs({"all": iter(_bmm_call())}, _BmmInputs(PROB), [], "bmm")
    assert [c.template.uid for c in out] == ["aten::bmm"] and pc.decisions() == []
    assert "bmm x1" in pc.summary()
    pc.reset()


@pytest.mark.gpu
def test_the_set_up_compiles_a_bmm_model_on_the_gpu():
    """The shipped model (with bmm heads) under perfmodel.serve.compile: an attention-like bmm pair; the
    decisions include op bmm, the outputs match eager."""
    dev = torch.device("cuda")

    class Attn(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)) / 8.0, -1), v)

    q, k, v = (torch.randn(32, 256, 64, device=dev, dtype=torch.float16) for _ in range(3))
    pc.reset()
    with torch.no_grad():
        ref = Attn()(q, k, v)
        out = pc.compile(Attn())(q, k, v).clone()
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    ds = pc.decisions()
    assert "bmm" in {d.op for d in ds}, pc.summary()
    assert all(d.problem.get("batch") == 32 for d in ds if d.op == "bmm")


@pytest.mark.parametrize("ratio, sure", [(2.0, True), (1.2, True), (1.1, False), (0.5, False)])
def test_a_bmm_the_model_is_sure_of_keeps_its_best_config_alone(model_dir, monkeypatch, ratio, sure):
    """Both hooks: where the aten::bmm time the call implies is >= (1 + BMM_SURE_GAIN) x the best ranked
    config's, that config alone (no aten choice: Inductor benchmarks nothing); else the choices as before.
    The call's aten time is set here as a ratio to the best config's (SYNTHETIC choices)."""
    pytest.importorskip("torch._inductor.choices")
    pred = Predictor.load(model_dir, backend="torch")
    best = pred.rank(PROB, CFGS, top_k=1)[0][1]                   # of the configs the choices offer
    monkeypatch.setattr(sbmm, "aten_call_ms", lambda p, prob, best_ms=None: best * ratio)
    top1 = str(pred.rank(PROB, CFGS, top_k=1)[0][0])
    assert si.BMM_SURE_GAIN == pc.BMM_SURE_GAIN == 0.2

    def configs(out):
        return [str(si.kwargs_to_gemm(c.params.to_kwargs())) for c in out if c.template.uid == "triton::bmm"]

    call = _bmm_call()
    out = si.filter_template_choices(call, _BmmInputs(PROB), "bmm", pred, top_k=1, cublas_margin=-0.05,
                                     bmm_sure_gain=si.BMM_SURE_GAIN)
    dropped = ratio * (1 - 0.05) < 1.0  # the cublas_margin rule: aten alone
    want = ["triton::bmm", "triton::mm"] if sure else ["aten::bmm", "triton::mm"] if dropped else \
        ["aten::bmm", "triton::bmm", "triton::mm"]
    assert [c.template.uid for c in out] == want
    assert configs(out) == ([] if dropped else [top1])
    # without the rule (None) aten::bmm stays beside the config
    out = si.filter_template_choices(call, _BmmInputs(PROB), "bmm", pred, top_k=1, cublas_margin=None,
                                     bmm_sure_gain=None)
    assert [c.template.uid for c in out] == ["aten::bmm", "triton::bmm", "triton::mm"]
    # the whole-model set-up: the same rule, recorded in the decision and the summary
    pc.reset()
    handler = pc._handler_class()(pred, pc.Policy(triton_gain=0.0, top_k=3, bmm_top_k=2))
    out = handler._finalize_template_configs({"all": iter(_bmm_call())}, _BmmInputs(PROB), [], "bmm")
    (d,) = pc.decisions()
    if ratio < 1.0:
        assert [c.template.uid for c in out] == ["aten::bmm"] and not d.triton and not d.sure
    else:
        assert d.triton and d.sure == sure
        assert [c.template.uid for c in out] == (["triton::bmm"] if sure else ["aten::bmm", "triton::bmm", "triton::bmm"])
        assert top1 in configs(out) and d.configs[0] == top1 and len(d.configs) == (1 if sure else 2)
        assert ("sure: not benchmarked" in pc.summary()) == sure
    pc.reset()


def test_the_sure_gain_is_checked_naming_the_field(model_dir):
    from perfmodel.serve.decisions import bmm_sure

    assert bmm_sure(1.2, 1.0, 0.2) and not bmm_sure(1.19, 1.0, 0.2) and not bmm_sure(10.0, 1.0, None)
    assert not bmm_sure(None, 1.0, 0.2) and not bmm_sure(10.0, float("inf"), 0.2) and not bmm_sure(10.0, 1.0, float("inf"))
    for bad in (-0.1, "0.2", True, float("nan")):
        with pytest.raises(ValueError, match="bmm_sure_gain"):
            pc.Policy(bmm_sure_gain=bad)
        with pytest.raises(ValueError, match="bmm_sure_gain"):
            si.install(3, Predictor.load(model_dir, backend="torch"), bmm_sure_gain=bad)
    assert not si.is_installed()
    assert pc.Policy(bmm_sure_gain=None).bmm_sure_gain is None


def test_the_pad_hook_leaves_a_bmm_the_model_keeps_triton_for_unpadded(model_dir, monkeypatch):
    """install(pad=True): a bmm pad_mm would pad stays unpadded where the model keeps Triton for it (its best
    config predicted faster than the aten::bmm its call implies, set here as a ratio: SYNTHETIC) and the
    compile autotunes Triton; elsewhere Inductor's own benchmark decides."""
    from torch._inductor.fx_passes import pad_mm

    pred = Predictor.load(model_dir, backend="torch")
    calls = []

    def original(match, mat1, mat2, op, input=None):
        calls.append(tuple(mat1.shape))
        return "inductor's own"

    monkeypatch.setattr(pad_mm, "_should_pad", original)
    a = torch.randn(96, 49, 32, dtype=torch.float16)
    b = torch.randn(96, 49, 32, dtype=torch.float16).transpose(1, 2)   # k^T: a transposed view
    prob = GemmProblem(m=49, n=49, k=32, dtype="float16", transpose_right=True, batch=96)
    assert si.bmm_problem_from_match(a, b) == prob
    assert si.bmm_problem_from_match(a[0], b[0]) is None and si.bmm_problem_from_match(a, b.float()) is None
    assert si.install(3, pred, pad=True)
    try:
        hooked = pad_mm._should_pad
        best = pred.rank(prob, list(inductor_default_configs()), top_k=1)[0][1]   # of the configs offered
        for in_play, ratio, want in ((True, 1.5, False), (True, 0.8, "inductor's own"), (False, 1.5, "inductor's own")):
            monkeypatch.setattr(pad_hook, "_triton_mm_in_play", lambda: in_play)
            monkeypatch.setattr(sbmm, "aten_call_ms", lambda p, q, best_ms=None: best * ratio)
            assert hooked(None, a, b, torch.ops.aten.bmm) == want
        (logged,) = si.bmm_pad_decisions()
        assert logged[:2] == (prob, False) and logged[2] == pytest.approx(best) and logged[3] == pytest.approx(1.5 * best)
        assert len(calls) == 2
    finally:
        si.uninstall()
    assert pad_mm._should_pad is original and si.bmm_pad_decisions() == []


@pytest.mark.gpu
def test_the_set_up_leaves_a_window_attention_bmm_unpadded_on_the_gpu():
    """Swin-style window attention (49 tokens: pad_mm would pad M, K or N to 56) under the whole-model set-up
    with the shipped model: where the model keeps Triton the bmm is lowered unpadded (the pad hook's bmm
    rule), and the outputs match eager."""
    dev = torch.device("cuda")

    class Attn(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)) * 0.17, -1), v)

    q, k, v = (torch.randn(1536, 49, 32, device=dev, dtype=torch.float16) for _ in range(3))
    pc.reset()
    with torch.no_grad():
        ref = Attn()(q, k, v)
        out = pc.compile(Attn())(q, k, v).clone()
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    kept = [d for d in pc.decisions() if d.op == "bmm" and d.triton]
    assert kept, pc.summary()
    assert all(d.problem["m"] == 49 and 56 not in (d.problem["k"], d.problem["n"]) for d in kept), pc.summary()
    pc.reset()
