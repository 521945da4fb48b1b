"""The Predictor against the public contract (docs/design.md).

The model folders here are SYNTHETIC: random weights (tests._synthetic) in the real artifact format,
so these tests check the serving machinery -- validation, batching, backends, artifacts, threads --
not the quality of predictions.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import torch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfmodel.configs import fits
from perfmodel import GemmConfig, GemmProblem, PadDecision, PadProblem
from perfmodel.artifact import ArtifactError, sha256_file
from perfmodel.configs import pruned_space
from perfmodel.features import configs_tensor, problems_tensor
from perfmodel.serve import Candidates, Predictor
from tests._synthetic import write_synthetic_model

REPO = Path(__file__).resolve().parent.parent
PROB = GemmProblem(m=4096, n=4096, k=4096, dtype="float16")
CFGS = [GemmConfig(128, 128, 64, 8, 3, 4), GemmConfig(64, 64, 32, 8, 2, 4), GemmConfig(256, 128, 64, 8, 3, 8),
        GemmConfig(32, 32, 16, 8, 1, 2), GemmConfig(128, 256, 64, 8, 4, 8), GemmConfig(16, 16, 16, 8, 1, 2)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_model(tmp_path_factory.mktemp("synthetic") / "model", seed=0)


@pytest.fixture(scope="module")
def pt(model_dir: Path) -> Predictor:
    return Predictor.load(model_dir, backend="torch")


@pytest.fixture(scope="module")
def ox(model_dir: Path) -> Predictor:
    return Predictor.load(model_dir, backend="onnx")


def _copy(model_dir: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "model"
    shutil.copytree(model_dir, dst)
    return dst


# ------------------------------------------------------------------------------------ bad inputs
@pytest.mark.parametrize("kwargs, exc, field", [
    (dict(m=0, n=64, k=64), ValueError, "m"),
    (dict(m=-4, n=64, k=64), ValueError, "m"),
    (dict(m=64, n=64, k=2.5), TypeError, "k"),
    (dict(m=64, n="64", k=64), TypeError, "n"),
    (dict(m=64, n=64, k=64, dtype="int8"), ValueError, "dtype"),
    (dict(m=float("nan"), n=64, k=64), ValueError, "m"),
    (dict(m=64, n=64, k=64, allow_tf32="False"), TypeError, "allow_tf32"),
])
def test_bad_problem_names_field(pt: Predictor, kwargs: dict, exc: type, field: str) -> None:
    with pytest.raises(exc, match=rf"^{field}\b"):
        pt.predict(GemmProblem(**kwargs), CFGS)


@pytest.mark.parametrize("kwargs, exc, field", [
    (dict(block_m=48, block_n=64, block_k=32), ValueError, "block_m"),
    (dict(block_m=64, block_n=96, block_k=32), ValueError, "block_n"),
    (dict(block_m=64, block_n=64, block_k=24), ValueError, "block_k"),
    (dict(block_m=64, block_n=64, block_k=32, num_warps=3), ValueError, "num_warps"),
    (dict(block_m=64, block_n=64, block_k=32, num_stages=0), ValueError, "num_stages"),
    (dict(block_m=float("nan"), block_n=64, block_k=32), ValueError, "block_m"),
])
def test_bad_config_names_field(pt: Predictor, kwargs: dict, exc: type, field: str) -> None:
    with pytest.raises(exc, match=rf"^{field}\b"):
        pt.predict(PROB, [GemmConfig(**kwargs)])


def test_dict_instead_of_config_or_problem(pt: Predictor) -> None:
    with pytest.raises(TypeError, match=r"configs\[1\]"):
        pt.predict(PROB, [CFGS[0], {"block_m": 64, "block_n": 64, "block_k": 32}])
    with pytest.raises(TypeError, match="configs"):
        pt.predict(PROB, CFGS[0])  # one config, not a list
    with pytest.raises(TypeError, match="prob"):
        pt.predict({"m": 64, "n": 64, "k": 64}, CFGS)
    with pytest.raises(TypeError, match=r"problems\[1\]"):
        pt.predict_many([PROB, (64, 64, 64)], CFGS)
    with pytest.raises(TypeError, match="pp"):
        pt.pad(PROB)


def test_empty_and_top_k(pt: Predictor) -> None:
    with pytest.raises(ValueError, match="configs"):
        pt.predict(PROB, [])
    with pytest.raises(ValueError, match="problems"):
        pt.predict_many([], CFGS)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="top_k"):
            pt.rank(PROB, CFGS, top_k=bad)
    with pytest.raises(TypeError, match="top_k"):
        pt.rank(PROB, CFGS, top_k=2.0)
    with pytest.raises(ValueError, match="margin"):
        pt.candidates(PROB, CFGS, margin=-0.1)
    with pytest.raises(ValueError, match="max_k"):
        pt.candidates(PROB, CFGS, top_k=3, max_k=2)
    with pytest.raises(ValueError, match="configs"):  # mixed dtypes have no common default space
        pt.predict_many([PROB, GemmProblem(m=64, n=64, k=64, dtype="float32")])


def test_load_errors(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Predictor.load(tmp_path / "nope")
    with pytest.raises(FileNotFoundError):
        Predictor.load(tmp_path)  # a folder without a model
    with pytest.raises(ValueError, match="backend"):
        Predictor.load(model_dir, backend="tensorrt")
    with pytest.raises(TypeError, match="path_or_uri"):
        Predictor.load(42)
    onnx_less = _copy(model_dir, tmp_path)
    (onnx_less / "model.onnx").unlink()
    assert Predictor.load(onnx_less).backend == "torch"
    with pytest.raises(FileNotFoundError, match="export-onnx"):
        Predictor.load(onnx_less, backend="onnx")


def test_default_model() -> None:
    """The shipped model (models/h100 of this checkout) is the default, and it loads and predicts."""
    from perfmodel.locations import default_model_dir

    assert default_model_dir() == REPO / "models" / "h100"
    p = Predictor.load()
    assert p.source == str(REPO / "models" / "h100")
    ms = p.predict(PROB)
    assert ms.shape == (len(p.default_configs(PROB.dtype)),) and np.all(np.isfinite(ms)) and np.all(ms > 0)
    d = p.pad(PadProblem(m=4095, k=4097, n=1000, dtype="bfloat16"))
    assert isinstance(d.should_pad, bool) and 0 < d.orig_ms < 10 and 0 < d.padded_ms < 10


def test_default_model_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import perfmodel.serve.loading as loading

    monkeypatch.setattr(loading, "default_model_dir", lambda device=None: tmp_path / "_models" / "h100")
    with pytest.raises(FileNotFoundError, match="_models/h100"):
        Predictor.load()


# ---------------------------------------------------------------------------------- corrupt artifacts
def _no_pickle(monkeypatch: pytest.MonkeyPatch) -> None:
    import pickle

    import torch

    def refuse(*a, **k):
        raise AssertionError("a model load must never unpickle")

    for mod, name in ((pickle, "load"), (pickle, "loads"), (torch, "load")):
        monkeypatch.setattr(mod, name, refuse)


def _edit_meta(folder: Path, edit) -> None:
    meta = json.loads((folder / "metadata.json").read_text())
    edit(meta)
    (folder / "metadata.json").write_text(json.dumps(meta))


def test_loading_never_unpickles(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_pickle(monkeypatch)
    for backend in ("torch", "onnx"):
        assert Predictor.load(model_dir, backend=backend).predict(PROB, CFGS).shape == (len(CFGS),)


@pytest.mark.parametrize("key, current", [("schema_version", "SCHEMA_VERSION"), ("encoder_version", "ENCODER_VERSION")])
def test_newer_artifact_says_upgrade(model_dir: Path, tmp_path: Path, key: str, current: str) -> None:
    """A model written by a newer perfmodel names the field, both numbers and both package versions."""
    from perfmodel import __version__, artifact

    want = getattr(artifact, current)
    folder = _copy(model_dir, tmp_path)
    _edit_meta(folder, lambda m: m.update({key: want + 1, "package_version": "9.9.0"}))
    with pytest.raises(ValueError) as exc:
        Predictor.load(folder)
    msg = str(exc.value)
    assert f"{key} {want + 1} is newer than this code's {key} {want}" in msg
    assert "perfmodel 9.9.0" in msg and f"this is perfmodel {__version__}" in msg and "upgrade perfmodel" in msg
    # an older one than this code reads says to retrain instead
    oldest = min(artifact.SUPPORTED_ENCODER_VERSIONS) if key == "encoder_version" else want
    need = f"one of {', '.join(map(str, artifact.SUPPORTED_ENCODER_VERSIONS))}" if key == "encoder_version" else want
    _edit_meta(folder, lambda m: m.update({key: oldest - 1}))
    with pytest.raises(ValueError, match=f"{key} is {oldest - 1}, this code needs {need}.*retrain"):
        Predictor.load(folder)


@pytest.mark.parametrize("damage, match", [
    ("garbage_weights", "checksum"),
    ("garbage_weights_unchecked", "unreadable weights"),
    ("bad_json", "not valid JSON"),
    ("not_our_format", "metadata"),
    ("feature_names", "features"),
    ("schema_version", "schema_version"),
    ("encoder_version", "encoder_version"),
    ("missing_tensor", "does not match"),
])
def test_corrupt_artifact(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str,
                          match: str) -> None:
    folder = _copy(model_dir, tmp_path)
    if damage.startswith("garbage_weights"):
        (folder / "model.safetensors").write_bytes(os.urandom(4096))
        if damage.endswith("unchecked"):  # its checksum recorded: the safetensors reader itself must refuse it
            _edit_meta(folder, lambda m: m.update(weights_sha256=sha256_file(folder / "model.safetensors")))
    elif damage == "bad_json":
        (folder / "metadata.json").write_text('{"format": "perfmodel-artifact", ')
    elif damage == "not_our_format":
        (folder / "metadata.json").write_text("[1, 2, 3]")
    elif damage == "feature_names":
        _edit_meta(folder, lambda m: m["heads"]["gemm"]["features"].reverse())
    elif damage == "schema_version":
        _edit_meta(folder, lambda m: m.update(schema_version=999))
    elif damage == "encoder_version":
        _edit_meta(folder, lambda m: m.update(encoder_version=0))
    elif damage == "missing_tensor":
        from safetensors.torch import load_file, save_file

        t = load_file(str(folder / "model.safetensors"))
        t.pop("gemm.net.0.weight")
        save_file(t, str(folder / "model.safetensors"))
        _edit_meta(folder, lambda m: m.update(weights_sha256=sha256_file(folder / "model.safetensors")))
    _no_pickle(monkeypatch)
    with pytest.raises(ArtifactError, match=match):
        Predictor.load(folder)
    assert issubclass(ArtifactError, ValueError)


def test_corrupt_or_stale_onnx(model_dir: Path, tmp_path: Path) -> None:
    folder = _copy(model_dir, tmp_path)
    (folder / "model.onnx").write_bytes(b"\x08\x07garbage" * 64)
    with pytest.raises(ArtifactError, match="ONNX"):
        Predictor.load(folder, backend="onnx")
    other = write_synthetic_model(tmp_path / "other", seed=1)
    shutil.copy(other / "model.onnx", folder / "model.onnx")  # another model's graph: a stale export
    with pytest.raises(ArtifactError, match="stale"):
        Predictor.load(folder, backend="onnx")


def test_predict_shapes_and_defaults(pt: Predictor) -> None:
    ms = pt.predict(PROB, CFGS)
    assert ms.shape == (len(CFGS),) and ms.dtype == np.float64
    assert np.all(np.isfinite(ms)) and np.all(ms > 0)
    space = pruned_space("float16", pt.spec)
    assert pt.predict(PROB).shape == (len(space),)
    assert pt.default_configs("float32") == tuple(pruned_space("float32", pt.spec))
    assert len(pt.predict(GemmProblem(m=64, n=64, k=64, dtype="float32"))) == len(pruned_space("float32", pt.spec))


def test_torch_and_onnx_agree(pt: Predictor, ox: Predictor) -> None:
    probs = [PROB, GemmProblem(m=1, n=1, k=1, dtype="bfloat16"),
             GemmProblem(m=4095, n=17, k=300, dtype="float32", allow_tf32=True, transpose_left=True)]
    for prob in probs:
        np.testing.assert_allclose(ox.predict(prob), pt.predict(prob), rtol=1e-3)
        assert math.isclose(ox.predict_cublas(prob), pt.predict_cublas(prob), rel_tol=1e-3)
    pp = PadProblem(m=4095, k=4097, n=1000, dtype="bfloat16")
    a, b = pt.pad(pp), ox.pad(pp)
    assert math.isclose(a.orig_ms, b.orig_ms, rel_tol=1e-3) and math.isclose(a.padded_ms, b.padded_ms, rel_tol=1e-3)


def test_predict_many_equals_stacked_predict(pt: Predictor, ox: Predictor) -> None:
    probs = [PROB, GemmProblem(m=128, n=1000, k=4096), GemmProblem(m=7, n=9, k=11), GemmProblem(m=1, n=8192, k=8192)]
    for p in (pt, ox):
        many = p.predict_many(probs, CFGS)
        assert many.shape == (len(probs), len(CFGS))
        # other batch shapes: the float32 matmuls may sum in another order (~1e-6 relative, tests/_tolerance.py)
        np.testing.assert_allclose(many, np.stack([p.predict(q, CFGS) for q in probs]), rtol=1e-5)
        assert p.predict_many(probs).shape == (len(probs), len(p.default_configs("float16")))


def test_rank(pt: Predictor) -> None:
    best = pt.rank(PROB, CFGS, top_k=4)
    assert len(best) == 4 and all(isinstance(c, GemmConfig) and isinstance(ms, float) for c, ms in best)
    times = [ms for _, ms in best]
    assert times == sorted(times)
    ms = pt.predict(PROB, CFGS)
    assert times[0] == pytest.approx(ms.min()) and best[0][0] == CFGS[int(np.argmin(ms))]
    assert len(pt.rank(PROB, CFGS, top_k=100)) == len(CFGS)
    full = pt.rank(PROB, top_k=5)  # default: the pruned space
    assert [c for c, _ in full] == [c for c, _ in pt.rank(PROB, pt.default_configs("float16"), top_k=5)]


def test_candidates_and_cublas(pt: Predictor) -> None:
    c = pt.candidates(PROB, top_k=3, margin=0.0, max_k=3)
    assert isinstance(c, Candidates) and len(c.configs) == 3
    assert list(c.configs) == [cfg for cfg, _ in pt.rank(PROB, top_k=3)]
    wide = pt.candidates(PROB, top_k=3, margin=10.0, max_k=7)
    assert len(wide.configs) == 7 and list(wide.predicted_ms) == sorted(wide.predicted_ms)
    mid = pt.candidates(PROB, top_k=3, margin=0.01, max_k=50)
    bound = mid.predicted_ms[2] * 1.01
    assert all(ms <= bound for ms in mid.predicted_ms)
    ms = np.sort(pt.predict(PROB))
    assert len(mid.configs) == min(50, int(np.sum(ms <= bound)))
    cub = pt.predict_cublas(PROB)
    assert cub > 0 and math.isfinite(cub) and c.cublas_ms == pytest.approx(cub)
    assert c.prefer_cublas == (cub < c.best_ms)


def test_pad(pt: Predictor) -> None:
    d = pt.pad(PadProblem(m=4095, k=4097, n=1000, dtype="bfloat16"))
    assert isinstance(d, PadDecision) and d.orig_ms > 0 and d.padded_ms > 0
    assert d.should_pad == (d.padded_ms * pt.pad_threshold < d.orig_ms)
    aligned = pt.pad(PadProblem(m=4096, k=4096, n=1024, dtype="float16", transpose_left=True))
    assert aligned.should_pad is False and aligned.padded_ms == aligned.orig_ms
    assert pt.pad(PadProblem(m=1, k=4096, n=1, dtype="float32")).should_pad is False  # size-1 dims are never padded


MAX = 2**31 - 1


def test_huge_valid_problem(pt: Predictor, ox: Predictor) -> None:
    big = GemmProblem(m=MAX, n=MAX, k=MAX, dtype="float32", allow_tf32=True)
    large = GemmProblem(m=2**18, n=2**18, k=2**18, dtype="float16")
    for p in (pt, ox):
        ms = p.predict(large)
        assert np.all(np.isfinite(ms)) and np.all(ms > 0)
        assert math.isfinite(p.predict_cublas(big)) and p.predict_cublas(big) > 0
        d = p.pad(PadProblem(m=MAX, k=MAX - 2, n=MAX - 4, dtype="float16"))
        assert math.isfinite(d.orig_ms) and math.isfinite(d.padded_ms)


def test_huge_valid_problem_max_dims(pt: Predictor) -> None:
    ms = pt.predict(GemmProblem(m=MAX, n=MAX, k=MAX, dtype="float32", allow_tf32=True))
    assert np.all(np.isfinite(ms)) and np.all(ms > 0)


def test_models_without_optional_heads(tmp_path: Path) -> None:
    folder = write_synthetic_model(tmp_path / "m", seed=2, onnx=False, with_pad=False, with_cublas=False)
    p = Predictor.load(folder)
    assert p.rank(PROB, CFGS, top_k=1)
    with pytest.raises(RuntimeError, match="pad head"):
        p.pad(PadProblem(m=100, k=100, n=100))
    with pytest.raises(RuntimeError, match="cuBLAS head"):
        p.predict_cublas(PROB)
    c = p.candidates(PROB, CFGS)
    assert c.cublas_ms is None and c.prefer_cublas is False


# -------------------------------------------------------------------------------- property tests
DIM = st.integers(min_value=1, max_value=2**31 - 1)
POW2 = st.sampled_from([16, 32, 64, 128, 256])
problems = st.builds(GemmProblem, m=DIM, n=DIM, k=DIM, dtype=st.sampled_from(["float16", "bfloat16", "float32"]),
                     allow_tf32=st.booleans(), transpose_left=st.booleans(), transpose_right=st.booleans())
configs = st.builds(GemmConfig, block_m=POW2, block_n=POW2, block_k=POW2, group_m=st.sampled_from([1, 2, 4, 8, 16]),
                    num_stages=st.integers(1, 5), num_warps=st.sampled_from([2, 4, 8]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prob=problems, cfgs=st.lists(configs, min_size=1, max_size=8))
def test_property_valid_inputs_predict(pt: Predictor, prob: GemmProblem, cfgs: list[GemmConfig]) -> None:
    ms = pt.predict(prob, cfgs)
    ok = np.array([fits(c, prob.dtype, pt.spec, prob) for c in cfgs])
    # a config the device can run: a finite positive time; one it cannot: inf (docs/design.md)
    assert ms.shape == (len(cfgs),) and np.all(np.isfinite(ms[ok])) and np.all(ms[ok] > 0)
    assert np.all(np.isinf(ms[~ok]))
    ranked = pt.rank(prob, cfgs, top_k=3)
    times = [t for _, t in ranked]
    assert times == sorted(times)
    assert [math.isinf(t) for _, t in ranked] == sorted(math.isinf(t) for _, t in ranked)  # runnable first


@settings(max_examples=60, deadline=None)
@given(field=st.sampled_from(["m", "n", "k"]),
       bad=st.one_of(st.integers(max_value=0), st.integers(min_value=2**31), st.floats(allow_nan=True),
                     st.text(max_size=4), st.none(), st.booleans()))
def test_property_invalid_dims_rejected(field: str, bad: object) -> None:
    kwargs = {"m": 64, "n": 64, "k": 64, field: bad}
    with pytest.raises((ValueError, TypeError), match=rf"^{field}\b"):
        GemmProblem(**kwargs)


@settings(max_examples=60, deadline=None)
@given(field=st.sampled_from(["block_m", "block_n", "block_k"]),
       bad=st.integers(min_value=-1024, max_value=1024).filter(lambda v: v not in (16, 32, 64, 128, 256)))
def test_property_invalid_blocks_rejected(field: str, bad: int) -> None:
    kwargs = {"block_m": 64, "block_n": 64, "block_k": 32, field: bad}
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        GemmConfig(**kwargs)


# ---------------------------------------------------------------------------------- threads
@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_concurrent_predict_matches_serial(pt: Predictor, ox: Predictor, backend: str) -> None:
    p = pt if backend == "torch" else ox
    probs = [GemmProblem(m=64 * (i + 1), n=4096 - 100 * i, k=129 + 7 * i, dtype="float16") for i in range(8)]
    serial = [p.predict(q) for q in probs]
    # the screened rank path (default space: 1,431 configs) and explicit config lists (cached per set)
    lists = [list(p.default_configs("float16")[i::3]) for i in range(3)]
    serial_rank = [[c for c, _ in p.rank(q, top_k=4)] for q in probs]
    serial_lists = [[[c for c, _ in p.rank(q, cfgs, top_k=3)] for cfgs in lists] for q in probs]
    ranked: dict[tuple[int, int], tuple] = {}
    results: dict[tuple[int, int], np.ndarray] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def work(i: int) -> None:
        try:
            start.wait()
            for rep in range(4):
                j = (i + rep) % len(probs)
                results[(i, rep)] = p.predict(probs[j])
                ranked[(i, rep)] = ([c for c, _ in p.rank(probs[j], top_k=4)],
                                    [[c for c, _ in p.rank(probs[j], cfgs, top_k=3)] for cfgs in lists])
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for (i, rep), got in results.items():
        np.testing.assert_allclose(got, serial[(i + rep) % len(probs)], rtol=1e-6)
        j = (i + rep) % len(probs)
        assert ranked[(i, rep)] == (serial_rank[j], serial_lists[j])
    assert len(results) == 32 and len(ranked) == 32


# ---------------------------------------------------------------------------------- import hygiene
BLOCKER = """
import sys
BLOCKED = ("lightning", "pytorch_lightning", "mlflow", "pandas")
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked for this test: {name}")
        return None
