"""The grouped-GEMM sweep (`perfmodel gen grouped`): Inductor's `triton_grouped_mm` template over its config
list and aten's `_grouped_mm`, on the MoE grouped GEMMs of data_gen/grouped.py.

Per problem, Inductor itself compiles `torch._grouped_mm(a, b, offs=offs)` under max-autotune GEMM (backends
ATEN,TRITON, a fresh cache, caches off), so the kernels are exactly Inductor's: every config of its
`_NV_CONFIGS` that `early_config_prune` keeps, compiled for the problem's static shape. A feedback saver
(select_algorithm.add_feedback_saver) receives every choice Inductor benchmarked and its time (Inductor's
timer, on Inductor's even offsets: `inductor_ms`). Then each template choice is re-timed with the project's
protocol (data_gen/measure.py: L2 flush, GPU spin, median of CUDA-event runs, the output checked against an
fp32 reference, the physical-limit check at the measured clock) through its benchmark request's run function
(`bmreq.make_run_fn`, the callable Inductor's own benchmark times), on each routing of data_gen/grouped.py
(Inductor's even offsets, exactly even, two Dirichlet routings): the kernel reads the offsets at run time, so
one compile serves them all. aten's `_grouped_mm` is timed eagerly on each routing. Where a choice cannot be
re-timed (an API this torch lacks), its row keeps Inductor's time (`timer: "inductor"`).

One problem is one crash-safe unit of a `grouped` shard (data_gen/shards.py); an interrupted run resumes
where it stopped and refuses a folder timed on another device or torch. A problem that fails is logged with
its traceback and recorded as failed rows; the sweep goes on (and stops after a few problems in a row fail
the same way: a systematic error should not burn the GPU time).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from .grouped import (B_LAYOUTS, DTYPE_BYTES, DTYPES, FAMILIES, GEMMS, KIND, TOKENS_ORDER, GroupedProblem,
                      GroupedSweepSettings, estimate, expected_configs, grouped_problems, parse_per_expert, problem_id,
                      problem_routings, settings_dict, validate_row)
# one problem's rows and timing; choice_kind, make_run_fn and operand_as also re-exported for the tests
from .grouped_timing import ProblemRows, choice_kind, log, make_operands, make_run_fn, offsets, operand_as  # noqa: F401

MAX_SAME_FAILURES = 3  # problems in a row failing with the same error: the sweep stops


# ------------------------------------------------------------------------------- Inductor's pieces

def _fresh_cache():
    """Inductor's fresh-cache context (torch 2.13: utils.fresh_cache; older: fresh_inductor_cache)."""
    from torch._inductor import utils

    fn = getattr(utils, "fresh_cache", None) or getattr(utils, "fresh_inductor_cache", None)
    if fn is None:
        raise RuntimeError("torch._inductor.utils has neither fresh_cache nor fresh_inductor_cache")
    return fn()


def inductor_patches() -> dict[str, Any]:
    """Inductor config for the autotuning compile, the keys this torch has: max-autotune for GEMMs only,
    aten and Triton backends, every cache off (each problem is compiled and benchmarked anew)."""
    from torch._inductor import config

    want = {"max_autotune": False, "max_autotune_gemm": True, "max_autotune_gemm_backends": "ATEN,TRITON",
            "force_disable_caches": True, "autotune_local_cache": False, "autotune_remote_cache": False,
            "fx_graph_cache": False, "fx_graph_remote_cache": False, "coordinate_descent_tuning": False,
            "autotune_in_subproc": False, "triton.cudagraphs": False}
    out = {}
    for key, value in want.items():
        obj = config
        *path, last = key.split(".")
        for part in path:
            obj = getattr(obj, part, None)
        if obj is not None and hasattr(obj, last):
            out[key] = value
    return out


