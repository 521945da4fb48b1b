"""GPU: the Triton source Inductor generates for its mm template on a few shapes (max-autotune, Triton
only, static shapes, pad_mm off), to read next to the dataset kernel (data_gen/kernel.py) where
benchmarks/studies/kernel_fidelity.py finds their config orders differ.

    python -m benchmarks.studies.dump_template --out DIR
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.studies.kernel_fidelity import SHAPES, operands

NAMES = ("fp16 odd 4095x4097x1000 TN", "tf32 2048^3", "fp32 2048x2048x512 TN", "fp16 bert ffn up")


def main(argv: list[str] | None = None) -> int:
    import torch
    from torch._inductor import config as ind_config
    from torch._inductor.utils import fresh_inductor_cache, run_and_get_code

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", action="append", default=None)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, M, K, N, mode, tl_, tr in SHAPES:
        if name not in (args.only or NAMES):
            continue
        a, b = operands(M, K, N, mode, tl_, tr)
        torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
        with fresh_inductor_cache(), ind_config.patch(max_autotune=True, max_autotune_gemm=True, shape_padding=False,
                                                      max_autotune_gemm_backends="TRITON"):
            torch._dynamo.reset()
            _, codes = run_and_get_code(torch.compile(torch.mm, dynamic=False), a, b)
        path = args.out / (name.replace(" ", "_").replace("^", "p") + ".py")
        path.write_text(f"# {name}: M={M} K={K} N={N} {mode} A {'T' if tl_ else 'N'} B {'T' if tr else 'N'}\n"
                        + "\n\n".join(codes))
        print(name, "->", path, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
