"""Predictor.load(device=...): a named device, the live-device path (GPU properties mocked here: this
machine has no GPU, said so) and the warning for a GPU the model was not trained for."""
from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

from perfmodel import GemmProblem, Predictor
from perfmodel.serve import loading


def test_named_device():
    p = Predictor.load(device="h100-sxm")
    assert p.device == "h100-sxm" == p.spec.name
    with pytest.raises(ValueError, match="^device: .*h100-sxm.*'h200'"):
        Predictor.load(device="h200")  # the shipped model knows one device
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


@pytest.mark.parametrize("name,sms", [("NVIDIA H200", 132), ("NVIDIA A100-SXM4-80GB", 108), ("Some GPU", 20)])
def test_live_device_the_model_does_not_know_warns_once(monkeypatch, name, sms):
    _mock_gpu(monkeypatch, name, sms)
    with pytest.warns(RuntimeWarning, match="not a device this model was trained for; predicting for h100-sxm") as rec:
        p = Predictor.load()
    assert p.device == "h100-sxm" and len(rec) == 1
    assert loading.live_device_spec() != "h100-sxm"


def test_inductor_hook_says_once_when_the_gpu_is_not_the_models(monkeypatch):
    pytest.importorskip("triton")
    from perfmodel.serve import inductor as si

    p = Predictor.load(device="h100-sxm")
    monkeypatch.setattr(si, "_warned", set())
    _mock_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", 132)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        si._check_device(p)  # the model's own GPU: quiet
    _mock_gpu(monkeypatch, "NVIDIA H200", 132)
    with pytest.warns(RuntimeWarning, match="trained for h100-sxm, this GPU is 'h200'"):
        si._check_device(p)
