"""Predictor.load(device=...): a named device, the live-device path (GPU properties mocked here: this
machine has no GPU, said so) and the warning for a GPU the model was not trained for."""
from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from perfmodel import GemmProblem, PadProblem, Predictor
from perfmodel.serve import loading


def test_named_device():
    from perfmodel.locations import default_model_dir

    p = Predictor.load(device="h100-sxm")
    assert p.device == "h100-sxm" == p.spec.name and p.source == str(default_model_dir())
    # the H200's shipped model is its own folder (models/h200, trained on both devices)
    p = Predictor.load(device="h200")
    assert p.device == "h200" == p.spec.name and p.source == str(default_model_dir("h200"))
    assert default_model_dir("h200").name == "h200" and default_model_dir("a100-sxm") == default_model_dir()
    with pytest.raises(ValueError, match="^device: .*h100-sxm.*'h200'"):
        Predictor.load(default_model_dir(), device="h200")  # the H100's model knows one device
    with pytest.raises(TypeError, match="^device"):
        Predictor.load(device=3)


def test_no_gpu_uses_the_default_device_quietly(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Predictor.load().device == "h100-sxm"


def _mock_gpu(monkeypatch, name: str, sms: int) -> None:
    # mocked CUDA device properties (no GPU here)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: SimpleNamespace(multi_processor_count=sms))


def test_live_device_the_model_knows(monkeypatch):
    _mock_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", 132)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = Predictor.load()
    assert p.device == "h100-sxm"
    assert p.rank(GemmProblem(m=256, n=256, k=256), top_k=1)


def test_live_h200_loads_its_shipped_model(monkeypatch):
    from perfmodel.locations import default_model_dir

    _mock_gpu(monkeypatch, "NVIDIA H200", 132)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = Predictor.load()
    assert p.device == "h200" and p.source == str(default_model_dir("h200"))
    with pytest.warns(RuntimeWarning, match="not a device this model was trained for; predicting for h100-sxm"):
        assert Predictor.load(default_model_dir()).device == "h100-sxm"  # the H100's model, named


@pytest.mark.parametrize("name,sms", [("NVIDIA A100-SXM4-80GB", 108), ("Some GPU", 20)])
def test_live_device_the_model_does_not_know_warns_once(monkeypatch, name, sms):
    _mock_gpu(monkeypatch, name, sms)
    with pytest.warns(RuntimeWarning, match="not a device this model was trained for; predicting for h100-sxm") as rec:
        p = Predictor.load()
    assert p.device == "h100-sxm" and len(rec) == 1
    assert loading.live_device_spec() != "h100-sxm"


def test_inductor_hook_says_once_when_the_gpu_is_not_the_models(monkeypatch):
    pytest.importorskip("triton")
    from perfmodel.serve import inductor as si, notices

    p = Predictor.load(device="h100-sxm")
    monkeypatch.setattr(notices, "_warned", set())
    _mock_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", 132)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        si._check_device(p)  # the model's own GPU: quiet
    _mock_gpu(monkeypatch, "NVIDIA H200", 132)
    with pytest.warns(RuntimeWarning, match="trained for h100-sxm, this GPU is 'h200'"):
        si._check_device(p)


# ---- a model of two devices (random weights: tests._synthetic, its predictions mean nothing)

@pytest.fixture(scope="module")
def joint_dir(tmp_path_factory):
    from tests._synthetic import write_synthetic_model

    return write_synthetic_model(tmp_path_factory.mktemp("joint") / "m", devices=("h100-sxm", "h200"))


def test_joint_folder_has_one_onnx_file_per_device(joint_dir):
    from perfmodel import artifact, onnx_export

    assert (joint_dir / "model.onnx").is_file() and (joint_dir / "model.h200.onnx").is_file()
    b = artifact.load(joint_dir)
    assert b.devices == ("h100-sxm", "h200") and b.spec.name == "h100-sxm"
    assert {n: s.dram_bw_gbs for n, s in b.device_specs.items()} == {"h100-sxm": 3350.0, "h200": 4800.0}
    h200 = b.for_device("h200")
    assert h200.spec.name == "h200" and h200.heads is b.heads
    assert all(e.spec.name == "h200" and e.version == b.encoders[k].version for k, e in h200.encoders.items())
    with pytest.raises(ValueError, match="^device: .*'a100-sxm'"):
        b.for_device("a100-sxm")
    assert artifact.onnx_file(b) == "model.onnx" and artifact.onnx_file(h200) == "model.h200.onnx"


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_joint_model_predicts_per_named_device(joint_dir, backend):
    """The same heads, each device's features: a memory-bound problem's predictions differ between the
    devices, and each backend serves the device it was loaded for (onnx: that device's file)."""
    prob = GemmProblem(m=16, n=8192, k=8192, dtype="bfloat16")
    pad = PadProblem(m=4095, k=4097, n=1000, dtype="float16")
    out = {}
    for dev in ("h100-sxm", "h200"):
        p = Predictor.load(joint_dir, backend=backend, device=dev)
        assert p.device == dev == p.spec.name and p.backend == backend
        out[dev] = (p.predict(prob, p.default_configs("bfloat16")[:40]), p.rank(prob, top_k=3), p.pad(pad))
    assert not np.allclose(out["h100-sxm"][0], out["h200"][0])
    assert out["h100-sxm"][2] != out["h200"][2]


def test_joint_model_backends_agree_per_device(joint_dir):
    prob = GemmProblem(m=1000, n=37, k=4096, dtype="float16")
    for dev in ("h100-sxm", "h200"):
        t = Predictor.load(joint_dir, backend="torch", device=dev)
        o = Predictor.load(joint_dir, backend="onnx", device=dev)
        np.testing.assert_allclose(o.predict(prob, t.default_configs("float16")), t.predict(prob, t.default_configs("float16")),
                                   rtol=1e-3)
        assert [c for c, _ in o.rank(prob, top_k=5)] == [c for c, _ in t.rank(prob, top_k=5)]


def test_joint_model_live_device(joint_dir, monkeypatch):
    # mocked GPU properties (no GPU here): an H200 that the model knows is chosen quietly
    _mock_gpu(monkeypatch, "NVIDIA H200", 132)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Predictor.load(joint_dir).device == "h200"
    _mock_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", 132)
    assert Predictor.load(joint_dir).device == "h100-sxm"
    # an A100 it does not know: the default device, one warning naming it
    _mock_gpu(monkeypatch, "NVIDIA A100-SXM4-80GB", 108)
    with pytest.warns(RuntimeWarning, match=r"\(a100-sxm\) is not a device this model was trained for; predicting "
                                            "for h100-sxm") as rec:
        assert Predictor.load(joint_dir).device == "h100-sxm"
    assert len(rec) == 1


def test_joint_model_stale_device_onnx_is_refused(joint_dir, tmp_path):
    """model.h200.onnx exported for the other device (its predict and ranking graphs encode with H100
    constants; the load-time check meets the predict graph first)."""
    import shutil

    from perfmodel import artifact, onnx_export

    folder = tmp_path / "m"
    shutil.copytree(joint_dir, folder)
    b = artifact.load(folder)
    onnx_export.export_onnx(b, folder / "model.h200.onnx")  # the H100 graph under the H200 name
    with pytest.raises(artifact.ArtifactError, match="(predict|ranking) graph disagrees"):
        Predictor.load(folder, backend="onnx", device="h200")
    Predictor.load(folder, backend="onnx", device="h100-sxm")  # its own file is fine


def test_inductor_hook_says_when_the_predictor_is_for_another_known_device(joint_dir, monkeypatch):
    pytest.importorskip("triton")
    from perfmodel.serve import inductor as si, notices

    p = Predictor.load(joint_dir, device="h100-sxm")
    monkeypatch.setattr(notices, "_warned", set())
    _mock_gpu(monkeypatch, "NVIDIA H200", 132)  # mocked GPU properties
    with pytest.warns(RuntimeWarning, match="loaded for h100-sxm, this GPU is 'h200', which the model also knows"):
        si._check_device(p)


def test_saving_a_bundle_for_another_device_is_refused(joint_dir, tmp_path):
    from perfmodel import artifact, onnx_export

    b = artifact.load(joint_dir)
    with pytest.raises(artifact.ArtifactError, match="default device"):
        artifact.save(b.for_device("h200"), tmp_path / "x")


def test_export_onnx_screen_keep_rewrites_every_devices_file(joint_dir, tmp_path, capsys):
    """export-onnx --screen-keep on a model of two devices: the keep is the folder's, so both files are
    re-traced with it (neither left stale); --out and a single --device are refused, the folder unchanged."""
    import shutil

    from perfmodel import artifact, onnx_export
    from perfmodel.cli import main

    folder = tmp_path / "m"
    shutil.copytree(joint_dir, folder)
    before = artifact.load(folder).screen_keep
    keep = max(1, before // 2)
    for extra in (["--out", str(folder / "model.onnx")], ["--device", "h200"]):
        assert main(["export-onnx", "--model", str(folder), "--screen-keep", str(keep), *extra]) == 2
        assert "--screen-keep" in capsys.readouterr().err
    assert artifact.load(folder).screen_keep == before
    assert main(["export-onnx", "--model", str(folder), "--screen-keep", str(keep)]) == 0
    out = capsys.readouterr().out
    assert "model.onnx" in out and "model.h200.onnx" in out and f"screen_keep {keep}" in out
    assert not list(folder.glob(".*.tmp"))
    prob = GemmProblem(m=3000, n=77, k=1024)
    for dev in ("h100-sxm", "h200"):
        ox, pt = Predictor.load(folder, device=dev, backend="onnx"), Predictor.load(folder, device=dev, backend="torch")
        assert ox._run.rank_keep == pt.screen_keep == keep != before
        a, b = ox.rank(prob, top_k=5), pt.rank(prob, top_k=5)
        assert [c for c, _ in a] == [c for c, _ in b]