sys.meta_path.insert(0, Block())
"""


def test_serve_imports_without_training_stack(model_dir: Path) -> None:
    code = BLOCKER + f"""
import perfmodel.serve
from perfmodel.serve import Predictor
import perfmodel.serve.commands, perfmodel.serve.triton_hook, perfmodel.serve.inductor
from perfmodel import GemmProblem, PadProblem
p = Predictor.load({str(model_dir)!r})
assert p.rank(GemmProblem(m=512, n=512, k=512), top_k=2)
p.pad(PadProblem(m=511, k=513, n=100))
q = Predictor.load({str(model_dir)!r}, backend="onnx")
assert q.rank(GemmProblem(m=512, n=512, k=512), top_k=2)
leaked = [m for m in sys.modules if m.split(".")[0] in BLOCKED]
assert not leaked, leaked
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")


def test_import_does_not_touch_torch_threads() -> None:
    code = ("import torch; torch.set_num_threads(3); "
            "import perfmodel.serve, perfmodel.serve.triton_hook, perfmodel.serve.inductor; "
            "print(torch.get_num_threads())")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "3"


def test_torch_fast_path_matches_the_module(pt: Predictor) -> None:
    """The addmm + in-place ReLU chain the torch backend runs gives the folded module's output exactly."""
    from perfmodel.features import configs_tensor, problems_tensor

    runner = pt._run
    # synthetic heads are BatchNorm MLPs: every one folds into an addmm chain (PerfMLP.prepare_serving)
    assert all(m.__dict__.get("_addmm_chain") is not None for m in runner.modules.values())
    cfgs = pt.default_configs("float16")[:64]
    x = pt.bundle.encoders["gemm"].encode_cross(
        problems_tensor([GemmProblem(m=100, n=200, k=300, dtype="float16"),
                         GemmProblem(m=4096, n=1, k=8192, dtype="float16")]),
        configs_tensor(cfgs))
    with torch.inference_mode():
        ref = runner.modules["gemm"](x).numpy()
    assert np.array_equal(runner("gemm", x), ref.astype(np.float64))


