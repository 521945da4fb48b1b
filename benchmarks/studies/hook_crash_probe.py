"""GPU diagnostic: compile one fp16 mm under max-autotune with the Inductor hook installed, on one
backend, printing the choices the hook keeps (faulthandler on: a native crash prints its stack).

    python -X faulthandler benchmarks/studies/hook_crash_probe.py --backend onnx|torch [--space DEFAULT|EXHAUSTIVE]
"""
from __future__ import annotations

import argparse
import faulthandler
import sys



def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default=None)
    ap.add_argument("--space", default="DEFAULT")
    ap.add_argument("--shape", default="512,256,384")
    args = ap.parse_args()
    faulthandler.enable(all_threads=True)
    import torch
    from torch._inductor import config as ic

    import perfmodel.serve.choices as sc
    import perfmodel.serve.inductor as si
    from perfmodel.serve import Predictor

    pred = Predictor.load(backend=args.backend)
    print("backend", pred.backend, flush=True)
    real = sc.select  # what the installed handler calls, looked up per call

    def spy(choices, kernel_inputs, op_name, *a, **kw):
        print("filter called", op_name, len(choices), flush=True)
        kept = real(choices, kernel_inputs, op_name, *a, **kw)
        for c in kept:
            if si._uid(c) in si.TRITON_MM_TEMPLATES:
                print("  kept", si.kwargs_to_gemm(c.params.to_kwargs()), flush=True)
        return kept

    sc.select = spy
    m, k, n = (int(x) for x in args.shape.split(","))
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    with si.installed(top_k=3, predictor=pred) as ok, ic.patch(force_disable_caches=True,
                                                               max_autotune_gemm_search_space=args.space):
        print("installed", ok, flush=True)
        out = torch.compile(lambda x, y: torch.mm(x, y), mode="max-autotune-no-cudagraphs")(a, b)
    torch.testing.assert_close(out, a @ b, rtol=1e-2, atol=1e-2)
    print("OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
