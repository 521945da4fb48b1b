"""One-question studies: each script answered one design question; README.md beside this file indexes them
(the question, the answer, the result file). Run from the repo root: `python -m benchmarks.studies.NAME`."""
