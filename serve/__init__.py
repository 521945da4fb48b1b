"""Serving (installed as perfmodel.serve): the Predictor (torch and onnxruntime backends, each a
perfmodel.serve.runners.Runner), config ranking, cuBLAS and pad predictions, the decisions made on them
(perfmodel.serve.decisions), and hooks for Triton's autotuner (perfmodel.serve.triton_hook) and
Inductor (perfmodel.serve.inductor).

Imports neither Lightning nor MLflow nor pandas (MLflow only when a "models:/" URI is loaded).
"""
from .predictor import Candidates, Predictor

__all__ = ["Candidates", "Predictor"]
