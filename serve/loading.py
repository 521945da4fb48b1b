"""Loading a model for perfmodel.serve.predictor.Predictor: resolving path_or_uri (the shipped default
folder, a folder path, or an MLflow URI, downloaded) and choosing and building the backend's runner
(perfmodel.serve.runners, perfmodel.serve.onnx_runner). Imports MLflow only to resolve an MLflow URI;
neither Lightning nor pandas.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from perfmodel.artifact import ModelBundle, load as load_bundle, onnx_file
from perfmodel.locations import default_model_dir
from perfmodel.validation import folder_exists

from .onnx_runner import _check_onnx_matches, _onnxruntime_available, _OnnxRunner
from .runners import Runner, _configure_torch_threads, _TorchRunner

BACKENDS = ("torch", "onnx")


def model_devices(bundle: ModelBundle) -> tuple[str, ...]:
    """The device specs a model was trained for, its default first (ModelBundle.devices: metadata
    "devices"; a one-device model: its spec)."""
    return bundle.devices


def live_device_spec() -> str | None:
    """The spec name of the visible GPU (perfmodel.devices.match_spec), None without one or unknown."""
    import torch

    if not torch.cuda.is_available():
        return None
    from perfmodel.devices import match_spec

    spec = match_spec(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).multi_processor_count)
    return spec.name if spec is not None else torch.cuda.get_device_name()


def choose_device(bundle: ModelBundle, device: str | None) -> str:
    """Predictor.load's device: a named device the model knows (ValueError naming `device` otherwise);
    None: the live GPU's when the model knows it, else the model's default, with a warning (once per
    load) when a GPU is visible that the model was not trained for."""
    known = model_devices(bundle)
    if device is not None:
        if not isinstance(device, str):
            raise TypeError(f"device: expected a device spec name, got {type(device).__name__}")
        if device not in known:
            raise ValueError(f"device: this model was trained for {', '.join(known)}, not {device!r}")
        return device
    live = live_device_spec()
    if live is None or live in known:
        return live or known[0]
    import warnings

    warnings.warn(f"perfmodel: the visible GPU ({live}) is not a device this model was trained for; "
                  f"predicting for {known[0]}", RuntimeWarning, stacklevel=5)
    return known[0]
MLFLOW_SCHEMES = ("models:/", "runs:/", "mlflow-artifacts:/")


def _is_mlflow_uri(text: str) -> bool:
    return text.startswith(MLFLOW_SCHEMES)


def _model_folder_in(root: Path) -> Path:
    """The folder holding metadata.json: root itself or the single one below it."""
    if (root / "metadata.json").is_file():
        return root
    found = sorted(p.parent for p in root.rglob("metadata.json"))
    if len(found) != 1:
        raise FileNotFoundError(f"path_or_uri: the downloaded artifacts hold {len(found)} model folders "
                                f"(metadata.json), need exactly one")
    return found[0]


def _download_mlflow(uri: str, dst: Path) -> Path:
    try:
        from mlflow import artifacts
        from mlflow.exceptions import MlflowException
    except ImportError:
        raise RuntimeError(f"path_or_uri: {uri!r} is an MLflow URI; install mlflow-skinny to resolve it "
                           "(serving a model folder needs no MLflow)") from None
    # DESIGN: MLflow 3 refuses ./mlruns; the team's server comes through MLFLOW_TRACKING_URI.
    tracking = os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")
    registry = os.environ.get("MLFLOW_REGISTRY_URI", tracking)
    try:
        local = artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dst), tracking_uri=tracking,
                                             registry_uri=registry)
    except MlflowException as exc:
        if getattr(exc, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND"):
            raise FileNotFoundError(f"path_or_uri: {uri!r} not found in {registry}: {exc.message}") from None
        raise RuntimeError(f"path_or_uri: cannot download {uri!r} from {registry}: {exc.message}") from None
    return _model_folder_in(Path(local))


def load_model(path_or_uri: str | os.PathLike | None, backend: str | None,
               device: str | None = None, kernel: str = "autotune") -> tuple[ModelBundle, str, Runner, str]:
    """(bundle, backend, runner, source) of Predictor.load's arguments (see its docstring): the bundle
    encodes for the device chosen by choose_device (ModelBundle.for_device), the onnx runner runs that
    device's ONNX file (artifact.onnx_file). backend None: onnx when onnxruntime imports and the file is
    there and serves `kernel` (Runner.kernels), else torch; backend is always the runner's."""
    if backend is not None and (not isinstance(backend, str) or backend not in BACKENDS):
        raise ValueError(f"backend: expected one of {', '.join(BACKENDS)} or None, got {backend!r}")
    if path_or_uri is None:
        # The shipped model for the named device, else the visible GPU's, else the default device's.
        folder = default_model_dir(device if device is not None else live_device_spec())
        if not (folder / "metadata.json").is_file():
            raise FileNotFoundError(f"path_or_uri: the shipped default model {folder} is not there yet "
                                    "(no metadata.json); pass a model folder or an MLflow URI")
        return _from_folder(folder, backend, str(folder), device, kernel)
    if not isinstance(path_or_uri, (str, os.PathLike)):
        raise TypeError(f"path_or_uri: expected a path or an MLflow URI, got {type(path_or_uri).__name__}")
    text = os.fspath(path_or_uri)
    if isinstance(text, str) and _is_mlflow_uri(text):
        # Everything is read into memory (weights, ONNX session), so the download can go.
        with tempfile.TemporaryDirectory(prefix="perfmodel-") as tmp:
            return _from_folder(_download_mlflow(text, Path(tmp)), backend, text, device, kernel)
    folder = Path(text)
    if not folder_exists(folder):  # ValueError naming path_or_uri where the OS cannot look (a name too long)
        raise FileNotFoundError(f"path_or_uri: no model folder at {folder}")
    return _from_folder(folder, backend, str(folder), device, kernel)


def _from_folder(folder: Path, backend: str | None, source: str, device: str | None = None,
                 kernel: str = "autotune") -> tuple[ModelBundle, str, Runner, str]:
    bundle = load_bundle(folder)
    bundle = bundle.for_device(choose_device(bundle, device))
    onnx = folder / onnx_file(bundle)
    if backend != "torch" and (backend == "onnx" or (onnx.is_file() and _onnxruntime_available())):
        runner: Runner = _OnnxRunner(bundle, onnx)
        _check_onnx_matches(bundle, runner, onnx)
        if backend == "onnx" or kernel in runner.kernels:  # named: Predictor says if it cannot serve the mode
            return bundle, runner.backend, runner, source
    _configure_torch_threads()
    runner = _TorchRunner(bundle)
    return bundle, runner.backend, runner, source