def test_torch_fast_path_skips_other_heads() -> None:
    from perfmodel.model import MLPConfig, PerfMLP
    from perfmodel.model import _linear_relu_chain

    assert _linear_relu_chain(PerfMLP(MLPConfig(5, (8, 8), "batch")).folded()) is not None
    assert _linear_relu_chain(PerfMLP(MLPConfig(5, (8, 8), "layer")).folded()) is None  # LayerNorm stays
    unfolded = PerfMLP(MLPConfig(5, (8,), "none"))
    unfolded.set_normalisation(torch.ones(5), torch.full((5,), 2.0))
    assert _linear_relu_chain(unfolded) is None  # standardisation not folded into the first Linear


# -------------------------------------------------------------------------------- screened ranking
def test_screen_identical_to_gemm_gives_the_full_ranking(pt: Predictor, ox: Predictor) -> None:
    """The fixture's screen head is a copy of its gemm head, so screening (1,431 configs > 2 x 48)
    must not change the ranking: rank == the full predict()'s order, and its times."""
    assert pt.has_screen and len(pt.default_configs("float16")) > 2 * pt.screen_keep
    for p in (pt, ox):
        for prob in (PROB, GemmProblem(m=37, n=5000, k=129, dtype="bfloat16"),
                     GemmProblem(m=1000, n=64, k=4096, dtype="float32", allow_tf32=True)):
            full = p.predict(prob)
            order = np.argsort(full, kind="stable")[:7]
            ranked = p.rank(prob, top_k=7)
            assert [c for c, _ in ranked] == [p.default_configs(prob.dtype)[i] for i in order]
            np.testing.assert_allclose([t for _, t in ranked], full[order], rtol=1e-5)