def inductor_expected(p: GroupedProblem, smem_bytes: int) -> tuple[list[tuple[int, int, int, int, int]], str]:
    """The configs Inductor should offer for this problem: its own _NV_CONFIGS through its own
    early_config_prune where importable (the shared memory of the live GPU), else data_gen/grouped.py's copy.
    (configs, source)."""
    try:
        from torch._inductor.kernel import mm_grouped

        cfgs = mm_grouped.early_config_prune(p.g, p.total_m, DTYPE_BYTES[p.dtype], mm_grouped.grouped_mm_configs(),
                                             {"A_IS_2D": True, "B_IS_2D": False})
        return [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.num_stages, c.num_warps)
                for c in cfgs], "inductor"
    except Exception as exc:  # noqa: BLE001 -- an API that moved: the copy
        log(f"  (inductor's early_config_prune unavailable: {type(exc).__name__}: {exc}; using data_gen's copy)")
        return expected_configs(p, smem_bytes), "copy"


def kernel_hash() -> str:
    """What decides the kernels besides the problem and config: torch, triton and Inductor's grouped-GEMM
    lowering and template sources. Part of every header (shards.IDENTITY_FIELDS): a resumed run refuses a
    folder written with another."""
    import torch
    import triton
    from torch._inductor.kernel import mm_grouped

    h = hashlib.sha1(f"{torch.__version__}|{triton.__version__}".encode())
    src = Path(mm_grouped.__file__)
    for path in (src, src.parent / "templates" / "triton_mm_grouped.py.jinja"):
        if path.exists():
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


# ------------------------------------------------------------------------------------- autotuning

class Capture:
    """The feedback saver: (choice, Inductor's ms) of every grouped_mm choice Inductor benchmarked.
    Its signature takes what torch 2.11 and 2.13 pass (2.13 adds precompile_times)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[tuple[Any, float]], list[Any]]] = []

    def __call__(self, timings: dict, name: str, input_nodes: list, choices: list, *rest: Any) -> None:
        self.calls.append((name, [(c, float(t)) for c, t in timings.items()], list(choices)))


def autotune(p: GroupedProblem, a, b, offs, patches: dict[str, Any]) -> Capture:
    """Compile torch._grouped_mm for the problem with Inductor's max-autotune; the choices it benchmarked."""
    import torch
    from torch._inductor import config, select_algorithm

    cap = Capture()
    torch._dynamo.reset()
    select_algorithm.add_feedback_saver(cap)
    try:
        with config.patch(patches):
            fn = torch.compile(lambda x, w, o: torch._grouped_mm(x, w, offs=o), dynamic=False, fullgraph=True)
            fn(a, b, offs)
            torch.cuda.synchronize()
    finally:
        cache = select_algorithm.get_algorithm_selector_cache() if hasattr(
            select_algorithm, "get_algorithm_selector_cache") else None
        fns = getattr(cache, "feedback_saver_fns", None)
        if isinstance(fns, list) and cap in fns:
            fns.remove(cap)
        else:
            select_algorithm.clear_feedback_savers()
    return cap


# ------------------------------------------------------------------------------------------ a problem

def _base(p: GroupedProblem) -> dict[str, Any]:
    return {**p.as_dict(), "natural_layout": p.natural}


def _compile(p: GroupedProblem, a, b, offs0, patches: dict[str, Any], known_bad: dict[str, str],
             stats: dict[str, Any], stack: contextlib.ExitStack) -> tuple[list[tuple[Any, float]], str]:
    """run_problem's compile: Inductor's max-autotune compile of the problem in a fresh cache (entered on
    stack, which the caller keeps open through the re-timing). ((choice, Inductor's ms) of every grouped_mm
    choice it benchmarked, the compile's error or ""); a dtype whose compile failed before (known_bad) is
    not compiled again."""
    t_compile = time.perf_counter()
    compile_err = known_bad.get(p.dtype, "")
    cap = Capture()
    if not compile_err:
        try:
            stack.enter_context(_fresh_cache())
            cap = autotune(p, a, b, offs0, patches)
        except Exception as exc:  # noqa: BLE001 -- a failed compile is data: failure rows
            compile_err = f"{type(exc).__name__}:{str(exc).splitlines()[0][:160] if str(exc) else ''}"
            log(f"  compile failed: {compile_err}")
            if "BF16" in str(exc) or "bfloat16" in str(exc).lower():  # torch's meta function: bf16 only
                known_bad[p.dtype] = compile_err
    stats["compile_s"] += time.perf_counter() - t_compile
    calls = [c for c in cap.calls if c[0] in ("grouped_mm",)] or cap.calls
    timed = [(ch, ms) for _, pairs, _ in calls for ch, ms in pairs]
    if not compile_err and not timed:
        compile_err = "no_autotune:Inductor benchmarked no grouped_mm choice"
    return timed, compile_err


