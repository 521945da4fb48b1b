"""One grouped-GEMM problem's measurement for the sweep (data_gen/grouped_sweep.py, whose run_problem compiles
the problem with Inductor and then calls these): the operands and the fp32 reference, the choices Inductor
benchmarked filed into rows (ProblemRows), each template choice re-timed with the project's protocol on each
routing through its benchmark request's run function, and aten's _grouped_mm timed eagerly. torch is
imported inside the functions (the CPU tests import this module)."""
from __future__ import annotations

import contextlib
import sys
from typing import Any

from .grouped import GroupedProblem, min_bytes, routing_stats, template_config


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)



# ---------------------------------------------------------------------------------------- operands

def make_operands(p: GroupedProblem, device):
    """A (total_m, k) row-major; B (G, k, n): a transposed view of a contiguous (G, n, k) for "kmajor"
    (transformers' `weight.transpose(-2, -1)`), contiguous for "nmajor". Scaled so outputs are O(1)."""
    import torch

    dt = {"bfloat16": torch.bfloat16, "float16": torch.float16}[p.dtype]
    a = torch.randn(p.total_m, p.k, device=device, dtype=dt)
    if p.b_layout == "kmajor":
        b = (torch.randn(p.g, p.n, p.k, device=device, dtype=dt) * p.k ** -0.5).transpose(-2, -1)
    else:
        b = torch.randn(p.g, p.k, p.n, device=device, dtype=dt) * p.k ** -0.5
    return a, b


def offsets(counts: list[int], device):
    import torch

    return torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)


def reference(a, b, counts: list[int]):
    """fp32 (tf32 off) out[rows of expert e] = A[rows] @ B[e], expert by expert."""
    import torch

    from .runtime import cublas_tf32

    ref = torch.empty(a.shape[0], b.shape[2], device=a.device, dtype=torch.float32)
    start = 0
    with cublas_tf32(False):
        for e, c in enumerate(counts):
            if c:
                torch.mm(a[start:start + c].float(), b[e].float(), out=ref[start:start + c])
            start += c
    return ref


# ------------------------------------------------------------------------------------------ choices

def choice_kind(choice: Any) -> str:
    """"triton" for a Triton template choice (it has a benchmark request with num_stages), "aten" for
    aten's _grouped_mm (an extern kernel), "other" for anything else (e.g. a CuTeDSL template)."""
    cls = type(choice).__name__
    if cls == "TritonTemplateCaller" and hasattr(getattr(choice, "bmreq", None), "num_stages"):
        return "triton"
    if cls == "ExternKernelCaller":
        return "aten"
    return "other"



def set_tma_allocator() -> None:
    """The template builds TMA descriptors in the kernel (tl.make_tensor_descriptor), which needs Triton's
    scratch allocator: Inductor's launcher sets one on each run (runtime/triton_heuristics.py); set the same
    here too, in case a launch path skips it."""
    import torch
    import triton

    if hasattr(triton, "set_allocator"):
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))



def finish(row: dict[str, Any], p: GroupedProblem, counts: list[int], ms: float, reps: int, err: float, spec,
           clock: float | None, stalls: int) -> dict[str, Any]:
    """A timed row: the physical-limit check at the measured clock (FLOPs, and bytes with only the experts
    that have rows read), and an output off the fp32 reference by more than the dtype's tolerance a failure."""
    from .measure import TOLERANCE, fraction_of_peak, validate

    frac = fraction_of_peak(p.flops, min_bytes(p, sum(c > 0 for c in counts)), ms, p.dtype, False, spec, clock)
    status, flag = validate(frac)
    if not err <= TOLERANCE[(p.dtype, False)]:
        status = "fail:wrong_result"
    return {**row, "status": status, "flag": flag, "ms": round(ms, 6), "reps": reps, "rel_err": float(f"{err:.3g}"),
            "frac_peak": round(frac, 5), "sm_clock_mhz": clock, "host_stalls": stalls}


def operand_as(meta: Any, t, copies: dict[tuple, Any]):
    """t itself where it has the layout the kernel was compiled for (the input's TensorMeta), else a copy of it
    in that layout (same sizes and dtype, the meta's strides), made once per layout."""
    import torch

    metas = meta if isinstance(meta, (list, tuple)) else [meta]
    m = metas[0]
    sizes, strides = tuple(m.sizes), tuple(m.strides)
    if sizes != tuple(t.shape) or m.dtype != t.dtype:
        raise RuntimeError(f"input meta {sizes} {m.dtype} differs from the operand {tuple(t.shape)} {t.dtype}")
    if strides == tuple(t.stride()):
        return t
    key = (id(t), strides)
    if key not in copies:
        copies[key] = torch.empty_strided(sizes, strides, dtype=t.dtype, device=t.device).copy_(t)
    return copies[key]


