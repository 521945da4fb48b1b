"""Summary of a dataset folder (`perfmodel data info`)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from .bmm import KIND as BMM_KIND
from .shards import ONLY_KIND, STATIC_KIND, TUTORIAL_KIND, cublas_times, read_dataset


def dataset_info(folder: Path) -> dict[str, Any]:
    gemm, gemm_headers = read_dataset(folder, "gemm")
    pad, pad_headers = read_dataset(folder, "pad")
    bmm, bmm_headers = read_dataset(folder, BMM_KIND)
    headers = gemm_headers or pad_headers or bmm_headers
    ok = [r for r in gemm if r["kind"] == "triton" and r["status"] == "ok"]
    problems: dict[str, dict[str, Any]] = {}
    for r in gemm:
        problems.setdefault(r["unit"], r)
    retimed, retimed_headers = read_dataset(folder, "cublas")
    static, static_headers = read_dataset(folder, STATIC_KIND)
    only, only_headers = read_dataset(folder, ONLY_KIND)
    tutorial, tutorial_headers = read_dataset(folder, TUTORIAL_KIND)
    only_ok = [r for r in only if r["status"] == "ok"]
    static_ok = [r for r in static if r["kind"] == "triton" and r["status"] == "ok"]
    static_units = {r["unit"] for r in static}
    with_cublas = set(cublas_times(gemm, retimed))
    by_dtype = Counter(r["dtype"] for r in problems.values())
    fracs = [r["frac_peak"] for r in gemm if r.get("frac_peak") is not None and r["status"] == "ok"]
    fracs += [r["frac_peak"] for r in pad if r.get("frac_peak") is not None and r["status"] == "ok"]
    fracs += [r["frac_peak"] for r in static + only if r.get("frac_peak") is not None and r["status"] == "ok"]
    unaligned = sum(any(r[d] % 16 for d in ("m", "n", "k")) for r in problems.values())
    return {
        "device": headers[0]["device_name"] if headers else None,
        "device_spec": headers[0].get("device_spec") if headers else None,
        "gemm_rows": len(ok),
        "gemm_rows_all": sum(r["kind"] == "triton" for r in gemm),
        "gemm_failed_rows": sum(r["kind"] == "triton" and r["status"].startswith("fail") for r in gemm),
        "gemm_rejected_rows": sum(r["status"] == "rejected_peak" for r in gemm),
        "gemm_problems": len(problems),
        "gemm_problems_with_cublas": len(with_cublas & set(problems)),
        "cublas_retimed_problems": len({r["unit"] for r in retimed if r["status"] == "ok"} & set(problems)),
        "gemm_problems_by_dtype": dict(sorted(by_dtype.items())),
        "gemm_problems_tf32": sum(r["allow_tf32"] for r in problems.values()),
        "gemm_problems_unaligned16": unaligned,
        "gemm_problems_by_layout": dict(Counter(f"{'T' if r['transpose_left'] else 'N'}{'T' if r['transpose_right'] else 'N'}"
                                                for r in problems.values())),
        "gemm_max_flops": max((2.0 * r["m"] * r["n"] * r["k"] for r in problems.values()), default=None),
        "gemm_problems_above_1e12_flops": sum(2.0 * r["m"] * r["n"] * r["k"] > 1e12 for r in problems.values()),
        "kernel_modes": sorted({h.get("kernel_mode", "v3 (M, N not specialised; no mode recorded)")
                                for h in gemm_headers + pad_headers + retimed_headers + static_headers + only_headers
                                + tutorial_headers}),
        # rows timed with the static compile (Inductor's kernel mode) of some of the problems' configs
        "gemm_static_rows": len(static_ok),
        "gemm_static_problems": len(static_units),
        "gemm_static_problems_by_dtype": dict(sorted(Counter(
            ("tf32" if r["allow_tf32"] and r["dtype"] == "float32" else r["dtype"])
            for r in {r["unit"]: r for r in static}.values()).items())),
        # rows of the Triton tutorial's matmul (kernel="tutorial") on some of the problems
        "gemm_tutorial_rows": sum(r["status"] == "ok" for r in tutorial),
        "gemm_tutorial_problems": len({r["unit"] for r in tutorial}),
        "pad_rows": sum(r["status"] == "ok" for r in pad),
        "pad_rows_above_1e11_flops": sum(r["status"] == "ok" and 2.0 * r["padded_m"] * r["padded_n"] * r["padded_k"] > 1e11
                                         for r in pad),
        "pad_max_flops": max((2.0 * r["padded_m"] * r["padded_n"] * r["padded_k"] for r in pad), default=None),
        "pad_rows_by_dtype": dict(Counter(r["dtype"] for r in pad if r["status"] == "ok")),
        # torch.mm alone on problems of their own (perfmodel gen cublas-only), for the cuBLAS head
        "cublas_only_rows": len(only_ok),
        "cublas_only_rows_by_layout": dict(sorted(Counter(
            f"{'T' if r['transpose_left'] else 'N'}{'T' if r['transpose_right'] else 'N'}" for r in only_ok).items())),
        "cublas_only_dims_8_mod_16": sum(any(r[d] % 16 == 8 for d in ("m", "n", "k")) for r in only_ok),
        "cublas_only_rows_above_1e12_flops": sum(2.0 * r["m"] * r["n"] * r["k"] > 1e12 for r in only_ok),
        "max_fraction_of_peak": max(fracs) if fracs else None,
        "flagged_rows": sum(bool(r.get("flag")) for r in gemm + pad + static + only),
        "parts": len(gemm_headers) + len(pad_headers) + len(retimed_headers) + len(static_headers) + len(only_headers)
        + len(tutorial_headers),
        **bmm_info(bmm, bmm_headers),
    }


def bmm_info(rows: list[dict[str, Any]], headers: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts of the `bmm` parts (perfmodel gen bmm): problems, valid rows of each kind, and the spread."""
    problems: dict[str, dict[str, Any]] = {}
    for r in rows:
        problems.setdefault(r["unit"], r)
    triton = [r for r in rows if r["kind"] == "triton"]

    def mode(r: dict[str, Any]) -> str:
        return "tf32" if r["allow_tf32"] and r["dtype"] == "float32" else r["dtype"]

    return {
        "bmm_problems": len(problems),
        "bmm_rows": sum(r["status"] == "ok" for r in triton),
        "bmm_rows_all": len(triton),
        "bmm_failed_rows": sum(r["status"].startswith("fail") for r in triton),
        "bmm_rejected_rows": sum(r["status"] == "rejected_peak" for r in triton),
        "bmm_rows_by_source": dict(sorted(Counter(r["source"] for r in triton if r["status"] == "ok").items())),
        "bmm_aten_rows": sum(r["kind"] == "aten" and r["status"] == "ok" for r in rows),
        "bmm_aten_pad_rows": sum(r["kind"] == "aten_pad" and r["status"] == "ok" for r in rows),
        "bmm_problems_by_family": dict(sorted(Counter(r["family"] for r in problems.values()).items())),
        "bmm_problems_by_dtype": dict(sorted(Counter(mode(r) for r in problems.values()).items())),
        "bmm_problems_by_layout": dict(sorted(Counter(
            f"{'T' if r['transpose_left'] else 'N'}{'T' if r['transpose_right'] else 'N'}" for r in problems.values()).items())),
        "bmm_max_flops": max((2.0 * r["batch"] * r["m"] * r["n"] * r["k"] for r in problems.values()), default=None),
        "bmm_max_fraction_of_peak": max((r["frac_peak"] for r in rows if r["status"] == "ok"), default=None),
        "bmm_kernel_modes": sorted({h.get("kernel_mode") for h in headers}),
        "bmm_parts": len(headers),
    }
