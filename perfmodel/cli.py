"""The `perfmodel` command (console script perfmodel.cli:main; `python -m perfmodel.cli`, and the older
`python -m perfmodel.serve.cli`, run the same). Each subcommand imports its subpackage lazily, so serving
commands need neither Lightning nor MLflow, and `gen` needs no MLflow; importing this module imports
none of them."""
from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from perfmodel import __version__

    parser = argparse.ArgumentParser(prog="perfmodel", description="Learned Triton GEMM performance model")
    parser.add_argument("--version", action="version", version=f"perfmodel {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    from perfmodel.data_gen.cli import add_parsers as add_data

    add_data(sub)
    try:
        from perfmodel.train.cli import add_parsers as add_train
    except ImportError:
        add_train = None
    if add_train is not None:
        add_train(sub)
    from perfmodel.serve.commands import add_parsers as add_serve

    add_serve(sub)
    m = sub.add_parser("migrate", help="convert a model folder written in an older layout into the current one, "
                       "in place (perfmodel/migrate.py)")
    m.add_argument("folder", help="the model folder")
    m.add_argument("--drop", action="append", default=[], choices=("screen", "static"),
                   help="drop this head of the older layout, which has no exact conversion (serving changes: the "
                        "migration says how)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # a removed command (train/cli.py REMOVED) takes any arguments, and says what replaces it
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "removed", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.command == "migrate":
            from perfmodel.migrate import migrate

            migrate(args.folder, tuple(args.drop))
            return 0
        if args.command in ("gen", "data"):
            from perfmodel.data_gen.cli import run
        elif args.command in ("build", "eval", "train", "distill", "static-head", "call-head", "cublas-head",
                              "problem-head", "bmm-head"):  # the last seven removed: train/cli.py says what replaces each
            from perfmodel.train.cli import run
        else:
            from perfmodel.serve.commands import run
        return run(args)
    # OSError: a path the OS refuses (a name too long, a permission denied), FileNotFoundError among them
    except (ValueError, TypeError, OSError, RuntimeError) as exc:
        print(f"perfmodel {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
