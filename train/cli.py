"""`perfmodel train` and `perfmodel eval`."""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import shlex
import sys
import typing
from pathlib import Path

from perfmodel.locations import default_model_dir

from .pipeline import TrainSettings


def _widths(text: str) -> tuple[int, ...]:
    """Hidden widths from "256,256,256" ('' for none)."""
    return tuple(int(h) for h in text.split(",") if h.strip())


def _devices(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def _optional(text: str) -> str | None:
    return text or None


# How a flag's text becomes a TrainSettings value, by the field's annotation.
_PARSE = {int: int, float: float, str: str, Path: Path, tuple[int, ...]: _widths, int | str: _devices,
          str | None: _optional}


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainSettings field: --<name> (dashes), parsed by its annotation, with the field's
    default and help; a bool field is a switch that flips its default (--no-<name> for a True one)."""
    hints = typing.get_type_hints(TrainSettings)
    defaults = TrainSettings()
    for f in dataclasses.fields(TrainSettings):
        meta = f.metadata
        if not meta.get("cli", True):
            continue
        typ, default = hints[f.name], getattr(defaults, f.name)
        help_ = meta.get("help") or None
        if typ is bool:
            flag = meta.get("flag") or (f"--no-{f.name}" if default else f"--{f.name}").replace("_", "-")
            parser.add_argument(flag, dest=f.name, action="store_false" if default else "store_true", help=help_)
            continue
        flag = meta.get("flag") or "--" + f.name.replace("_", "-")
        if typ == tuple[Path, ...]:  # a repeated flag, one path each; none: the field's default
            parser.add_argument(flag, dest=f.name, type=Path, action="append", default=None, help=help_)
            continue
        parser.add_argument(flag, dest=f.name, type=_PARSE[typ], default=default, choices=meta.get("choices"),
                            help=help_)


def settings_from_args(args: argparse.Namespace, command: str = "") -> TrainSettings:
    names = [f.name for f in dataclasses.fields(TrainSettings) if f.metadata.get("cli", True)]
    given = {name: getattr(args, name) for name in names}
    return TrainSettings(**{k: v for k, v in given.items() if v is not None or k != "data"}, command=command)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    d = TrainSettings()
    t = sub.add_parser("train", help="train the model (Lightning, tracked in MLflow)")
    add_settings_arguments(t)
    b = sub.add_parser("build", help="build a model folder from the data folders in one run, as a recipe says "
                       "(every head, the evaluation, the ONNX export, the card; recipes/*.toml)")
    b.add_argument("--recipe", type=Path, required=True, help="the recipe, a TOML file (recipes/h100.toml)")
    b.add_argument("--out", type=Path, default=None, help="model folder to write (default: the recipe's out); "
                   "replaced only on success")
    e = sub.add_parser("eval", help="evaluate a model folder on held-out problems, with baselines")
    e.add_argument("--model", type=Path, default=default_model_dir(), help="model folder (default: the shipped one)")
    e.add_argument("--data", type=Path, action="append", default=None,
                   help=f"dataset folder (default {d.data[0]}); repeat for several devices, the model's default "
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
    _distill_parser(sub)
    from .call_head import CallHeadSettings
    from .cublas_head import CublasHeadSettings
    from .static_head import StaticHeadSettings

    _head_parser(sub, "static-head", "fit the static head (the times of the kernel compiled for one shape, as Inductor "
                 "compiles it: Predictor.load(kernel='inductor')) and add it to a model folder", StaticHeadSettings(),
                 "the model's dataset, with gemm_static parts", "the head's hidden widths",
                 ("epochs", "batch_rows", "lr", "weight_decay", "huber_beta", "seed", "threads"))
    head_settings = ("members", "epochs", "batch_rows", "lr", "weight_decay", "huber_beta", "seed", "threads")
    _head_parser(sub, "call-head", "fit the cuBLAS call heads (does cuBLAS beat the best Triton config? "
                 "Candidates.prefer_cublas, per kernel mode) and add them to a model folder", CallHeadSettings(),
                 "the model's dataset; its gemm_static parts give the inductor mode's head; a model of several "
                 "devices: repeat, one folder per device in the model's device order", "each member's hidden widths",
                 head_settings, several_devices=True)
    _head_parser(sub, "cublas-head", "refit the cuBLAS (torch.mm) head of a model folder on every torch.mm time of its "
                 "dataset: GEMM problems, cublas_only problems, pad rows' unpadded times", CublasHeadSettings(),
                 "the model's dataset; a model of several devices: repeat, one folder per device in the model's "
                 "device order", "each member's hidden widths", head_settings, several_devices=True)
    from .problem_head import ProblemHeadSettings

    _head_parser(sub, "problem-head", "fit the problem network (torch.mm's time and the cuBLAS-or-Triton calls, one "
                 "MLP) in place of a model folder's cublas, call and call_static heads", ProblemHeadSettings(),
                 "the model's dataset; its gemm_static parts give the call_static output; a model of several "
                 "devices: repeat, one folder per device in the model's device order", "each member's hidden widths",
                 head_settings, several_devices=True)
    from .bmm_head import CV_BY, BmmHeadSettings

    bmm = _head_parser(sub, "bmm-head", "fit the bmm heads (Inductor's bmm template configs and aten::bmm, for "
                 "GemmProblem(batch > 1)) on a dataset's bmm rows and add them to a model folder", BmmHeadSettings(),
                 "the model's default device's dataset, with bmm shards; a model of several devices: repeat, one "
                 "folder per device in the model's device order, each one's bmm rows fitted on",
                 "each member's hidden widths (the Triton head)",
                 head_settings + ("rank_weight", "rank_tau", "problems_per_batch", "aten_members", "aten_epochs",
                                  "call_members", "call_epochs", "cv_folds", "cv_members", "static_share"),
                 several_devices=True)
    bmm.add_argument("--aten-hidden", type=_widths, default=BmmHeadSettings().aten_hidden,
                     help="each member's hidden widths (the aten::bmm head)")
    bmm.add_argument("--call-hidden", type=_widths, default=BmmHeadSettings().call_hidden,
                     help="each member's hidden widths (the aten-or-Triton call head)")
    bmm.add_argument("--aten-head", dest="aten_head", action="store_true",
                     help="also fit the bmm_aten head (aten::bmm's own time); without it the folder serves aten::bmm's "
                          "time as the call head implies it")
    bmm.add_argument("--cv-by", dest="cv_by", choices=CV_BY, default=BmmHeadSettings().cv_by,
                     help="what a cross-validation fold holds out: every batch of a shape (default), or each problem "
                          "alone (a shape's other batches may be fitted on)")
    bmm.add_argument("--no-static-rows", dest="static_rows", action="store_false",
                     help="leave the folder's gemm_static rows (batch-1 rows) out of the Triton head's training set")


def _distill_parser(sub: argparse._SubParsersAction) -> None:
    """perfmodel distill's arguments."""
    from .distill import DistillSettings

    ds = DistillSettings()
    t = sub.add_parser("distill", help="fit the student head that predict serves (one MLP distilled from the "
                       "gemm head) and add it to a model folder (re-exports model.onnx)")
    t.add_argument("--model", type=Path, default=ds.model, help="model folder, rewritten in place")
    t.add_argument("--data", type=Path, action="append", default=None,
                   help=f"the dataset the model was trained on (its split; default {ds.data}); a model of several "
                        "devices: repeat, one folder per device in the model's device order")
    t.add_argument("--hidden", type=_widths, default=ds.hidden, help="the student's hidden widths")
    _setting_arguments(t, ds, ("epochs", "batch_rows", "lr", "weight_decay", "random_problems", "random_configs",
                               "seed", "device", "threads"))
    t.add_argument("--screens", action="store_true",
                   help="the student screens the ranking too: the folder's screen head is dropped (one speed head)")


def _head_parser(sub: argparse._SubParsersAction, name: str, help: str, settings: typing.Any, data_help: str,
                 hidden_help: str, names: tuple[str, ...], several_devices: bool = False) -> argparse.ArgumentParser:
    """A command that fits a head of a model folder: --model, --data, --hidden and the settings
    dataclass's scalar fields `names`. several_devices: the model may serve several devices, --data is
    repeated (none given: the folders the model was trained on)."""
    t = sub.add_parser(name, help=help)
    if several_devices:
        t.add_argument("--model", type=Path, default=settings.model, help="model folder, rewritten in place")
        t.add_argument("--data", type=Path, action="append", default=None,
                       help=f"{data_help} (default: the folders named in the model's metadata)")
    else:
        t.add_argument("--model", type=Path, default=settings.model,
                       help="model folder (of one device), rewritten in place")
        t.add_argument("--data", type=Path, default=settings.data, help=f"{data_help} (default {settings.data})")
    t.add_argument("--hidden", type=_widths, default=settings.hidden, help=hidden_help)
    _setting_arguments(t, settings, names)
    return t


def _setting_arguments(parser: argparse.ArgumentParser, settings: typing.Any, names: tuple[str, ...]) -> None:
    """--<name> for each of a settings dataclass's scalar fields, typed and defaulted by its value."""
    for name in names:
        default = getattr(settings, name)
        parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)


