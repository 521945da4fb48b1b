"""The serving engine: each runner (perfmodel.serve.runners.Runner) declares the heads and kernel modes it
serves, Predictor.backend names what runs, the onnx backend serves kernel="inductor" from its own graphs;
and perfmodel.serve.decisions, the one place of the cuBLAS-or-Triton and pad decisions (checked on
synthetic inputs, said in each test)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from perfmodel import GemmProblem, PadDecision, PadProblem, Predictor
from perfmodel.serve import decisions, onnx_runner, runners
from perfmodel.serve.runners import KERNELS, Runner

REPO = Path(__file__).resolve().parent.parent
H100, H200 = REPO / "models" / "h100", REPO / "models" / "h200"
PROBLEMS = [GemmProblem(m=4096, n=4096, k=4096, dtype="float16"),
            GemmProblem(m=128, n=1000, k=4096, dtype="float16"),
            GemmProblem(m=1000, n=37, k=129, dtype="float16", transpose_left=True),
            GemmProblem(m=3000, n=4095, k=2049, dtype="float16"),
            GemmProblem(m=1, n=8192, k=8192, dtype="float16"),
            GemmProblem(m=1024, n=50257, k=768, dtype="float16", transpose_right=True)]
# torch and onnxruntime sum the same float32 products in different orders: their log ms differ by ~1e-6
# relative on this CPU (the load-time stale-export check allows 1e-3). 1e-4 is far above any CPU's
# rounding of these few-hundred-term sums, and far below a real disagreement (a wrong head: > 1e-2).
RTOL = 1e-4


H100_KERNELS = ("autotune", "inductor")   # models/h100's config network; it has no tutorial head


@pytest.fixture(scope="module")
def engines() -> dict[tuple[str, str], Predictor]:
    return {(b, k): Predictor.load(H100, backend=b, kernel=k) for b in ("torch", "onnx") for k in H100_KERNELS}


def test_each_runner_declares_its_heads_and_kernel_modes(engines) -> None:
    for (backend, kernel), p in engines.items():
        run = p._run
        assert isinstance(run, Runner) and run.backend == backend == p.backend
        assert run.heads == frozenset(p.bundle.heads)          # every head of the shipped model, both backends
        assert run.kernels == frozenset(H100_KERNELS)          # models/h100's config network serves both
    with pytest.raises(ValueError, match="tutorial head"):
        Predictor.load(H100, backend="torch", kernel="tutorial")
    for backend in ("torch", "onnx"):   # models/h200: its inductor and tutorial heads serve those modes
        p = Predictor.load(H200, backend=backend)
        assert p._run.kernels == frozenset(KERNELS) and {"gemm_inductor", "gemm_tutorial"} <= p._run.heads
        assert "static" not in p._run.heads
        assert p.bundle.config_net is None and Predictor.load(H200, backend=backend, kernel="inductor").has_static
        assert p.with_kernel("tutorial").predict_head == "gemm_tutorial"
    with pytest.raises(TypeError):
        Runner()  # an interface: only the backends are built


def test_backend_names_what_runs_and_onnx_serves_inductor(engines, monkeypatch: pytest.MonkeyPatch) -> None:
    """The onnx backend serves kernel="inductor" without a torch runner: predict and rank through the config
    network's inductor mode (its head session), the fast path through the traced ranking graph."""
    po = engines[("onnx", "inductor")]
    assert po.backend == "onnx" and type(po._run) is onnx_runner._OnnxRunner
    assert po._run.ranks("inductor", po.screen_keep, 5) and po.predict_head == "gemm_inductor"
    calls = []
    for name in ("rank", "score_log_ms"):
        real = getattr(po._run, name)
        monkeypatch.setattr(po._run, name,
                            lambda *a, real=real, name=name: calls.append((name, a[-1] if name == "rank" else a[0]))
                            or real(*a))
    # no torch runner anywhere: building one would mean a fallback
    monkeypatch.setattr(runners._TorchRunner, "__init__", lambda *a: pytest.fail("a torch runner was built"))
    po.rank(PROBLEMS[0], top_k=5)
    po.predict(PROBLEMS[0])
    po.rank(PROBLEMS[0], top_k=5, screened=True)
    assert calls == [("score_log_ms", "gemm_inductor"), ("score_log_ms", "gemm_inductor"), ("rank", "inductor")]
    assert po.with_kernel("autotune").backend == "onnx"


