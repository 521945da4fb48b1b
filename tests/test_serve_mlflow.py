"""Predictor.load from MLflow URIs (runs:/, models:/name/version, models:/name@alias) against a sqlite
tracking store in a temporary folder, with a SYNTHETIC random-weight model folder as the artifact."""
from __future__ import annotations


import numpy as np
import pytest

from perfmodel import GemmProblem
from perfmodel.serve import Predictor
from tests._synthetic import write_synthetic_model

mlflow = pytest.importorskip("mlflow")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("mlflow")
    model = write_synthetic_model(root / "model", seed=5)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    exp = client.create_experiment("perfmodel-test", artifact_location=(root / "artifacts").as_uri())
    run = client.create_run(exp)
    client.log_artifacts(run.info.run_id, str(model), artifact_path="model")
    client.set_terminated(run.info.run_id)
    client.create_registered_model("perfmodel-test")
    mv = client.create_model_version("perfmodel-test", source=f"runs:/{run.info.run_id}/model",
                                     run_id=run.info.run_id)
    client.set_registered_model_alias("perfmodel-test", "prod", mv.version)
    return {"uri": uri, "run_id": run.info.run_id, "model": model}


def test_load_mlflow_uris(registry: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", registry["uri"])
    want = Predictor.load(registry["model"]).predict(GemmProblem(m=1024, n=512, k=256))
    for uri in (f"runs:/{registry['run_id']}/model", "models:/perfmodel-test/1", "models:/perfmodel-test@prod"):
        for backend in ("torch", "onnx"):
            p = Predictor.load(uri, backend=backend)
            assert p.source == uri
            np.testing.assert_allclose(p.predict(GemmProblem(m=1024, n=512, k=256)), want, rtol=1e-3)


def test_missing_registered_model(registry: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", registry["uri"])
    with pytest.raises(FileNotFoundError, match="not found"):
        Predictor.load("models:/no-such-model/1")
