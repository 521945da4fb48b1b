"""GPU: check a device's DeviceSpec (perfmodel/devices.py) against what the card reports and measures.

Reads the live properties (torch: name, SMs, memory, L2, shared memory; NVML: max SM/memory clocks,
driver) and measures two rates: DRAM bandwidth with a large device-to-device copy (read + write bytes)
and the TFLOP/s of large GEMMs through torch.mm (bf16 and fp16 by default), with the SM clock read
through NVML while each GEMM runs. Each figure is set beside the spec's: the reported properties must
equal it, a measured rate must stay under the spec's peak (at the measured clock for FLOP/s).
    python -m benchmarks.device_probe [--spec h200] [--out benchmarks/results/device_probe_h200.json]
Writes the JSON and a markdown table beside it (.md). Needs a CUDA GPU; --self-test runs the report
on made-up numbers, without a GPU (the tests do that).
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks import RESULTS

from perfmodel.devices import DeviceSpec, get_spec, live_device_info, match_spec

DTYPES = ("bfloat16", "float16")


def _events_ms(fn, reps: int) -> list[float]:
    """CUDA-event times of `reps` back-to-back calls, one event pair each, after a warm-up call."""
    import torch

    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return out


class _ClockSampler:
    """The SM clock read through NVML every few ms while a measurement runs (None without NVML)."""

    def __init__(self) -> None:
        from perfmodel.devices import ClockReader

        self.reader, self.samples, self._stop = ClockReader(), [], threading.Event()

    def __enter__(self) -> "_ClockSampler":
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            c = self.reader.sm_clock_mhz()
            if c is not None:
                self.samples.append(c)
            time.sleep(0.005)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._t.join()

    def median(self) -> float | None:
        s = sorted(self.samples)
        return s[len(s) // 2] if s else None


def measure_bandwidth(gib: float, reps: int) -> dict[str, Any]:
    """A copy of `gib` GiB between two device buffers: (read + write) bytes / time, best and median."""
    import torch

    n = int(gib * 2**30) // 4
    src = torch.empty(n, dtype=torch.float32, device="cuda").fill_(1.0)
    dst = torch.empty_like(src)
    ms = sorted(_events_ms(lambda: dst.copy_(src), reps))
    moved = 2 * n * 4
    del src, dst
    torch.cuda.empty_cache()
    return {"copy_gib": gib, "reps": reps, "ms_best": ms[0], "ms_median": ms[len(ms) // 2],
            "gbs_best": moved / (ms[0] * 1e-3) / 1e9, "gbs_median": moved / (ms[len(ms) // 2] * 1e-3) / 1e9}


def measure_gemm(dtype: str, size: int, reps: int) -> dict[str, Any]:
    """torch.mm of size^3 in dtype: TFLOP/s (best and median run) and the SM clock while it ran."""
    import torch

    dt = getattr(torch, dtype)
    a = torch.randn(size, size, device="cuda", dtype=dt)
    b = torch.randn(size, size, device="cuda", dtype=dt)
    with _ClockSampler() as clock:
        ms = sorted(_events_ms(lambda: torch.mm(a, b), reps))
    flop = 2.0 * size ** 3
    return {"dtype": dtype, "m": size, "n": size, "k": size, "reps": reps, "ms_best": ms[0],
            "ms_median": ms[len(ms) // 2], "tflops_best": flop / (ms[0] * 1e-3) / 1e12,
            "tflops_median": flop / (ms[len(ms) // 2] * 1e-3) / 1e12, "sm_clock_mhz_median": clock.median(),
            "sm_clock_samples": len(clock.samples)}


def live_properties() -> dict[str, Any]:
    """live_device_info (the shard headers' fields) plus the properties a spec is checked on."""
    import torch

    props = torch.cuda.get_device_properties(0)
    info = live_device_info(0)
    info.update({"shared_memory_per_multiprocessor": getattr(props, "shared_memory_per_multiprocessor", None),
                 "regs_per_multiprocessor": getattr(props, "regs_per_multiprocessor", None),
                 "max_threads_per_multi_processor": getattr(props, "max_threads_per_multi_processor", None)})
    return info


def compare(spec: DeviceSpec, live: dict[str, Any], bandwidth: dict[str, Any] | None,
            gemms: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per checked figure: the spec's value, the live one, and whether they agree (reported
    properties: equal; measured rates: under the spec's peak)."""
    rows = []

    def prop(name: str, want: Any, got: Any) -> None:
        rows.append({"figure": name, "spec": want, "live": got, "kind": "reported",
                     "ok": None if got is None else float(want) == float(got)})

    prop("sm_count", spec.sm_count, live.get("sm_count"))
    prop("max_sm_clock_mhz", spec.max_sm_clock_mhz, live.get("max_sm_clock_mhz"))
    prop("l2_bytes", spec.l2_bytes, live.get("l2_bytes"))
    prop("shared_memory_per_block_optin", spec.shared_memory_per_block_optin, live.get("shared_memory_per_block_optin"))
    if bandwidth is not None:
        got = bandwidth["gbs_best"]
        rows.append({"figure": "dram_bw_gbs (copy, read + write)", "spec": spec.dram_bw_gbs, "live": got,
                     "kind": "measured", "fraction_of_spec": got / spec.dram_bw_gbs, "ok": got <= spec.dram_bw_gbs})
    for g in gemms:
        clock = g.get("sm_clock_mhz_median")
        peak = spec.peak_flops(g["dtype"], sm_clock_mhz=clock) / 1e12
        got = g["tflops_best"]
        rows.append({"figure": f"{g['dtype']} GEMM {g['m']}^3 TFLOP/s", "spec": peak, "live": got, "kind": "measured",
                     "at_sm_clock_mhz": clock if clock is not None else spec.max_sm_clock_mhz,
                     "fraction_of_spec": got / peak, "ok": got <= peak})
    return rows


def markdown(result: dict[str, Any]) -> str:
    live, spec = result["live"], result["spec"]
    lines = [f"# Device probe: {live.get('device_name')} against spec `{spec['name']}`", "",
             f"torch {live.get('torch')}, CUDA {live.get('cuda')}, driver {live.get('driver')}; "
             f"{live.get('total_memory', 0) / 1e9:.1f} GB memory; shared memory per SM "
             f"{live.get('shared_memory_per_multiprocessor')} bytes.", "",
             "| figure | spec | live | fraction of spec | agrees |", "|---|---:|---:|---:|---|"]
    for r in result["comparison"]:
        frac = f"{r['fraction_of_spec']:.3f}" if "fraction_of_spec" in r else ""
        live_v = "—" if r["live"] is None else f"{r['live']:.6g}"
        ok = {True: "yes", False: "**no**", None: "not reported"}[r["ok"]]
        lines.append(f"| {r['figure']} | {r['spec']:.6g} | {live_v} | {frac} | {ok} |")
    lines += ["", "Reported properties must equal the spec; a measured rate must stay under the spec's peak "
              "(FLOP/s at the SM clock NVML read during the GEMM). Regenerate: "
              f"`{result['command']}`."]
    return "\n".join(lines) + "\n"


def _self_test_result(spec: DeviceSpec) -> dict[str, Any]:
    """Made-up live numbers in the probe's format (no GPU): for tests of compare() and markdown()."""
    live = {"device_name": f"(self-test) {spec.marketing_name}", "sm_count": spec.sm_count, "max_sm_clock_mhz": 1755,
            "l2_bytes": spec.l2_bytes, "shared_memory_per_block_optin": spec.shared_memory_per_block_optin,
            "total_memory": 0, "torch": None, "cuda": None, "driver": None, "shared_memory_per_multiprocessor": None}
    bw = {"gbs_best": 0.9 * spec.dram_bw_gbs}
    gemms = [{"dtype": "bfloat16", "m": 8192, "n": 8192, "k": 8192, "tflops_best": 1.2 * spec.peak_flops("bfloat16") / 1e12,
              "sm_clock_mhz_median": 1500.0}]
    return {"self_test": True, "live": live, "bandwidth": bw, "gemms": gemms}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default=None, help="spec name to check (default: the one matching the live GPU)")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON result (default benchmarks/results/device_probe_<spec>.json); a .md beside it")
    ap.add_argument("--copy-gib", type=float, default=4.0, help="size of the bandwidth copy, GiB")
    ap.add_argument("--gemm-size", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--dtypes", default=",".join(DTYPES), help="GEMM dtypes, comma-separated")
    ap.add_argument("--self-test", action="store_true", help="no GPU: the report on made-up numbers")
    args = ap.parse_args(argv)
    command = "python -m benchmarks.device_probe" + (f" --spec {args.spec}" if args.spec else "")
    if args.self_test:
        spec = get_spec(args.spec or "h200")
        result = _self_test_result(spec)
    else:
        import torch

        if not torch.cuda.is_available():
            print("device_probe: no CUDA GPU visible (use --self-test to check the report without one)", file=sys.stderr)
            return 2
        live = live_properties()
        if args.spec:
            spec = get_spec(args.spec)
        else:
            spec = match_spec(live["device_name"], live["sm_count"])
            if spec is None:
                print(f"device_probe: no spec matches {live['device_name']!r}; pass --spec", file=sys.stderr)
                return 2
        bw = measure_bandwidth(args.copy_gib, args.reps)
        gemms = [measure_gemm(d, args.gemm_size, args.reps) for d in args.dtypes.split(",") if d]
        result = {"self_test": False, "live": live, "bandwidth": bw, "gemms": gemms}
    result.update({"spec": spec.as_dict(), "command": command,
                   "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    result["comparison"] = compare(spec, result["live"], result["bandwidth"], result["gemms"])
    text = markdown(result)
    print(text)
    out = args.out or RESULTS / f"device_probe_{spec.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    out.with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
