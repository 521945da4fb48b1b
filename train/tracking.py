"""MLflow tracking of training runs: the tracking URI, metric keys MLflow accepts, the run (with a
Lightning logger several fits share) and the model registry. mlflow and Lightning are imported where used."""
from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Iterator

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


def tracking_uri(uri: str | None) -> str:
    """uri, else $MLFLOW_TRACKING_URI, else DEFAULT_TRACKING_URI."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def mlflow_key(k: str) -> str:
    """A metric name as MLflow accepts it (alphanumerics and _-./ only; spaces to _, commas dropped)."""
    return "".join(ch if ch.isalnum() or ch in "_-./ " else "_" for ch in k).replace(" ", "_").replace(",", "")


def log_metrics(metrics: dict[str, Any]) -> None:
    """The finite numbers of metrics into the active MLflow run, their keys made acceptable."""
    import math

    import mlflow

    mlflow.log_metrics({mlflow_key(k): float(v) for k, v in metrics.items()
                        if isinstance(v, (int, float)) and v is not None and math.isfinite(v)})


@contextlib.contextmanager
def mlflow_run(uri: str | None, experiment: str, name: str) -> Iterator[tuple[Any, Any, str]]:
    """(the MLflow run, a Lightning MLFlowLogger on it, the URI) for the block; the run ends FINISHED or
    FAILED with it. Several fits share the logger: Lightning's finalize() would end the run after the first."""
    import mlflow
    from lightning.pytorch.loggers import MLFlowLogger

    uri = tracking_uri(uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name=f"{name}-{time.strftime('%Y%m%d-%H%M%S')}") as run:
        logger = MLFlowLogger(experiment_name=experiment, tracking_uri=uri, run_id=run.info.run_id)
        logger.finalize = lambda status="success": None
        yield run, logger, uri


def register(run_id: str, name: str, alias: str) -> str:
    """Register the run's model folder as a new version of `name` and point `alias` at it."""
    from mlflow import MlflowClient

    client = MlflowClient()
    try:
        client.get_registered_model(name)
    except Exception:  # not registered yet (MLflow raises RestException / MlflowException)
        client.create_registered_model(name)
    source = f"runs:/{run_id}/model"
    mv = client.create_model_version(name, source=source, run_id=run_id)
    client.set_registered_model_alias(name, alias, mv.version)
    return str(mv.version)