def test_random_screen_keeps_the_gemm_best_of_what_it_kept(tmp_path: Path) -> None:
    """With an unrelated (random) screen, rank(screened=True) -- the fast path -- returns the gemm head's best
    among the screen's best screen_keep configs, and rank the gemm head's best of all: checked against the
    heads called directly."""
    folder = write_synthetic_model(tmp_path / "m", seed=4, onnx=False, screen="random")
    p = Predictor.load(folder)
    cfgs = p.default_configs("float16")
    with torch.inference_mode():
        x = p.bundle.encoders["gemm"].encode_cross(problems_tensor([PROB]), configs_tensor(cfgs))
        screen = p.bundle.heads["student"](x).numpy()
        gemm = p.bundle.heads["gemm"](x).double().numpy()
    kept = np.sort(np.argsort(screen, kind="stable")[:p.screen_keep])
    want = kept[np.argsort(gemm[kept], kind="stable")[:5]]
    ranked = p.rank(PROB, top_k=5, screened=True)
    assert [c for c, _ in ranked] == [cfgs[i] for i in want]
    np.testing.assert_allclose([t for _, t in ranked], np.exp(gemm[want]), rtol=1e-5)
    # a top_k beyond screen_keep widens what the gemm head scores instead of truncating
    assert len(p.rank(PROB, top_k=p.screen_keep + 10, screened=True)) == p.screen_keep + 10
    best = np.argsort(gemm, kind="stable")[:5]                      # the default: every config scored
    assert [c for c, _ in p.rank(PROB, top_k=5)] == [cfgs[i] for i in best]
    assert set(best) - set(kept), "the random screen dropped none of the gemm head's best: the check is vacuous"


