"""The physical floor (docs/design.md, "The model"): no head predicts a time below its problem's
roofline at the device's max clock, computed here independently from the device spec."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from perfmodel import GemmProblem, PadProblem, Predictor
from perfmodel.features import problems_tensor
from perfmodel.schema import DTYPE_BYTES, MAX_DIM

DIMS = (1, 3, 1023, 65537, 2 ** 20 + 1, MAX_DIM)
MODES = (("float16", False), ("bfloat16", False), ("float32", False), ("float32", True))
# the floor is a float32 feature column: its exp may sit a float32 rounding below the float64 roofline
RTOL = 1e-5


def roofline_ms(spec, m: int, n: int, k: int, dtype: str, tf32: bool) -> float:
    nbytes = (m * k + k * n + m * n) * DTYPE_BYTES[dtype]
    return 1e3 * max(2.0 * m * n * k / spec.peak_flops(dtype, tf32), nbytes / spec.peak_bytes_per_s())


def up(d: int, dtype: str) -> int:
    a = 8 if DTYPE_BYTES[dtype] == 2 else 4
    return d if d == 1 else -(-d // a) * a


@pytest.mark.slow
@pytest.mark.parametrize("backend,kernel", [("torch", "autotune"), ("onnx", "autotune"), ("torch", "inductor"),
                                            ("onnx", "inductor")])
def test_no_prediction_below_the_physical_floor(backend: str, kernel: str) -> None:
    p = Predictor.load(backend=backend, kernel=kernel)
    spec = p.spec
    for dtype, tf32 in MODES:
        probs = [GemmProblem(m=m, n=n, k=k, dtype=dtype, allow_tf32=tf32) for m, n, k in itertools.product(DIMS, repeat=3)]
        floor = np.array([roofline_ms(spec, q.m, q.n, q.k, dtype, tf32) for q in probs])
        configs = p.default_configs(dtype)[::25]
        ms = p.predict_many(probs, configs)                                       # gemm head
        assert np.all(np.isfinite(ms)) and np.all(ms > 0)
        assert np.all(ms >= floor[:, None] * (1 - RTOL)), dtype
        for q, f in zip(probs[::7], floor[::7]):                                  # the rank path (screen + gemm)
            best = p.rank(q, top_k=3)
            assert all(np.isfinite(t) and t >= f * (1 - RTOL) for _, t in best)
        cb = p.predict_cublas_many(probs)
        assert np.all(np.isfinite(cb)) and np.all(cb >= floor * (1 - RTOL))
        screen = p.bundle.screen_name                                             # the screening head itself
        with torch.inference_mode():
            x = p.bundle.encoders[screen].encode_cross(problems_tensor(probs[::5]),
                                                       torch.tensor([[64.0, 64, 32, 8, 3, 4]], dtype=torch.float64))
        sc = np.exp(p._run(screen, x))
        assert np.all(np.isfinite(sc)) and np.all(sc >= floor[::5] * (1 - RTOL))
        for q, f in zip(probs, floor):
            d = p.pad(PadProblem(m=q.m, k=q.k, n=q.n, dtype=dtype, allow_tf32=tf32))
            padded = roofline_ms(spec, up(q.m, dtype), up(q.n, dtype), up(q.k, dtype), dtype, tf32)
            assert np.isfinite(d.orig_ms) and d.orig_ms >= f * (1 - RTOL), q
            assert np.isfinite(d.padded_ms) and d.padded_ms >= min(f, padded) * (1 - RTOL), q
            if PadProblem(m=q.m, k=q.k, n=q.n, dtype=dtype).needs_padding():
                assert d.padded_ms >= padded * (1 - RTOL), q


def test_floor_is_exact_above_it() -> None:
    """max(prediction, floor): a prediction above the floor comes out bit for bit."""
    from perfmodel.model import MLPConfig, PerfMLP

    head = PerfMLP(MLPConfig(3, (8,), "none", floor_features=(2,))).eval()
    x = torch.tensor([[0.1, 0.2, -50.0], [0.1, 0.2, 50.0]])
    with torch.inference_mode():
        out = head(x)
        assert out[0] == head.floor(head.score(x), x)[0] and out[0] > -50 and out[1] == 50.0
