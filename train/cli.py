"""`perfmodel build` and `perfmodel eval`.

`perfmodel build --recipe R` builds a model folder from the data folders in one run; `--only HEAD` (repeatable,
a head registered in perfmodel/heads/) fits those heads into the existing folder, as the recipe's sections say,
and rewrites it atomically. The commands that each fitted one head in place (train, distill, static-head,
call-head, cublas-head, problem-head, bmm-head) are gone: each name is kept only to say what replaces it.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

from perfmodel.heads import REGISTRY
from perfmodel.locations import default_model_dir

# The removed in-place commands, and what does their work now.
REMOVED = {"train": "perfmodel build --recipe RECIPE (every head: recipes/*.toml)",
           "distill": "perfmodel build --recipe RECIPE --only student",
           "static-head": "perfmodel build --recipe RECIPE (the config network serves kernel='inductor': "
                          "[train].config_net = true)",
           "call-head": "perfmodel build --recipe RECIPE --only problem (the problem network's call outputs)",
           "cublas-head": "perfmodel build --recipe RECIPE --only problem (the problem network's cuBLAS output)",
           "problem-head": "perfmodel build --recipe RECIPE --only problem",
           "bmm-head": "perfmodel build --recipe RECIPE --only bmm"}
COMMANDS = ("build", "eval", *REMOVED)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("build", help="build a model folder from the data folders in one run, as a recipe says "
                       "(every head, the evaluation, the ONNX export, the card; recipes/*.toml); --only HEAD fits "
                       "those heads into the existing folder")
    b.add_argument("--recipe", type=Path, required=True, help="the recipe, a TOML file (recipes/h100.toml)")
    b.add_argument("--out", type=Path, default=None, help="model folder to write (default: the recipe's out); "
                   "replaced only on success")
    b.add_argument("--only", action="append", default=None, choices=list(REGISTRY), metavar="HEAD",
                   help=f"fit only this head (repeatable; one of {', '.join(REGISTRY)}) into the existing folder, "
                        "with the recipe's section for it and the folder's split; the folder is rewritten atomically "
                        "(a failed fit leaves it as it was)")
    _eval_parser(sub)
    for name, instead in REMOVED.items():  # each takes any arguments, and says what replaces it
        sub.add_parser(name, help=f"removed: use {instead}", add_help=False).set_defaults(removed=True)


def _eval_parser(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("eval", help="evaluate a model folder on held-out problems, with baselines")
    e.add_argument("--model", type=Path, default=default_model_dir(), help="model folder (default: the shipped one)")
    e.add_argument("--data", type=Path, action="append", default=None,
                   help="dataset folder (default data/h100); repeat for several devices, the model's default "
                        "device's first (later devices' held-out problems follow its split). The shard headers name "
                        "each folder's device: a model that knows it predicts for it, another (zero-shot) for its "
                        "default device, as it serves an unknown GPU")
    e.add_argument("--split", choices=("problem", "family"), default=None,
                   help="the held-out split: by problem, or by family (whole weight shapes held out: every token "
                        "count of a held-out layer unseen; train/families.py); default: the one the model was "
                        "trained on (its metadata's settings.split)")
    e.add_argument("--json", action="store_true")
    e.add_argument("--plots", type=Path, default=None, metavar="DIR",
                   help="also write the held-out plots (PNG, needs matplotlib) into DIR")
    e.add_argument("--log-mlflow", action="store_true", help="also log the metrics to an MLflow run")
    e.add_argument("--tracking-uri", default=None)


def require_extra(what: str, modules: tuple[str, ...]) -> None:
    """RuntimeError (the CLI prints it) naming the modules of the `train` extra that `what` needs and this
    install lacks. Building needs Lightning (and MLflow where the recipe tracks); evaluating needs neither."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise RuntimeError(f"{what} needs {' and '.join(missing)}, not installed here "
                           "(pip install 'perfmodel[train]')")


def run(args: argparse.Namespace) -> int:
    if args.command in REMOVED:
        print(f"perfmodel {args.command}: removed; use {REMOVED[args.command]}", file=sys.stderr)
        return 2
    if args.command == "eval" and args.log_mlflow:  # before the evaluation, not after it
        require_extra("--log-mlflow", ("mlflow",))
    if args.command == "build":
        require_extra("building", ("lightning",))
        from .recipe import run_build, run_only

        if args.only:  # recorded as the recipe and the heads: `perfmodel build --recipe R --only HEAD`
            res = run_only(args.recipe, tuple(args.only), out=args.out)
        else:
            res = run_build(args.recipe, out=args.out)
        print(json.dumps(res, indent=2, default=str))
        return 0
    from .eval_cmd import run_eval

    return run_eval(args)