def make_run_fn(bmreq: Any, args: list, out):
    """bmreq.make_run_fn(*inputs, out=out): the output's keyword is `out` in torch 2.13, `output_tensor` in
    older torch; TypeError where neither."""
    import inspect

    params = inspect.signature(bmreq.make_run_fn).parameters
    for kw in ("out", "output_tensor"):
        if kw in params:
            return bmreq.make_run_fn(*args, **{kw: out})
    raise TypeError(f"make_run_fn{inspect.signature(bmreq.make_run_fn)}: no out / output_tensor keyword")



# ------------------------------------------------------------------------------------ a problem's rows

class ProblemRows:
    """The rows of one problem after Inductor's compile (data_gen/grouped_sweep.py run_problem's steps):
    sort() files the choices Inductor benchmarked, unbenchmarked() writes a failed row per config it did not
    benchmark, time_routings() re-times each template choice and times aten on every routing. rows: in the
    order the sweep writes them."""

    def __init__(self, p: GroupedProblem, spec, bench, bench_aten, clock, base: dict[str, Any],
                 routings: list[tuple[str, list[int]]], expected: list[tuple[int, int, int, int, int]],
                 exp_source: str) -> None:
        self.p, self.spec, self.bench, self.bench_aten, self.clock = p, spec, bench, bench_aten, clock
        self.base, self.routings, self.expected, self.exp_source = base, routings, expected, exp_source
        self.triton: dict[tuple, tuple[Any, float]] = {}  # config -> (its choice, Inductor's ms)
        self.aten_ind_ms: float | None = None
        self.rows: list[dict[str, Any]] = []

    def sort(self, timed: list[tuple[Any, float]]) -> None:
        """Inductor's (choice, ms): a template choice filed under its config (a failed row where its config
        cannot be read), aten's time kept for its rows, any other choice a row at Inductor's time."""
        base, routings = self.base, self.routings
        for ch, ms in timed:
            kind = choice_kind(ch)
            if kind == "triton":
                try:
                    info = ch.info_dict() if hasattr(ch, "info_dict") else {}
                    c = template_config(info, getattr(ch, "description", ""))
                except Exception as exc:  # noqa: BLE001
                    self.rows.append({**base, "kind": "other", "name": str(getattr(ch, "name", ""))[:80],
                                      "routing": "even_inductor", "timer": "inductor",
                                      "status": f"fail:parse:{exc}"[:160], "ms": None, "inductor_ms": None})
                    continue
                self.triton[(c["block_m"], c["block_n"], c["block_k"], c["num_stages"], c["num_warps"])] = (ch, ms)
            elif kind == "aten":
                self.aten_ind_ms = ms if ms == ms and ms < float("inf") else None
            else:
                ok = ms == ms and ms < float("inf")
                counts0 = routings[0][1]
                row = {**base, "kind": "other", "name": str(getattr(ch, "name", type(ch).__name__))[:80],
                       "description": str(getattr(ch, "description", ""))[:200], "routing": "even_inductor",
                       "timer": "inductor", "inductor_ms": ms if ok else None, **routing_stats(counts0)}
                self.rows.append({**row, "status": "ok", "ms": ms} if ok else
                                 {**row, "status": "fail:inductor_inf", "ms": None})

    def cfg_row(self, c: tuple, routing: str, counts: list[int], timer: str) -> dict[str, Any]:
        """A triton row's fields for config c on a routing, before its time."""
        ch_ms = self.triton.get(c)
        ind = ch_ms[1] if ch_ms and ch_ms[1] == ch_ms[1] and ch_ms[1] < float("inf") else None
        return {**self.base, "kind": "triton", "block_m": c[0], "block_n": c[1], "block_k": c[2], "num_stages": c[3],
                "num_warps": c[4], "config_source": self.exp_source if c in self.expected else "benchmarked",
                "routing": routing, "timer": timer, "inductor_ms": ind, **routing_stats(counts)}

    def unbenchmarked(self, compile_err: str) -> list[tuple]:
        """A failed row per config Inductor did not benchmark (its compile failed, or the whole compile did) or
        timed at inf; the configs left to re-time (Inductor's order, then any it added)."""
        triton, counts0 = self.triton, self.routings[0][1]
        unexpected = [k for k in triton if k not in set(self.expected)]
        if unexpected:
            log(f"  {len(unexpected)} benchmarked configs not in the expected list, e.g. {unexpected[0]}")
        configs = list(dict.fromkeys([*self.expected, *triton]))  # Inductor's order, then any it added
        for c in configs:
            if c not in triton:
                why = f"fail:compile:{compile_err}" if compile_err else "fail:not_benchmarked"
                self.rows.append({**self.cfg_row(c, "even_inductor", counts0, "inductor"), "status": why[:200],
                                  "ms": None})
            elif not triton[c][1] < float("inf"):
                self.rows.append({**self.cfg_row(c, "even_inductor", counts0, "inductor"),
                                  "status": "fail:inductor_inf", "ms": None})
        return [c for c in configs if c in triton and triton[c][1] < float("inf")]

    def time_routings(self, a, b, live: list[tuple], retime: bool) -> None:
        """Per routing: the live configs' choices re-timed (retime_triton) and aten's _grouped_mm timed
        (time_aten), against the routing's fp32 reference; where re-timing is off or this torch lacks the API,
        Inductor's times (its even offsets) stand in for the configs' rows. Then the run functions' cleanup."""
        import torch

        retime_err = "" if retime else "retime off"
        set_tma_allocator()
        for routing, counts in self.routings:
            offs = offsets(counts, self.bench.device)
            ref = reference(a, b, counts)
            ref_norm = torch.linalg.vector_norm(ref)
            if live and not retime_err:
                retime_err = self.retime_triton(live, routing, counts, (a, b, offs), ref, ref_norm)
            self.time_aten(routing, counts, (a, b, offs), ref, ref_norm)
            del ref
        if retime_err and live:  # Inductor's timings (its even offsets) stand in for ours
            for c in live:
                ind = self.triton[c][1]
                row = self.cfg_row(c, "even_inductor", self.routings[0][1], "inductor")
                self.rows.append({**row, "status": "ok", "ms": ind, "retime_error": retime_err[:160]})
        for ch, _ in self.triton.values():
            cleanup = getattr(getattr(ch, "bmreq", None), "cleanup_run_fn", None)
            if cleanup is not None:
                with contextlib.suppress(Exception):
                    cleanup()

    def retime_triton(self, live: list[tuple], routing: str, counts: list[int], operands: tuple, ref,
                      ref_norm) -> str:
        """The live configs' choices on one routing, through their benchmark requests' run functions (rows
        appended: timed, or a launch failure); the error that leaves the rows to Inductor's times (an API
        this torch lacks), "" where none."""
        import torch

        from .measure import relative_error

        bench = self.bench
        copies: dict[tuple, Any] = {}  # operands re-laid out to a choice's compiled layout, this routing
        out = None
        fns, first_runs, errs, pending = [], [], [], []
        for c in live:
            ch = self.triton[c][0]
            row = self.cfg_row(c, routing, counts, "perfmodel")
            try:  # the benchmark request's API (torch 2.11 and 2.13 differ in details)
                bm = ch.bmreq
                if out is None:
                    om = bm.output_tensor_meta
                    om = om[0] if isinstance(om, (list, tuple)) else om
                    out = torch.empty_strided(tuple(om.sizes), tuple(om.strides), dtype=om.dtype, device=bench.device)
                args = [operand_as(meta, t, copies) for meta, t in zip(bm.input_tensor_meta, operands)]
                fn = make_run_fn(bm, args, out)
            except (AttributeError, TypeError) as exc:  # an API this torch lacks: Inductor's timings stand
                retime_err = f"{type(exc).__name__}:{exc}"
                log(f"  re-timing unavailable ({retime_err}): rows keep Inductor's times")
                return retime_err
            if any(x is not y for x, y in zip(args, operands)):
                row["operand_copied"] = True  # Inductor compiled for another layout than the operands'
            try:
                fn()  # loads the module and the kernel: no timed run includes that
                out.fill_(float("nan"))  # poison: every element must be written
                first = bench.timed_run(fn)
            except Exception as exc:  # noqa: BLE001 -- a launch failure is a failure row
                self.rows.append({**row, "status": f"fail:launch:{type(exc).__name__}:{str(exc)[:100]}", "ms": None})
                continue
            errs.append(relative_error(out, ref, ref_norm))
            fns.append(fn)
            first_runs.append(first)
            pending.append(row)
        if fns:
            clocks: list[float | None] = []
            res = bench.time_many(fns, on_busy=lambda: clocks.append(self.clock.sm_clock_mhz()),
                                  first_runs=first_runs, peers=[True] * len(fns))
            stalls = list(bench.last_stalls)
            for row, (ms, reps), err, st in zip(pending, res, torch.stack(errs).tolist(), stalls):
                self.rows.append(finish(row, self.p, counts, ms, reps, err, self.spec, clocks[0] if clocks else None,
                                        st))
        return ""

    def time_aten(self, routing: str, counts: list[int], operands: tuple, ref, ref_norm) -> None:
        """aten's _grouped_mm on one routing, eager (its row: timed, or a failure such as a dtype aten lacks)."""
        import torch

        from .measure import relative_error

        a, b, offs = operands
        arow = {**self.base, "kind": "aten", "routing": routing, "timer": "perfmodel", "inductor_ms": self.aten_ind_ms,
                "counts": counts, **routing_stats(counts)}
        try:
            call = lambda offs=offs: torch._grouped_mm(a, b, offs=offs)  # noqa: E731
            err = relative_error(call(), ref, ref_norm)  # also the warm-up
            aclocks: list[float | None] = []
            (ms, reps), = self.bench_aten.time_many([call], on_busy=lambda: aclocks.append(self.clock.sm_clock_mhz()))
            self.rows.append(finish(arow, self.p, counts, ms, reps, float(err), self.spec,
                                    aclocks[0] if aclocks else None, self.bench_aten.last_stalls[0]))
        except Exception as exc:  # noqa: BLE001 -- e.g. a dtype aten lacks: a failure row
            self.rows.append({**arow, "status": f"fail:aten:{type(exc).__name__}:{str(exc)[:100]}", "ms": None})