def run_problem(p: GroupedProblem, spec, bench, bench_aten, clock, settings: GroupedSweepSettings,
                patches: dict[str, Any], known_bad: dict[str, str], stats: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows for one problem: per template config of Inductor's list, per routing, a triton row (or one failed
    row where Inductor did not benchmark it), aten's per routing, "other" choices at Inductor's time.
    Steps: the compile (_compile), the benchmarked choices filed (ProblemRows.sort, .unbenchmarked), the
    re-timing and aten's timing per routing (ProblemRows.time_routings; data_gen/grouped_timing.py)."""
    import torch

    routings = problem_routings(p)
    smem = getattr(spec, "shared_memory_per_block_optin", 232448)
    expected, exp_source = inductor_expected(p, smem)
    a, b = make_operands(p, bench.device)
    offs0 = offsets(routings[0][1], bench.device)  # even_inductor: the offsets Inductor benchmarks with
    problem = ProblemRows(p, spec, bench, bench_aten, clock, _base(p), routings, expected, exp_source)
    # the fresh cache stays entered until the re-timing and the run functions' cleanup are done
    with contextlib.ExitStack() as stack:
        timed, compile_err = _compile(p, a, b, offs0, patches, known_bad, stats, stack)
        problem.sort(timed)
        stats["choices"] += len(problem.triton)
        live = problem.unbenchmarked(compile_err)
        t_time = time.perf_counter()
        problem.time_routings(a, b, live, settings.retime)
        stats["timing_s"] += time.perf_counter() - t_time
    import torch._dynamo

    torch._dynamo.reset()
    del a, b
    torch.cuda.empty_cache()
    return problem.rows


def failed_problem_rows(p: GroupedProblem, err: str) -> list[dict[str, Any]]:
    """The rows of a problem that failed outside any one choice (traceback in the log)."""
    return [{**_base(p), "kind": "other", "name": "problem", "routing": "even_inductor", "timer": "perfmodel",
             "status": f"fail:problem:{err}"[:200], "ms": None, "inductor_ms": None}]


# ------------------------------------------------------------------------------------------- the loop

def header(spec, live: dict[str, Any], settings: GroupedSweepSettings, khash: str, versions: dict[str, str]
           ) -> dict[str, Any]:
    from perfmodel.schema import SCHEMA_VERSION

    from .runtime import device_header

    return device_header(live, spec) | {"schema_version": SCHEMA_VERSION, "kernel_hash": khash, **versions,
                                        "sweep": settings_dict(settings)}


def check_resume(out_dir: Path, head: dict[str, Any]) -> None:
    """A folder's grouped parts must come from this device and this torch / triton: RuntimeError naming the
    field otherwise (before any GPU work)."""
    from .shards import part_files, read_part

    for path in part_files(out_dir, KIND):
        old = read_part(path)[0]
        for key in ("device_name", "torch", "triton", "sm_count"):
            if old.get(key) != head.get(key):
                raise RuntimeError(f"--out: {path.name} was timed with {key} {old.get(key)!r}, this run has "
                                   f"{head.get(key)!r}; use another folder")


