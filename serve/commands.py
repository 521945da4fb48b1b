"""Serving subcommands (filled in by the serving issue)."""
from __future__ import annotations

import argparse


def add_parsers(sub: argparse._SubParsersAction) -> None:
    return None


def run(args: argparse.Namespace) -> int:
    raise ValueError(f"unknown command {args.command}")
