"""`perfmodel gen gemm|pad|cublas|cublas-only|bmm|grouped|static` and `perfmodel data info` (argument parsing; work is imported
lazily)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from perfmodel.locations import default_data_dir


def parse_shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard: expected i/n, got {text!r}") from None
    if not (n >= 1 and 0 <= i < n):
        raise argparse.ArgumentTypeError(f"--shard: need 0 <= i < n, got {text!r}")
    return i, n


def _dataset_spec(folder: Path) -> str:
    """The device spec a dataset folder's GEMM parts were drawn with (its problem list's budgets)."""
    from .shards import read_dataset

    _, headers = read_dataset(folder, "gemm")
    h = headers[0]
    return (h.get("sweep") or {}).get("problem_spec") or h["device_spec"]


def add_parsers(sub: argparse._SubParsersAction) -> None:
    gen = sub.add_parser("gen", help="time on the GPU and write dataset shards (static: rows already timed)")
    gsub = gen.add_subparsers(dest="gen_kind", required=True)
    helps = {"cublas": "re-time torch.mm for every GEMM problem of --source, in a quiet process",
             "cublas-only": "time torch.mm alone on problems of its own (every alignment class, up to 1e13 FLOP)"}
    for name in ("gemm", "pad", "cublas", "cublas-only"):
        g = gsub.add_parser(name, help=helps.get(name, f"the {name} sweep"))
        g.add_argument("--out", type=Path, default=Path("data/h100"),
                       help="dataset folder (resumes if it has parts; default: the v4 sweep in progress)")
        if name not in ("cublas", "cublas-only"):  # the cuBLAS passes run on one GPU
            g.add_argument("--shard", type=parse_shard, default=(0, 1), help="i/n: this machine's share of the sweep")
            g.add_argument("--seed", type=int, default=0)
            g.add_argument("--max-problems", type=int, default=None, help="stop after this many new problems")
        g.add_argument("--device-spec", default=None, help="datasheet spec name (default: matched from the GPU)")
        if name in ("gemm", "pad"):
            g.add_argument("--problems-spec", default=None,
                           help="draw the problem list (and config samples) with this device spec's budgets, to time "
                                "another device's problems (default: --device-spec's; with --problems-from, that "
                                "dataset's)")
        g.add_argument("--budget-ms", type=float, default=0.8, help="GPU ms of timed runs per config")
        # The spin must outlast the host's enqueue of one timed call: one kernel in the GEMM sweep, a
        # torch.mm (cuBLAS picks its kernel on the host) in the quiet re-time, pad+mm+slice in the pad sweep.
        spin = {"gemm": 100.0, "cublas": 500.0, "cublas-only": 500.0, "pad": 1000.0}[name]
        g.add_argument("--pre-sleep-us", type=float, default=spin,
                       help=f"GPU spin before each timed run, hiding host launch latency (0: none; default {spin:g})")
        g.add_argument("--stats", type=Path, default=None, help="write the run's statistics (JSON) here")
        g.add_argument("--no-progress", action="store_true")
        if name == "gemm":
            from .settings import GemmSweepSettings

            d = GemmSweepSettings()
            g.add_argument("--n-random", type=int, default=d.n_random, help="random problems beside the real-model shapes")
            g.add_argument("--configs", type=int, default=d.configs_per_group, help="configs sampled per aligned compile group")
            g.add_argument("--configs-unaligned", type=int, default=d.configs_unaligned,
                           help="configs sampled per group whose K or N is not a multiple of 16")
            g.add_argument("--configs-large", type=int, default=d.configs_large,
                           help=f"configs timed on a problem whose roofline estimate exceeds {d.large_ms} ms")
            g.add_argument("--modes", default=None,
                           help="comma-separated dtype modes to sweep: float16,bfloat16,tf32,float32 (default all)")
            g.add_argument("--max-per-group", type=int, default=None, help="cap new problems per compile group")
            g.add_argument("--time-limit", type=float, default=None, help="stop cleanly after this many seconds")
            t = d.timing
            g.add_argument("--slow-factor", type=float, default=t.slow_factor,
                           help="a config whose first run is this many times slower than the problem's fastest "
                                f"(and above --slow-min-ms) keeps that single run (0: none; default {t.slow_factor:g})")
            g.add_argument("--slow-min-ms", type=float, default=t.slow_min_ms,
                           help="--slow-factor's floor: a config whose first run is at or below this many ms gets "
                                f"its repetitions whatever its factor (default {t.slow_min_ms:g})")
            g.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1), help="compile processes")
            g.add_argument("--problems-from", type=Path, default=None,
                           help="only the problems of this dataset folder (re-times it: same problems, same configs)")
        elif name == "pad":
            g.add_argument("--n", type=int, default=3200, help="pad problems within the small budget (<= 2 ms)")
            g.add_argument("--n-large", type=int, default=400, help="pad problems above it (up to 40 ms, 2e13 FLOP)")
        elif name == "cublas":
            g.add_argument("--source", type=Path, default=None, help="dataset folder whose GEMM problems to time (default: --out)")
        else:
            g.add_argument("--n", type=int, default=3000, help="problems to draw (problems.cublas_only_problems)")
            g.add_argument("--seed", type=int, default=0)
            g.add_argument("--exclude-from", type=Path, default=None,
                           help="leave out this dataset folder's GEMM problems (default: --out's, if it has any)")
            g.add_argument("--time-limit", type=float, default=None, help="stop cleanly after this many seconds")
    st = gsub.add_parser("static", help="CPU: write static-compile runs' rows into a dataset folder as gemm_static parts")
    st.add_argument("runs", type=Path, nargs="+",
                    help="GPU runs of benchmarks/static_retime.py: their --out folders, or rows files of that format "
                         "(--kind gemm_tutorial: benchmarks/studies/tutorial_kernel.py sweep folders)")
    st.add_argument("--kind", choices=("gemm_static", "gemm_tutorial"), default="gemm_static",
                    help="the parts written: gemm_static (Inductor's template, kernel='inductor') or gemm_tutorial "
                         "(the Triton tutorial's kernel, kernel='tutorial')")
    st.add_argument("--out", type=Path, default=Path("data/h100"),
                    help="dataset folder (its gemm header is reused; problems already there are left)")
    _add_bmm_parser(gsub)
    from .grouped_sweep import add_parser as add_grouped_parser

    add_grouped_parser(gsub)
    data = sub.add_parser("data", help="dataset tools")
    dsub = data.add_subparsers(dest="data_cmd", required=True)
    info = dsub.add_parser("info", help="counts of a dataset folder")
    info.add_argument("path", nargs="?", type=Path, default=None, help="dataset folder (default: the shipped data/h100)")
    info.add_argument("--json", action="store_true")
    comp = dsub.add_parser("compress", help="gzip finished .jsonl parts")
    comp.add_argument("path", type=Path)


def _add_bmm_parser(gsub: argparse._SubParsersAction) -> None:
    from .bmm import BmmSweepSettings

    d = BmmSweepSettings()
    g = gsub.add_parser("bmm", help="Inductor's bmm template (its DEFAULT configs and a few EXHAUSTIVE ones), "
                                    "aten::bmm and the padded aten::bmm on batched GEMMs users run")
    g.add_argument("--out", type=Path, default=Path("data/h100"), help="dataset folder (resumes its bmm parts)")
    g.add_argument("--n", type=int, default=d.n,
                   help=f"problems to draw (default {d.n}: about 8 minutes on one H100; an estimate is printed at start)")
    g.add_argument("--seed", type=int, default=d.seed)
    g.add_argument("--exclude-from", type=Path, default=None,
                   help="leave this dataset folder's bmm problems out of the draw (n new ones are drawn)")
    g.add_argument("--modes", default=None,
                   help="comma-separated dtype modes to draw: float16,bfloat16,tf32,float32 (default all)")
    g.add_argument("--time-limit", type=float, default=None, help="stop cleanly after this many seconds")
    g.add_argument("--extra-configs", type=int, default=d.extra_configs,
                   help=f"EXHAUSTIVE-space configs per problem beside Inductor's DEFAULT list (default {d.extra_configs})")
    g.add_argument("--device-spec", default=None, help="datasheet spec name (default: matched from the GPU)")
    g.add_argument("--problems-spec", default=None,
                   help="draw the problems and extra configs with this device spec's budgets, to time another "
                        "device's problems (default: --device-spec's)")
    g.add_argument("--workers", type=int, default=d.compile_workers, help="compile processes")
    t = d.timing
    g.add_argument("--budget-ms", type=float, default=t.budget_ms, help="GPU ms of timed runs per config")
    g.add_argument("--pre-sleep-us", type=float, default=t.pre_sleep_us,
                   help=f"GPU spin before each timed Triton run (default {t.pre_sleep_us:g})")
    g.add_argument("--aten-pre-sleep-us", type=float, default=d.aten_pre_sleep_us,
                   help=f"GPU spin before each timed aten::bmm / padded run (default {d.aten_pre_sleep_us:g})")
    g.add_argument("--slow-factor", type=float, default=t.slow_factor,
                   help=f"a config this many times slower than the problem's fastest first run keeps that run "
                        f"(0: none; default {t.slow_factor:g})")
    g.add_argument("--slow-min-ms", type=float, default=t.slow_min_ms, help=f"--slow-factor's floor (default {t.slow_min_ms:g})")
    g.add_argument("--stats", type=Path, default=None, help="write the run's statistics (JSON) here")
    g.add_argument("--no-progress", action="store_true")


def bmm_settings(args: argparse.Namespace):
    """The bmm sweep's settings from `perfmodel gen bmm` arguments; bad values raise naming the flag
    (checked before any GPU work)."""
    from .bmm import BmmSweepSettings
    from .measure import TimingSettings

    for flag, value, low in (("--n", args.n, 1), ("--extra-configs", args.extra_configs, 0), ("--workers", args.workers, 1)):
        if value < low:
            raise ValueError(f"{flag}: must be >= {low}, got {value}")
    for flag, value in (("--time-limit", args.time_limit), ("--budget-ms", args.budget_ms)):
        if value is not None and not value > 0:
            raise ValueError(f"{flag}: must be > 0, got {value}")
    for flag, value in (("--pre-sleep-us", args.pre_sleep_us), ("--aten-pre-sleep-us", args.aten_pre_sleep_us),
                        ("--slow-factor", args.slow_factor), ("--slow-min-ms", args.slow_min_ms)):
        if not value >= 0:
            raise ValueError(f"{flag}: must be >= 0, got {value}")
    modes = None
    if args.modes is not None:
        from .bmm import check_modes

        try:
            modes = check_modes(tuple(m.strip() for m in args.modes.split(",") if m.strip()))
        except ValueError as exc:
            raise ValueError(f"--{exc}") from None
    exclude: frozenset[str] = frozenset()
    if args.exclude_from is not None:
        from .shards import read_dataset

        if not args.exclude_from.is_dir():
            raise FileNotFoundError(f"--exclude-from: no dataset folder at {args.exclude_from}")
        exclude = frozenset(r["unit"] for r in read_dataset(args.exclude_from, "bmm")[0])
    if args.problems_spec is not None:
        from perfmodel.devices import get_spec

        try:
            get_spec(args.problems_spec)
        except (KeyError, ValueError) as exc:
            raise ValueError(f"--problems-spec: {exc}") from None
    timing = TimingSettings(budget_ms=args.budget_ms, pre_sleep_us=args.pre_sleep_us,
                            slow_factor=args.slow_factor or None, slow_min_ms=args.slow_min_ms)
    return BmmSweepSettings(problem_spec=args.problems_spec, n=args.n, seed=args.seed, extra_configs=args.extra_configs, time_limit_s=args.time_limit,
                            compile_workers=args.workers, exclude=exclude, modes=modes, timing=timing,
                            aten_pre_sleep_us=args.aten_pre_sleep_us)


def _multi_gpu(args: argparse.Namespace) -> int | None:
    """On a host with several GPUs, run one child per GPU, each a shard of this shard."""
    import torch

    g = torch.cuda.device_count()
    if g <= 1 or os.environ.get("PERFMODEL_GPU_CHILD"):
        return None
    i, n = args.shard
    procs = []
    for d in range(g):
        argv = [a for a in sys.argv[1:]]
        if "--shard" in argv:
            j = argv.index("--shard")
            del argv[j:j + 2]
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(d), PERFMODEL_GPU_CHILD="1")
        procs.append(subprocess.Popen([sys.executable, "-m", "perfmodel.cli", *argv,
                                       "--shard", f"{i * g + d}/{n * g}"], env=env))
    return max(p.wait() for p in procs)


def run(args: argparse.Namespace) -> int:
    if args.command == "data":
        return _data(args)
    if args.gen_kind == "static":  # no GPU: rows already timed
        from .static_gen import write_static

        stats = write_static(args.out, args.runs, args.kind)
        print(f"{stats['written']} problems ({stats['rows']} rows read) into {args.out}")
        return 0
    if args.gen_kind == "grouped":  # data_gen/grouped_sweep.py; --dry-run runs on the CPU
        from .grouped_sweep import run_cli

        return run_cli(args)
    import torch

    bmm = bmm_settings(args) if args.gen_kind == "bmm" else None  # argument errors before the GPU check
    if not torch.cuda.is_available():
        raise RuntimeError("gen: needs a CUDA GPU (none is visible)")
    rc = _multi_gpu(args) if args.gen_kind in ("gemm", "pad") else None
    if rc is not None:
        return rc
    from .measure import TimingSettings

    # The slow-config rule compares one problem's Triton configs: the GEMM sweep's alone.
    slow = ({"slow_factor": args.slow_factor or None, "slow_min_ms": args.slow_min_ms} if args.gen_kind == "gemm"
            else {"slow_factor": None})
    timing = TimingSettings(budget_ms=args.budget_ms, pre_sleep_us=args.pre_sleep_us, **slow)
    stats = _sweep(args, timing, bmm)
    print(json.dumps(stats, indent=2))
    if args.stats:
        args.stats.write_text(json.dumps(stats, indent=2))
    return 0


def _data(args: argparse.Namespace) -> int:
    """`perfmodel data`: compress a folder's parts, or print its summary."""
    from .info import dataset_info
    from .shards import compress_parts

    if args.data_cmd == "compress":
        for p in compress_parts(args.path):
            print(p)
        return 0
    path = args.path or default_data_dir()
    if not path.is_dir():
        raise FileNotFoundError(f"path: no dataset folder at {path}")
    info = dataset_info(path)
    if not info["parts"] and not info["bmm_parts"]:  # zero counts of nothing read: not a dataset
        raise ValueError(f"path: {path} holds no dataset shard files (<kind>-*.jsonl or .jsonl.gz, kind gemm, pad, "
                         "cublas, cublas_only, gemm_static or bmm)")
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            print(f"{k:28s} {v}")
    return 0