def _from_args(cls: typing.Any, args: argparse.Namespace) -> typing.Any:
    """A settings dataclass from the parsed arguments of its fields."""
    return cls(**{k: getattr(args, k) for k in cls.__dataclass_fields__})


REFITS = ("distill", "static-head", "call-head", "cublas-head", "problem-head", "bmm-head")


def _refit(args: argparse.Namespace, command: str) -> dict:
    """A head-by-head refit of a model folder (train/refit.py), its step appended to the folder's build record."""
    from . import refit
    from .bmm_head import BmmHeadSettings
    from .call_head import CallHeadSettings
    from .cublas_head import CublasHeadSettings
    from .distill import DistillSettings
    from .problem_head import ProblemHeadSettings
    from .static_head import StaticHeadSettings

    if args.command == "distill":
        given = {k: getattr(args, k) for k in DistillSettings.__dataclass_fields__}
        if given["data"] is None:
            del given["data"]
        elif len(given["data"]) == 1:
            given["data"] = given["data"][0]
        else:
            given["data"] = tuple(given["data"])
        return refit.refit_student(DistillSettings(**given), command=command)
    fit, cls = {"static-head": (refit.refit_static, StaticHeadSettings), "call-head": (refit.refit_call, CallHeadSettings),
                "cublas-head": (refit.refit_cublas, CublasHeadSettings),
                "problem-head": (refit.refit_problem, ProblemHeadSettings),
                "bmm-head": (refit.refit_bmm, BmmHeadSettings)}[args.command]
    return fit(_from_args(cls, args), command=command)


