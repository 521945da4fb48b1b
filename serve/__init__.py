"""Serving (installed as perfmodel.serve): the Predictor (torch and onnxruntime backends), config
ranking, cuBLAS and pad predictions, and hooks for Triton's autotuner (perfmodel.serve.triton_hook)
and Inductor (perfmodel.serve.inductor).

Imports neither Lightning nor MLflow nor pandas (MLflow only when a "models:/" URI is loaded).
"""
from .predictor import Candidates, Predictor

__all__ = ["Candidates", "Predictor"]