def _sweep(args: argparse.Namespace, timing: Any, bmm: Any) -> dict[str, Any]:
    """One GPU sweep of `perfmodel gen` (gemm, bmm, cublas, cublas-only, pad) on this process's GPU: its stats."""
    if args.gen_kind == "gemm":
        from .gemm_sweep import run as run_gemm

        return run_gemm(args.out, args.device_spec, _gemm_settings(args, timing), args.shard,
                        progress=not args.no_progress)
    if args.gen_kind == "bmm":
        from .bmm_sweep import run as run_bmm

        return run_bmm(args.out, args.device_spec, bmm, progress=not args.no_progress)
    if args.gen_kind == "cublas":
        from .cublas_sweep import run as run_cublas

        return run_cublas(args.out, args.source or args.out, args.device_spec, timing, progress=not args.no_progress)
    if args.gen_kind == "cublas-only":
        from .cublas_sweep import run_only

        if args.n < 1:
            raise ValueError(f"--n: must be >= 1, got {args.n}")
        exclude = args.exclude_from
        if exclude is None and args.out.is_dir():
            exclude = args.out
        elif exclude is not None and not exclude.is_dir():
            raise FileNotFoundError(f"--exclude-from: no dataset folder at {exclude}")
        return run_only(args.out, args.n, args.seed, args.device_spec, timing, progress=not args.no_progress,
                        exclude_from=exclude, time_limit_s=args.time_limit)
    from .pad_sweep import run as run_pad

    return run_pad(args.out, args.n, args.seed, args.device_spec, args.shard, timing,
                   progress=not args.no_progress, max_problems=args.max_problems, n_large=args.n_large,
                   problem_spec=args.problems_spec)


def _gemm_settings(args: argparse.Namespace, timing: Any) -> Any:
    """The GEMM sweep's settings from `perfmodel gen gemm`'s arguments (--problems-from: that folder's problems)."""
    from .settings import GemmSweepSettings

    only = None
    if args.problems_from is not None:
        from .cublas_sweep import dataset_problems

        if not args.problems_from.is_dir():
            raise FileNotFoundError(f"--problems-from: no dataset folder at {args.problems_from}")
        only = frozenset(unit for unit, _ in dataset_problems(args.problems_from))
        if not only:
            raise ValueError(f"--problems-from: {args.problems_from} has no gemm rows")
        if args.problems_spec is None:
            args.problems_spec = _dataset_spec(args.problems_from)
    return GemmSweepSettings(n_random=args.n_random, only_units=only, configs_per_group=args.configs, seed=args.seed,
                             compile_workers=args.workers, max_problems=args.max_problems, timing=timing,
                             configs_unaligned=args.configs_unaligned, max_per_group=args.max_per_group,
                             configs_large=args.configs_large,
                             modes=tuple(args.modes.split(',')) if args.modes else None, time_limit_s=args.time_limit,
                             problem_spec=args.problems_spec)