def sweep(out_dir: Path, problems: list[GroupedProblem], head: dict[str, Any],
          run_one: Callable[[GroupedProblem], list[dict[str, Any]]], settings: GroupedSweepSettings,
          estimate_s: Callable[[GroupedProblem], float] = lambda p: 10.0, clock_s: Callable[[], float] = time.perf_counter,
          t0: float | None = None) -> dict[str, Any]:
    """Time the problems not yet in out_dir into a new part, in order, one unit each; stop cleanly before a
    problem that would pass the time limit (its estimate, or 1.25x the slowest of the last five problems), at
    max_problems, or after MAX_SAME_FAILURES problems in a row fail with the same error. run_one(p) -> rows;
    an exception there is logged and recorded (failed_problem_rows)."""
    from .shards import ShardWriter

    t0 = clock_s() if t0 is None else t0
    check_resume(out_dir, head)
    writer = ShardWriter(out_dir, KIND, head)
    todo = [p for p in problems if problem_id(p) not in writer.done]
    if settings.max_problems is not None:
        todo = todo[:settings.max_problems]
    stats: dict[str, Any] = {"problems": 0, "failed_problems": 0, "rows": 0, "ok_rows": 0, "triton_ok_rows": 0,
                             "aten_ok_rows": 0, "failed_rows": 0, "rejected_rows": 0, "inductor_timer_rows": 0,
                             "resumed_existing_rows": writer.n_existing_rows, "already_done": len(problems) - len(
                                 [p for p in problems if problem_id(p) not in writer.done]),
                             "to_do": len(todo), "stopped": "done", "part": writer.path.name}
    log(f"grouped sweep: {len(todo)} problems to time ({stats['already_done']} of {len(problems)} already in "
        f"{out_dir}); writing {writer.path.name}")
    recent: list[float] = []
    last_err, same = None, 0
    try:
        for i, p in enumerate(todo):
            elapsed = clock_s() - t0
            need = max([estimate_s(p)] + [1.25 * d for d in recent[-5:]])
            if settings.time_limit_s is not None and elapsed + need > settings.time_limit_s:
                stats["stopped"] = "time_limit"
                log(f"stopping at the time limit: {elapsed:.0f} s used, the next problem needs ~{need:.0f} s")
                break
            tp = clock_s()
            pid = problem_id(p)
            err = None
            try:
                rows = run_one(p)
                if not rows:
                    raise RuntimeError("the problem produced no rows")
                for r in rows:
                    validate_row({**r, "unit": pid})
            except Exception as exc:  # noqa: BLE001 -- fail soft: log, record, go on
                err = f"{type(exc).__name__}:{str(exc).splitlines()[0][:120] if str(exc) else ''}"
                log(f"  problem {pid} failed:\n{traceback.format_exc()}")
                rows = failed_problem_rows(p, err)
                stats["failed_problems"] += 1
            writer.write_unit(pid, rows)
            dt = clock_s() - tp
            recent.append(dt)
            stats["problems"] += 1
            stats["rows"] += len(rows)
            for r in rows:
                ok = r["status"] == "ok"
                stats["ok_rows"] += ok
                stats["triton_ok_rows"] += ok and r["kind"] == "triton"
                stats["aten_ok_rows"] += ok and r["kind"] == "aten"
                stats["failed_rows"] += r["status"].startswith("fail")
                stats["rejected_rows"] += r["status"] == "rejected_peak"
                stats["inductor_timer_rows"] += r["timer"] == "inductor"
            tri = [r["ms"] for r in rows if r["kind"] == "triton" and r["status"] == "ok" and r["routing"] == "even_inductor"]
            at = [r["ms"] for r in rows if r["kind"] == "aten" and r["status"] == "ok" and r["routing"] == "even_inductor"]
            log(f"[{i + 1}/{len(todo)} {clock_s() - t0:5.0f}s] {p.family} G={p.g} {p.gemm} {p.dtype} {p.b_layout} "
                f"M={p.total_m} K={p.k} N={p.n}: {len(rows)} rows ({sum(r['status'] == 'ok' for r in rows)} ok) "
                f"in {dt:.1f}s; best triton {min(tri) if tri else float('nan'):.4f} ms, aten "
                f"{at[0] if at else float('nan'):.4f} ms" + (f"; FAILED {err}" if err else ""))
            same = same + 1 if err is not None and err == last_err else (1 if err is not None else 0)
            last_err = err
            if same >= MAX_SAME_FAILURES:
                stats["stopped"] = f"{same} problems in a row failed: {err}"
                log(f"stopping: {stats['stopped']}")
                break
    finally:
        writer.close()
    stats["wall_s"] = round(clock_s() - t0, 1)
    return stats


