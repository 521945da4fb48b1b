"""The benchmarks, a package run from the repo root: `python -m benchmarks.NAME` for the product benchmarks
(docs/benchmarks.md) and `python -m benchmarks.studies.NAME` for the one-question studies
(benchmarks/studies/README.md).

`python -m` puts the working directory, the repo root, on sys.path: perfmodel (the checkout's when nothing is
installed, as on the GPU machine), benchmarks._shared and tests._synthetic (--synthetic) import from there with no
sys.path edit. A benchmark that runs itself again in a worker process does so the same way
(`python -m <its __spec__.name>`). REPO and RESULTS are the folders the scripts' defaults use."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