@pytest.mark.parametrize("average", ["before_floor", "after_floor"])
def test_ensemble_gemm_head_serves_on_both_backends(tmp_path: Path, average: str) -> None:
    """A gemm head averaged from 3 members runs as GroupedNet in the torch backend and the ONNX graph:
    both give the bundle's own (block-diagonal) predictions, and the screened ranking the full one."""
    folder = write_synthetic_model(tmp_path / "m", seed=6, hidden=(32, 32, 32), members=3, average=average)
    preds = [Predictor.load(folder), Predictor.load(folder, backend="onnx")]
    cfgs = preds[0].default_configs("float16")
    with torch.inference_mode():
        x = preds[0].bundle.encoders["gemm"].encode_cross(problems_tensor([PROB]), configs_tensor(cfgs))
        want = np.exp(preds[0].bundle.heads["gemm"](x).double().numpy())
    assert preds[0].bundle.heads["gemm"].cfg.members == 3 and preds[0].bundle.heads["gemm"].cfg.average == average
    for p in preds:
        np.testing.assert_allclose(p.predict(PROB), want, rtol=1e-4)
        order = np.argsort(want, kind="stable")[:5]
        assert [c for c, _ in p.rank(PROB, top_k=5)] == [cfgs[i] for i in order]


def test_rank_many_matches_rank(pt: Predictor, ox: Predictor) -> None:
    probs = [PROB, GemmProblem(m=37, n=5000, k=129, dtype="float16"), GemmProblem(m=8, n=8, k=8, dtype="float16")]
    for p in (pt, ox):
        for configs in (None, CFGS):
            many = p.rank_many(probs, configs, top_k=4)
            one = [p.rank(q, configs, top_k=4) for q in probs]
            assert [[c for c, _ in r] for r in many] == [[c for c, _ in r] for r in one]
            # batched matmuls may round differently from one problem's
            np.testing.assert_allclose([[t for _, t in r] for r in many], [[t for _, t in r] for r in one], rtol=1e-5)
    with pytest.raises(ValueError, match="configs"):
        pt.rank_many([PROB, GemmProblem(m=8, n=8, k=8, dtype="float32")], top_k=2)
    with pytest.raises(TypeError, match="top_k"):
        pt.rank_many([PROB], CFGS, top_k=1.5)