def run(out_dir: Path, spec_name: str | None, settings: GroupedSweepSettings, problems: list[GroupedProblem]
        ) -> dict[str, Any]:
    """The sweep on the current CUDA device."""
    import torch
    import triton

    from perfmodel.devices import ClockReader

    from .measure import Bench, TimingSettings
    from .runtime import resolve_spec

    t0 = time.perf_counter()
    device = torch.device("cuda", torch.cuda.current_device())
    spec, live = resolve_spec(spec_name)
    versions = {"torch": torch.__version__, "triton": triton.__version__}
    head = header(spec, live, settings, kernel_hash(), versions)
    check_resume(out_dir, head)  # before building benches: a refusal costs nothing
    if torch.cuda.get_device_capability() < (9, 0):
        raise RuntimeError("device: Inductor's triton_grouped_mm template needs compute capability 9.0+")
    l2 = live.get("l2_bytes") or spec.l2_bytes
    aten_timing = TimingSettings(**{**vars(settings.timing), "pre_sleep_us": settings.aten_pre_sleep_us,
                                    "slow_factor": None})
    bench, bench_aten = Bench(device, l2, settings.timing), Bench(device, l2, aten_timing)
    clock = ClockReader(torch.cuda.current_device())
    patches = inductor_patches()
    log(f"inductor config: {json.dumps(patches)}; torch {torch.__version__}, triton {triton.__version__}, "
        f"{live.get('device_name')}")
    known_bad: dict[str, str] = {}
    stats = {"compile_s": 0.0, "timing_s": 0.0, "choices": 0}
    smem = spec.shared_memory_per_block_optin
    from torch._inductor import config as inductor_config

    workers = max(1, int(getattr(inductor_config, "compile_threads", 15) or 15))

    def est(p: GroupedProblem) -> float:
        return estimate([p], smem, workers)["wall_s"]

    out = sweep(out_dir, problems, head,
                lambda p: run_problem(p, spec, bench, bench_aten, clock, settings, patches, known_bad, stats),
                settings, estimate_s=est, t0=t0)
    out.update({k: round(v, 1) if isinstance(v, float) else v for k, v in stats.items()})
    out["unsupported_dtypes"] = known_bad
    out["rows_per_min"] = round(out["rows"] / max(out["wall_s"], 1e-9) * 60, 1)
    return out


# ---------------------------------------------------------------------------------------------- the CLI

def add_parser(gsub: argparse._SubParsersAction) -> None:
    """`perfmodel gen grouped` (registered by data_gen/cli.py)."""
    d = GroupedSweepSettings()
    g = gsub.add_parser("grouped", help="Inductor's triton_grouped_mm template (its config list) and aten's "
                                        "_grouped_mm on MoE grouped GEMMs (Mixtral, Qwen-MoE, DeepSeek-V3, GPT-OSS)")
    g.add_argument("--out", type=Path, default=Path("data/h100"), help="dataset folder (resumes its grouped parts)")
    g.add_argument("--time-limit", type=float, default=None,
                   help="seconds: stop cleanly before a problem that would end past it")
    g.add_argument("--max-problems", type=int, default=None, help="stop after this many new problems")
    g.add_argument("--families", default=None, help=f"comma-separated, some of {','.join(FAMILIES)} (default all)")
    g.add_argument("--dtypes", default=None, help=f"comma-separated, some of {','.join(DTYPES)} (default both)")
    g.add_argument("--gemms", default=None, help=f"comma-separated, some of {','.join(GEMMS)} (default all)")
    g.add_argument("--per-expert", default=None, help=f"rows per expert to sweep, some of {TOKENS_ORDER} (default all)")
    g.add_argument("--layouts", choices=("natural", "both"), default=d.layouts,
                   help=f"B layouts: each family's own ({'/'.join(B_LAYOUTS)}) or both (default {d.layouts})")
    g.add_argument("--no-retime", action="store_true",
                   help="keep Inductor's timings (its even offsets) instead of re-timing each choice per routing")
    g.add_argument("--device-spec", default=None, help="datasheet spec name (default: matched from the GPU)")
    t = d.timing
    g.add_argument("--budget-ms", type=float, default=t.budget_ms, help="GPU ms of timed runs per choice")
    g.add_argument("--pre-sleep-us", type=float, default=t.pre_sleep_us, help="GPU spin before each timed run")
    g.add_argument("--dry-run", action="store_true", help="CPU: print the problem list, counts and an estimate")
    g.add_argument("--stats", type=Path, default=None, help="write the run's statistics (JSON) here")


