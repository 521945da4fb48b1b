"""CI runs what the README says: .ci/run holds the README's test command verbatim, then the slow tests as a
step of their own; the default run (pyproject.toml's addopts) is the one that leaves them out."""
from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _readme_test_command() -> str:
    lines = [line.strip() for line in (REPO / "README.md").read_text().splitlines()]
    found = [line for line in lines if line.startswith("python3 -m venv") and "pytest" in line]
    assert len(found) == 1, found
    return found[0]


def test_ci_runs_the_readme_command_then_the_slow_tests() -> None:
    command = _readme_test_command()
    assert command.endswith("python -m pytest -q")
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    at = [i for i, line in enumerate(ci) if command in line]
    assert len(at) == 1, "the README's test command, verbatim, once"
    slow = [i for i, line in enumerate(ci) if re.fullmatch(r"python -m pytest -q -m slow", line.strip())]
    assert len(slow) == 1 and slow[0] > at[0], "the slow tests as a step of their own, after the default run"


def test_the_default_run_leaves_out_the_slow_tests() -> None:
    opts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    args = shlex.split(opts["addopts"])
    assert args[args.index("-m") + 1] == "not slow"
    assert any(m.startswith("slow:") for m in opts["markers"]) and any(m.startswith("gpu:") for m in opts["markers"])