def test_torch_score_and_floor_match_the_head(pt: Predictor) -> None:
    """Ranking orders rows by the head's score (before the floors) and floors them (PerfMLP.floor): the
    torch backend's fast nets must agree with the head's own output."""
    with torch.inference_mode():
        x = pt.bundle.encoders["gemm"].encode_cross(problems_tensor([PROB, GemmProblem(m=1, n=1, k=1)]),
                                                    configs_tensor(pt.default_configs("float16")))
    for head in pt.bundle.heads:
        if head == "gemm":
            z, log_ms = pt._run.score_log_ms(head, x)
            np.testing.assert_allclose(log_ms.numpy(), pt._run(head, x), rtol=1e-6, atol=1e-7)
            with torch.inference_mode():
                want = pt.bundle.heads[head](x).numpy()
            np.testing.assert_allclose(log_ms.numpy(), want, rtol=1e-5, atol=1e-5)
            assert np.all(log_ms.numpy() >= float(pt.bundle.heads[head].log_overhead.min()) - 1e-6)
        elif head == "screen":
            with torch.inference_mode():
                want = pt.bundle.heads[head].score(x).numpy()
            np.testing.assert_allclose(pt._run.score(head, x).numpy(), want, rtol=1e-4, atol=1e-4)


def test_config_cache_serves_each_set_its_own(pt: Predictor) -> None:
    a, b = CFGS, list(reversed(CFGS))
    first = pt.predict(PROB, a)
    np.testing.assert_allclose(pt.predict(PROB, b), first[::-1], rtol=1e-5)  # rows in another order: ~1e-6 rounding
    np.testing.assert_array_equal(pt.predict(PROB, a), first)
    for i in range(40):  # more sets than the cache holds
        pt.predict(PROB, CFGS[: 1 + i % len(CFGS)] + [GemmConfig(16, 16, 16, 1 + 0 * i, 1 + i % 5, 2)])
    np.testing.assert_array_equal(pt.predict(PROB, a), first)


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_unrunnable_configs_predict_inf_and_rank_last(model_dir, backend) -> None:
    # GemmConfig(256, 256, 128, 8, 5, 8) needs 655 KB of fp16 shared memory: no GPU runs it
    p = Predictor.load(model_dir, backend=backend)
    prob = GemmProblem(m=512, n=512, k=512, dtype="float16")
    big, a, b = GemmConfig(256, 256, 128, 8, 5, 8), GemmConfig(128, 128, 64, 8, 3, 4), GemmConfig(64, 64, 32, 8, 4, 4)
    ms = p.predict(prob, [big, a, b])
    assert math.isinf(ms[0]) and np.isfinite(ms[1:]).all()
    ranked = p.rank(prob, [big, a, b], top_k=3)
    assert [c for c, _ in ranked][2] == big and math.isinf(ranked[2][1]) and np.isfinite([t for _, t in ranked[:2]]).all()
    assert big not in [c for c, _ in p.rank(prob, [big, a, b], top_k=2)]
    many = p.predict_many([prob, GemmProblem(m=64, n=64, k=64, dtype="float32")], [big, a])
    assert np.isinf(many[:, 0]).all() and np.isfinite(many[:, 1]).all()
    assert [c for c, _ in p.rank_many([prob], [big, a], top_k=1)[0]] == [a]


