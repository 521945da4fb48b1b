"""GPU: does Inductor's own mm template run what the runnable rule says it runs, and how slow are IEEE fp32 tiles
that spill? Each case compiled through torch.compile with a one-entry lookup table (the config alone; table_hits 1
when Inductor took it), max_autotune_gemm, Triton only, Inductor's caches off: ran or failed (Inductor's error names
Triton's required bytes), the error against a float64 torch.mm, the median time (triton.testing.do_bench), and the
rule's verdict and count (perfmodel.configs.fits with the problem, shared_memory_need).

    python -m benchmarks.studies.inductor_runnable_check OUT.json        # GPU
"""
from __future__ import annotations

import json
import sys

CASES = [  # m, n, k, dtype, (bm, bn, bk, stages, warps)
    (2047, 2047, 2047, "bfloat16", (128, 256, 64, 5, 8)),
    (2048, 2048, 2048, "bfloat16", (128, 256, 64, 5, 8)),
    (2047, 2047, 2047, "float16", (128, 256, 64, 4, 8)),
    (2048, 2048, 2048, "float16", (128, 256, 64, 4, 8)),
    (4095, 4097, 1000, "float16", (256, 128, 64, 5, 8)),
    (4096, 4096, 1024, "float16", (256, 128, 64, 5, 8)),
    (1023, 1025, 4095, "bfloat16", (128, 128, 128, 5, 8)),
    (1024, 1024, 4096, "bfloat16", (128, 128, 128, 5, 8)),
    # IEEE fp32 (TF32 off): the 128x256 tile that ranked first on the H200 and ran 5.2x the best, and others
    (1024, 1024, 4096, "float32", (128, 256, 64, 1, 8)),
    (1024, 1024, 4096, "float32", (128, 128, 32, 3, 4)),
    (1024, 1024, 4096, "float32", (128, 128, 32, 3, 8)),
    (1024, 1024, 4096, "float32", (64, 128, 32, 4, 4)),
    (1024, 1024, 4096, "float32", (64, 64, 32, 5, 4)),
    (1024, 1024, 4096, "float32", (128, 64, 32, 4, 4)),
]


def main(argv: list[str] | None = None) -> int:
    import torch
    from torch._inductor import config as ic
    from torch._inductor.lookup_table.choices import LookupTableChoices
    from torch._inductor.virtualized import V

    from perfmodel.configs import fits, shared_memory_need
    from perfmodel.devices import get_spec
    from perfmodel.schema import GemmConfig, GemmProblem
    from perfmodel.serve.plan import lookup_key, table_entry
    from perfmodel.serve.plan_trace import Operand

    torch.backends.cuda.matmul.allow_tf32 = False
    spec = get_spec("h200")
    path = (argv if argv is not None else sys.argv[1:])[0]

    class Counting(LookupTableChoices):
        hits = 0

        def lookup_template_configs(self, kernel_inputs, op_name, *args, **kwargs):
            found = super().lookup_template_configs(kernel_inputs, op_name, *args, **kwargs)
            Counting.hits += bool(found)
            return found

    out = []
    for m, n, k, dt, c in CASES:
        cfg = GemmConfig(c[0], c[1], c[2], 8, c[3], c[4])
        prob = GemmProblem(m=m, n=n, k=k, dtype=dt)
        rule = fits(cfg, dt, spec, prob)
        need = int(shared_memory_need(c[0], c[1], c[2], c[3], c[4], 4 if dt == "float32" else 2, dt == "float32",
                                      m, n, k, False, False))
        a = torch.randn(m, k, device="cuda", dtype=getattr(torch, dt))
        b = torch.randn(k, n, device="cuda", dtype=getattr(torch, dt))
        ops = [Operand(dt, (m, k), (k, 1)), Operand(dt, (k, n), (n, 1))]
        key = lookup_key(torch.cuda.get_device_properties(0).gcnArchName, ops, (), "mm")
        table = {key: [table_entry("triton::mm", cfg, k)]}
        rec = {"m": m, "n": n, "k": k, "dtype": dt, "config": c, "rule_runnable": rule, "rule_need_bytes": need}
        torch._dynamo.reset()
        prior = V.choices
        Counting.hits = 0
        try:
            opts = {"lookup_table.table": table, "max_autotune_gemm": True, "max_autotune_gemm_backends": "TRITON",
                    "force_disable_caches": True}
            with ic.patch(opts):
                V.set_choices_handler(Counting())
                f = torch.compile(torch.mm, dynamic=False)
                y = f(a, b)
                torch.cuda.synchronize()
            ref = torch.mm(a.double(), b.double())
            rec["ran"] = True
            from triton.testing import do_bench
            rec["ms"] = float(do_bench(lambda: f(a, b), warmup=25, rep=100, return_mode="median"))
            rec["rel_err"] = float((y.float() - ref.float()).norm() / ref.float().norm())
        except Exception as e:
            rec["ran"] = False
            rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            V.set_choices_handler(prior)
            rec["table_hits"] = Counting.hits
        print(json.dumps(rec), flush=True)
        out.append(rec)
    json.dump(out, open(path, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
