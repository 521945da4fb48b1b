"""`python -m perfmodel.serve.cli`: the `perfmodel` command under its former name (perfmodel/cli.py is
the hub; tests, docs and data_gen's worker processes call it by this name too)."""
from __future__ import annotations

import sys

from perfmodel.cli import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