def test_default_backend_is_the_fastest_available(model_dir: Path, tmp_path: Path, monkeypatch) -> None:
    # onnx when onnxruntime imports and the folder has model.onnx; torch otherwise; backend= still forces
    import shutil

    from perfmodel.serve import loading

    assert Predictor.load(model_dir).backend == "onnx"
    assert Predictor.load(model_dir, backend="torch").backend == "torch"
    no_onnx = tmp_path / "m"
    shutil.copytree(model_dir, no_onnx)
    (no_onnx / "model.onnx").unlink()
    assert Predictor.load(no_onnx).backend == "torch"
    monkeypatch.setattr(loading, "_onnxruntime_available", lambda: False)
    assert Predictor.load(model_dir).backend == "torch"
    with pytest.raises(ValueError, match="backend"):
        Predictor.load(model_dir, backend="tensorrt")


def test_candidates_never_offer_a_config_the_device_cannot_run(pt: Predictor) -> None:
    prob = GemmProblem(m=512, n=512, k=512, dtype="float16")
    big, a, b = GemmConfig(256, 256, 128, 8, 5, 8), GemmConfig(128, 128, 64, 8, 3, 4), GemmConfig(64, 64, 32, 8, 4, 4)
    c = pt.candidates(prob, [big, a, b], top_k=3)
    assert big not in c.configs and set(c.configs) == {a, b} and np.isfinite(c.predicted_ms).all()


