"""`perfmodel train` and `perfmodel eval`."""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from perfmodel.locations import default_model_dir

from .pipeline import TrainSettings


def add_parsers(sub: argparse._SubParsersAction) -> None:
    d = TrainSettings()
    t = sub.add_parser("train", help="train the model (Lightning, tracked in MLflow)")
    t.add_argument("--data", type=Path, default=d.data, help="dataset folder")
    t.add_argument("--out", type=Path, default=d.out, help="model folder to write (replaced only on success)")
    t.add_argument("--epochs", type=int, default=d.epochs)
    t.add_argument("--hidden", default=",".join(map(str, d.hidden)), help="hidden widths, e.g. 256,256,256,256")
    t.add_argument("--norm", choices=("batch", "layer", "none"), default=d.norm)
    t.add_argument("--lr", type=float, default=d.lr)
    t.add_argument("--rank-weight", type=float, default=d.rank_weight, help="weight of the within-problem loss")
    t.add_argument("--rank-tau", type=float, default=d.rank_tau, help="focus of that term on fast configs (0: uniform)")
    t.add_argument("--problems-per-batch", type=int, default=d.problems_per_batch)
    t.add_argument("--small-head-epochs", type=int, default=d.small_head_epochs)
    t.add_argument("--screen-hidden", default=",".join(map(str, d.screen_hidden)),
                   help="hidden widths of the screen head ('' for none: rank scores every config with the gemm head)")
    t.add_argument("--screen-epochs", type=int, default=d.screen_epochs)
    t.add_argument("--pad-members", type=int, default=d.pad_members, help="seeds averaged into the pad head")
    t.add_argument("--gemm-members", type=int, default=d.gemm_members, help="seeds averaged into the gemm head")
    t.add_argument("--screen-keep", type=int, default=d.screen_keep,
                   help="configs per problem that the gemm head scores after the screen")
    t.add_argument("--seed", type=int, default=d.seed)
    t.add_argument("--no-baselines", action="store_true", help="skip training the PR 156851 baseline")
    t.add_argument("--accelerator", default=d.accelerator, help="Lightning accelerator: cpu, gpu, auto")
    t.add_argument("--devices", default=d.devices, help="Lightning devices (e.g. 2 for two-GPU DDP)")
    t.add_argument("--strategy", default=d.strategy, help="Lightning strategy (e.g. ddp)")
    t.add_argument("--tracking-uri", default=None, help="MLflow URI (default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    t.add_argument("--experiment", default=d.experiment)
    t.add_argument("--register-name", default=d.register_name, help="registered model name ('' to skip)")
    t.add_argument("--alias", default=d.alias)
    t.add_argument("--fast-dev-run", action="store_true", help="one batch per stage (smoke test)")
    t.add_argument("--no-progress", action="store_true")
    e = sub.add_parser("eval", help="evaluate a model folder on held-out problems, with baselines")
    e.add_argument("--model", type=Path, default=default_model_dir(), help="model folder (default: the shipped one)")
    e.add_argument("--data", type=Path, default=d.data)
    e.add_argument("--json", action="store_true")
    e.add_argument("--plots", type=Path, default=None, metavar="DIR",
                   help="also write the held-out plots (PNG, needs matplotlib) into DIR")
    e.add_argument("--log-mlflow", action="store_true", help="also log the metrics to an MLflow run")
    e.add_argument("--tracking-uri", default=None)


def _devices(text: str):
    return int(text) if text.isdigit() else text


def run(args: argparse.Namespace) -> int:
    if args.command == "train":
        hidden = tuple(int(h) for h in args.hidden.split(","))
        s = TrainSettings(data=args.data, out=args.out, epochs=args.epochs, hidden=hidden, norm=args.norm, lr=args.lr,
                          rank_weight=args.rank_weight, rank_tau=args.rank_tau, problems_per_batch=args.problems_per_batch,
                          small_head_epochs=args.small_head_epochs, seed=args.seed,
                          screen_hidden=tuple(int(h) for h in args.screen_hidden.split(",") if h.strip()),
                          screen_epochs=args.screen_epochs, screen_keep=args.screen_keep, pad_members=args.pad_members,
                          gemm_members=args.gemm_members, baselines=not args.no_baselines,
                          accelerator=args.accelerator, devices=_devices(args.devices), strategy=args.strategy,
                          tracking_uri=args.tracking_uri, experiment=args.experiment,
                          register_name=args.register_name or None, alias=args.alias,
                          fast_dev_run=args.fast_dev_run, progress=not args.no_progress,
                          command="perfmodel " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
        from .pipeline import run as train_run

        res = train_run(s)
        print(json.dumps({k: v for k, v in res.items() if k not in ("metrics",)}, indent=2, default=str))
        return 0
    from .eval_cmd import run_eval

    return run_eval(args)