def test_onnx_inductor_agrees_with_torch(engines) -> None:
    for kernel in H100_KERNELS:
        pt, po = engines[("torch", kernel)], engines[("onnx", kernel)]
        a, b = pt.predict_many(PROBLEMS[:4]), po.predict_many(PROBLEMS[:4])
        np.testing.assert_allclose(b, a, rtol=RTOL, err_msg=kernel)
        flipped = 0
        for prob in PROBLEMS:
            rt, ro = pt.rank(prob, top_k=5), po.rank(prob, top_k=5)
            np.testing.assert_allclose([t for _, t in ro], [t for _, t in rt], rtol=RTOL, err_msg=str(prob))
            # two configs predicted within rounding of each other may swap on another CPU: one problem allowed
            flipped += [c for c, _ in rt] != [c for c, _ in ro]
        assert flipped <= 1, kernel
    # the inductor mode is not the autotune one on either backend (the static head's output is added)
    assert not np.allclose(engines[("onnx", "inductor")].predict(PROBLEMS[3]),
                           engines[("onnx", "autotune")].predict(PROBLEMS[3]), rtol=1e-3)


def test_onnx_file_without_inductor_graphs_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model.onnx exported before the inductor graphs existed (simulated: the loader sees none)."""
    real = onnx_runner._split_graphs

    def old_export(data: bytes):
        heads, cut, outputs = real(data)
        return heads, cut, {o for o in outputs if "static" not in o or o.startswith("static_")}

    monkeypatch.setattr(onnx_runner, "_split_graphs", old_export)
    with pytest.raises(ValueError, match=r"onnx backend cannot serve kernel='inductor'.*export-onnx.*backend='torch'"):
        Predictor.load(H100, backend="onnx", kernel="inductor")
    ox = Predictor.load(H100, backend="onnx")
    assert ox._run.kernels == frozenset({"autotune"})
    with pytest.raises(ValueError, match="cannot serve kernel='inductor'"):
        ox.with_kernel("inductor")
    auto = Predictor.load(H100, kernel="inductor")   # backend None: the one that serves the mode
    assert auto.backend == "torch" == auto._run.backend


# ------------------------------------------------------------------------------------------ decisions
def test_cublas_preferred_on_synthetic_inputs() -> None:
    # synthetic values: no model involved. The call is the times: cuBLAS's below the best Triton config's
    assert decisions.cublas_preferred(1.0, 1.1) and not decisions.cublas_preferred(1.1, 1.0)
    assert not decisions.cublas_preferred(1.0, 1.0)                # a tie keeps Triton
    assert decisions.cublas_preferred(np.array([1.0, 2.0]), np.array([1.5, 1.5])).tolist() == [True, False]
    # the call head's time: best x exp(call), floored at the roofline
    assert decisions.implied_cublas_ms(2.0, math.log(1.5), 0.1) == pytest.approx(3.0)
    assert decisions.implied_cublas_ms(2.0, -math.log(4.0), 0.1) == pytest.approx(0.5)
    assert decisions.implied_cublas_ms(2.0, -math.log(4.0), 1.0) == 1.0          # the floor
    call = np.array([-0.2, -0.01, 0.0, 0.3])
    best = np.array([1.0, 2.0, 3.0, 4.0])
    implied = decisions.implied_cublas_ms(best, call, np.zeros(4))
    assert decisions.cublas_preferred(implied, best).tolist() == (call < 0).tolist()  # the call, as times
    # at the floor (best == roofline) a call below 0 is lifted to the floor: no faster than the best config
    assert not decisions.cublas_preferred(decisions.implied_cublas_ms(1.0, -0.5, 1.0), 1.0)
    # the one cuBLAS time: the head's where it agrees with the call, the call's implied time where not
    head = np.array([0.5, 0.5, 3.0, 3.0])
    best, call = np.ones(4), np.log(np.array([0.8, 1.25, 0.8, 1.25]))
    got = decisions.cublas_time(head, best, call, np.zeros(4))
    np.testing.assert_allclose(got, [0.5, 1.25, 0.8, 3.0])
    assert decisions.cublas_preferred(got, best).tolist() == (call < 0).tolist()


def test_triton_dropped_and_kept_positions_on_synthetic_inputs() -> None:
    # synthetic times: drop Triton when cuBLAS x (1 + margin) < the best Triton time
    assert not decisions.triton_dropped(0.5, 1.0, None)           # None: never
    assert decisions.triton_dropped(0.99, 1.0, 0.0) and not decisions.triton_dropped(1.01, 1.0, 0.0)
    assert decisions.triton_dropped(1.04, 1.0, decisions.CUBLAS_MARGIN)      # -0.05: Triton must win by 5 %
    assert not decisions.triton_dropped(1.06, 1.0, decisions.CUBLAS_MARGIN)
    assert not decisions.triton_dropped(0.95, 1.0, 0.1)           # +0.1: cuBLAS must win by 10 %
    assert decisions.kept_positions([(3, 0.1), (0, math.inf), (1, 0.2)]) == [3, 1]
    assert decisions.kept_positions([(2, math.inf), (0, math.inf)]) == [2, 0]   # none runnable: all


def test_pad_rules_on_synthetic_inputs() -> None:
    # synthetic times: pad when padded * threshold < orig; never an aligned problem
    assert decisions.pad_decision(1.0, 0.8, 1.1, True) == PadDecision(True, 1.0, 0.8)
    assert decisions.pad_decision(1.0, 0.95, 1.1, True) == PadDecision(False, 1.0, 0.95)
    assert decisions.pad_decision(1.0, 0.1, 1.1, False) == PadDecision(False, 1.0, 1.0)
    # the copies, each operand read and written padded: fp16 A 3 x 5 -> 8 x 8, B 5 x 8 -> 8 x 8, at 1 GB/s
    # (1e6 bytes per ms)
    pp = PadProblem(m=3, k=5, n=8, dtype="float16")
    assert pp.padded_dims() == (8, 8, 8)
    assert decisions.pad_copy_floor_ms(pp, 1.0) == pytest.approx((15 + 64 + 40 + 64) * 2 / 1e6)
    assert decisions.pad_copy_floor_ms(PadProblem(m=3, k=5, n=8, prepadded_left=True), 1.0) == pytest.approx(
        (40 + 64) * 2 / 1e6)
    assert decisions.pad_copy_floor_ms(PadProblem(m=3, k=5, n=8, prepadded_left=True, prepadded_right=True), 1.0) == 0


class _Stub:
    """A synthetic predictor: fixed pad decision, best Triton time and cuBLAS time (no model)."""

    has_cublas = True

    def __init__(self, pad: PadDecision, triton_ms: float, cublas_ms: float) -> None:
        self._pad, self.triton_ms, self.cublas_ms = pad, triton_ms, cublas_ms
        self.spec = type("Spec", (), {"dram_bw_gbs": 1e12})()     # copies ~free

    def pad(self, pp):
        return self._pad

    def rank(self, prob, configs=None, top_k=1):
        return [(None, self.triton_ms)]

    def predict_cublas(self, prob):
        return self.cublas_ms


def test_hook_pad_decision_on_synthetic_inputs() -> None:
    pp = PadProblem(m=1024, k=768, n=50257, dtype="float16", transpose_right=True)
    pad = PadDecision(True, 0.45, 0.273)
    # Triton not in play: the pad head's decision as it is
    assert decisions.hook_pad_decision(_Stub(pad, 0.01, 0.2), pp, False) is pad
    # in play: the padded path is min(pad head 0.273, cuBLAS 0.2 + copies ~0) = 0.2; Triton 0.17 x 1.1 < 0.2
    assert decisions.hook_pad_decision(_Stub(pad, 0.17, 0.2), pp, True) == PadDecision(False, 0.45, 0.273)
    assert decisions.hook_pad_decision(_Stub(pad, 0.19, 0.2), pp, True) is pad   # a lead under 10 %: pad
    no = PadDecision(False, 0.2, 0.3)
    assert decisions.hook_pad_decision(_Stub(no, 0.01, 0.2), pp, True) is no      # no pad: nothing to undo


def test_predictor_calls_the_decisions(engines, monkeypatch: pytest.MonkeyPatch) -> None:
    """Candidates.prefer_cublas and prefers_cublas_many are decisions.cublas_preferred on the times shown, and
    the cuBLAS time shown is decisions.cublas_time of the cuBLAS head's time, the whole space's best and the
    call head's output (the call head's call, as times); Predictor.pad is decisions.pad_decision."""
    seen = []
    real = decisions.cublas_preferred
    monkeypatch.setattr(decisions, "cublas_preferred", lambda *a: seen.append(a) or real(*a))
    p = engines[("onnx", "inductor")]
    c = p.candidates(PROBLEMS[1])
    (cub, best), = seen
    assert cub == c.cublas_ms == p.predict_cublas(PROBLEMS[1]) and best == c.best_ms
    assert not p.domain.outside("gemm", PROBLEMS[1])   # a problem of the shapes the call head was fitted on
    x = p._cublas_x([PROBLEMS[1]])
    call = p._call_scores(p._call_head, x)[0]
    head = p._cublas_ms(x)[0]
    assert c.cublas_ms == decisions.cublas_time(head, c.best_ms, call, p.roofline_ms([PROBLEMS[1]])[0])
    assert c.prefer_cublas == (call < 0) == (c.cublas_ms < c.best_ms)
    assert p.prefers_cublas_many(PROBLEMS[:2]).tolist()[1] == c.prefer_cublas
    monkeypatch.setattr(decisions, "pad_decision", lambda *a: ("decided", a))
    got = p.pad(PadProblem(m=4095, k=4097, n=1000, dtype="bfloat16"))
    assert got[0] == "decided" and got[1][2:] == (p.pad_threshold, True)


def test_onnx_tutorial_agrees_with_torch() -> None:
    """models/h200's tutorial head: the onnx backend (its traced ranking and predict graphs) serves what torch does,
    and the mode is not the autotune one."""
    pt = Predictor.load(H200, backend="torch", device="h200", kernel="tutorial")
    po = Predictor.load(H200, backend="onnx", device="h200", kernel="tutorial")
    assert po._run.ranks("tutorial", po.screen_keep, 5) and po._run.predicts("tutorial")
    np.testing.assert_allclose(po.predict_many(PROBLEMS[:4]), pt.predict_many(PROBLEMS[:4]), rtol=RTOL)
    flipped = 0
    for prob in PROBLEMS:
        rt, ro = pt.rank(prob, top_k=5, screened=True), po.rank(prob, top_k=5, screened=True)
        np.testing.assert_allclose([t for _, t in ro], [t for _, t in rt], rtol=RTOL, err_msg=str(prob))
        flipped += [c for c, _ in rt] != [c for c, _ in ro]
    assert flipped <= 1
    auto = pt.with_kernel("autotune")
    assert not np.array_equal(auto.predict_many(PROBLEMS[:4]), pt.predict_many(PROBLEMS[:4]))