def test_onnx_runner_gives_onnxruntime_no_empty_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    # onnxruntime on an H100 host died of SIGFPE when a head was fed a zero-row batch (the heads shared
    # one session, so every call fed the other heads empty inputs). Each head has its own session now,
    # and a call with no rows returns empty outputs without running onnxruntime at all.
    from perfmodel.serve.loading import load_model

    bundle, backend, runner, _ = load_model(None, "onnx")
    assert backend == "onnx"
    assert set(runner.head_sessions) == set(bundle.heads)
    fed = []
    for name, sess in runner.head_sessions.items():
        real = sess.run

        class Spy:
            def __init__(self, sess, real):
                self._sess, self._real = sess, real

            def run(self, names, feeds):
                fed.extend(v.shape[0] for v in feeds.values())
                return self._real(names, feeds)

            def __getattr__(self, attr):
                return getattr(self._sess, attr)

        runner.head_sessions[name] = Spy(sess, real)
    for name, head in bundle.heads.items():
        width = head.cfg.n_inputs
        assert runner(name, torch.zeros(0, width)).shape[0] == 0
        z, log_ms = runner.score_log_ms(name, torch.zeros(0, width))
        assert z.shape[0] == log_ms.shape[0] == 0
        out = runner(name, torch.randn(5, width))
        assert out.shape[0] == 5 and np.isfinite(out).all()
    assert fed and min(fed) > 0  # every batch onnxruntime saw had rows


def test_onnx_staged_graphs_and_non_finite_rank(ox: Predictor, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranking and predict graphs run in a config stage (once per config set, kept on its part) and
    a problem stage: the problem stage has no config input left, and rank of one problem still refuses a
    non-finite prediction."""
    run = ox._run
    for staged in (run.rank_session, run.predict_session):
        assert staged.computed and staged.config_session is not None
        assert not {"rank_configs", "rank_config_part"} & {i.name for i in staged.sessions.small.get_inputs()}
    cfgs = ox.default_configs("float16")
    assert [c for c, _ in ox.rank(PROB, top_k=5, screened=True)] == \
        [c for c, _ in ox.rank_many([PROB], cfgs, top_k=5, screened=True)[0]]
    real = run.rank

    def nan_rank(problems: np.ndarray, part, kernel) -> tuple[np.ndarray, np.ndarray]:
        kept, log_ms = real(problems, part, kernel)
        return kept, np.where(np.arange(log_ms.shape[1]) == 3, np.nan, log_ms).astype(np.float32)

    monkeypatch.setattr(run, "rank", nan_rank)
    with pytest.raises(RuntimeError, match="non-finite"):
        ox.rank(PROB, top_k=1, screened=True)
