"""Shared pytest setup: tests marked `gpu` are skipped where no CUDA device is visible; fixtures several
test modules use (the shipped model, an isolated MLflow/Lightning state)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# The test files import perfmodel (and through it perfmodel.serve, .train, .data_gen) from the checkout,
# installed or not.
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="module")
def shipped(repo_root: Path):
    """The shipped models/h100 bundle (perfmodel.artifact.load), once per test module."""
    from perfmodel import artifact

    return artifact.load(repo_root / "models" / "h100")


@pytest.fixture(scope="module")
def isolated():
    """MLflow keeps the tracking URI and active experiment process-wide, and Lightning's
    deterministic=True switches torch to deterministic algorithms: restore all of it afterwards. Skips
    where the train extra (mlflow, lightning) is not installed."""
    mlflow = pytest.importorskip("mlflow", reason="training needs the train extra (pip install 'perfmodel[train]')")
    pytest.importorskip("lightning", reason="training needs the train extra (pip install 'perfmodel[train]')")
    import torch
    from mlflow.tracking import _tracking_service, fluent

    mp = pytest.MonkeyPatch()
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME",
                "CUBLAS_WORKSPACE_CONFIG"):
        mp.delenv(var, raising=False)  # recorded here, restored by undo() (mlflow.set_* write them)
    mp.setattr(_tracking_service.utils, "_tracking_uri", _tracking_service.utils._tracking_uri)
    mp.setattr(fluent, "_active_experiment_id", fluent._active_experiment_id)
    deterministic = torch.are_deterministic_algorithms_enabled()
    yield mlflow
    if mlflow.active_run() is not None:
        mlflow.end_run()
    mp.undo()
    torch.use_deterministic_algorithms(deterministic)