def _split(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(x.strip() for x in text.split(",") if x.strip())


def settings_from_args(args: argparse.Namespace) -> GroupedSweepSettings:
    """Settings from the flags; ValueError naming the flag (checked before any GPU work)."""
    from .grouped import check_choice
    from .measure import TimingSettings

    if args.max_problems is not None and args.max_problems < 1:
        raise ValueError(f"--max-problems: must be >= 1, got {args.max_problems}")
    for flag, value in (("--time-limit", args.time_limit), ("--budget-ms", args.budget_ms)):
        if value is not None and not value > 0:
            raise ValueError(f"{flag}: must be > 0, got {value}")
    if not args.pre_sleep_us >= 0:
        raise ValueError(f"--pre-sleep-us: must be >= 0, got {args.pre_sleep_us}")
    sel = {}
    for name, allowed in (("families", tuple(FAMILIES)), ("dtypes", DTYPES), ("gemms", GEMMS)):
        try:
            sel[name] = check_choice(name, _split(getattr(args, name)), allowed)
        except ValueError as exc:
            raise ValueError(f"--{exc}") from None
    timing = TimingSettings(budget_ms=args.budget_ms, pre_sleep_us=args.pre_sleep_us)
    per_expert = None if args.per_expert is None else parse_per_expert(args.per_expert)
    return GroupedSweepSettings(**sel, per_expert=per_expert, layouts=args.layouts, max_problems=args.max_problems,
                                time_limit_s=args.time_limit, retime=not args.no_retime, timing=timing)


def dry_run(settings: GroupedSweepSettings, problems: list[GroupedProblem], smem_bytes: int = 232448,
            workers: int = 15, out=None) -> dict[str, Any]:
    """Print the problem list in sweep order with each one's expected template configs, and the counts."""
    out = sys.stdout if out is None else out
    todo = problems[:settings.max_problems] if settings.max_problems else problems
    for i, p in enumerate(todo):
        print(f"{i:5d} {problem_id(p)} {p.family:12s} G={p.g:<4d} {p.gemm:8s} {p.dtype:9s} {p.b_layout:7s} "
              f"tokens={p.tokens:<6d} M={p.total_m:<7d} K={p.k:<6d} N={p.n:<6d} "
              f"configs={len(expected_configs(p, smem_bytes))}", file=out)
    counts = {"problems": len(todo), "by_family": dict(Counter(p.family for p in todo)),
              "by_dtype": dict(Counter(p.dtype for p in todo)), "by_gemm": dict(Counter(p.gemm for p in todo)),
              "by_layout": dict(Counter(p.b_layout for p in todo)),
              "estimate_first_60": estimate(todo[:60], smem_bytes, workers)}
    print(json.dumps(counts, indent=2), file=out)
    return counts


def run_cli(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    problems = grouped_problems(settings.families, settings.dtypes, settings.gemms, settings.layouts, settings.budget,
                                settings.per_expert)
    if args.dry_run:
        dry_run(settings, problems)
        return 0
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("gen grouped: needs a CUDA GPU (none is visible; --dry-run runs on the CPU)")
    stats = run(args.out, args.device_spec, settings, problems)
    print(json.dumps(stats, indent=2))
    if args.stats:
        args.stats.write_text(json.dumps(stats, indent=2))
    return 0