def require_extra(what: str, modules: tuple[str, ...]) -> None:
    """RuntimeError (the CLI prints it) naming the modules of the `train` extra that `what` needs and this
    install lacks. Training needs Lightning and MLflow; evaluating, distilling and fitting the other heads
    need neither."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise RuntimeError(f"{what} needs {' and '.join(missing)}, not installed here "
                           "(pip install 'perfmodel[train]')")


def run(args: argparse.Namespace) -> int:
    if args.command == "eval" and args.log_mlflow:  # before the evaluation, not after it
        require_extra("--log-mlflow", ("mlflow",))
    if args.command == "train":
        require_extra("training", ("lightning", "mlflow"))
        s = settings_from_args(args, "perfmodel " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
        from .pipeline import run as train_run

        res = train_run(s)
        print(json.dumps({k: v for k, v in res.items() if k not in ("metrics",)}, indent=2, default=str))
        return 0
    command = "perfmodel " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    if args.command == "build":
        require_extra("building", ("lightning",))
        from .recipe import run_build

        print(json.dumps(run_build(args.recipe, out=args.out), indent=2, default=str))
        return 0
    if args.command in REFITS:
        print(json.dumps(_refit(args, command), indent=2, default=str))
        return 0
    from .eval_cmd import run_eval

    return run_eval(args)
