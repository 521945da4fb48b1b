"""The Predictor's arguments and answers: the checks of its arguments (errors that name the field) and
Candidates, what Predictor.candidates answers. Imported by perfmodel.serve.predictor and the hooks; imports no
other module of perfmodel.serve but runners (its KERNELS)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from perfmodel.schema import GemmConfig, GemmProblem

from .runners import KERNELS

__all__ = ["Candidates"]


@dataclass(frozen=True)
class Candidates:
    """What to benchmark for one problem: the model's best configs, widened while they are too close
    to call, and the predicted cuBLAS (torch.mm) time.

    configs / predicted_ms: fastest first (predict's times). cublas_ms: Predictor.predict_cublas (with the
    model's call head for the kernel mode, below the whole space's best config exactly where the call says
    cuBLAS wins: perfmodel.serve.decisions.cublas_time), or None when the model has no cuBLAS head.
    prefer_cublas: cublas_ms below predicted_ms[0], the best config shown (perfmodel.serve.decisions.
    cublas_preferred: the one rule of the CLI, the API and the hooks), so a caller may skip compiling Triton
    altogether. With the call head this is its call against the whole space (below 0: cuBLAS), and against
    a config list of the caller's also wherever cuBLAS beats the list's best.
    For a bmm (batch > 1): the model's bmm heads -- Inductor's bmm template configs, aten::bmm's time as
    cublas_ms (the bmm call head's implied time), the same rule (perfmodel.serve.bmm).
    """

    configs: tuple[GemmConfig, ...]
    predicted_ms: tuple[float, ...]
    cublas_ms: float | None
    prefer_cublas: bool

    @property
    def best_ms(self) -> float:
        return self.predicted_ms[0]


def _check_top_k(top_k: Any, name: str = "top_k") -> int:
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, got {type(top_k).__name__} ({top_k!r})")
    if top_k < 1:
        raise ValueError(f"{name}: must be >= 1, got {top_k}")
    return int(top_k)


def _check_rank(top_k: Any, prob: Any, screened: Any) -> tuple[int, GemmProblem, bool]:
    """rank()'s arguments checked in its order: top_k, prob, screened."""
    return _check_top_k(top_k), _check_problem(prob), _check_flag(screened, "screened")


def _check_rank_many(top_k: Any, problems: Any, screened: Any) -> tuple[int, list[GemmProblem], bool]:
    """rank_many()'s arguments checked in its order: top_k, problems, screened."""
    return _check_top_k(top_k), _check_problems(problems), _check_flag(screened, "screened")


def _check_flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__} ({value!r})")
    return value


def _check_kernel(kernel: Any) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {', '.join(KERNELS)}, got {kernel!r}")


def _check_problem(prob: Any, name: str = "prob") -> GemmProblem:
    if not isinstance(prob, GemmProblem):
        raise TypeError(f"{name}: expected a GemmProblem, got {type(prob).__name__}")
    return prob  # batch > 1 (a bmm) goes to the model's bmm heads (perfmodel.serve.bmm)


def _check_problems(problems: Any) -> list[GemmProblem]:
    """A non-empty sequence of GemmProblem, as a list; errors name the offending element."""
    if isinstance(problems, GemmProblem) or not isinstance(problems, Iterable):
        raise TypeError(f"problems: expected a sequence of GemmProblem, got {type(problems).__name__}")
    problems = list(problems)
    if not problems:
        raise ValueError("problems: empty; pass at least one GemmProblem")
    for i, p in enumerate(problems):
        _check_problem(p, f"problems[{i}]")
    return problems
