"""Prints what the serving hooks rely on in the installed torch/triton (run on the GPU machine):
the InductorChoices hook signatures, pad_mm's entry points and Inductor's default mm config list."""
from __future__ import annotations

import inspect
import json

import torch


def main() -> None:
    out: dict = {"torch": torch.__version__}
    import triton

    out["triton"] = triton.__version__
    from torch._inductor import choices

    for name in ("_finalize_template_configs", "get_template_configs", "get_mm_configs"):
        fn = getattr(choices.InductorChoices, name, None)
        out[f"InductorChoices.{name}"] = str(inspect.signature(fn)) if fn else None
    from torch._inductor.fx_passes import pad_mm

    out["pad_mm"] = {n: str(inspect.signature(getattr(pad_mm, n))) for n in
                     ("should_pad", "should_pad_bench", "should_pad_mm_bf16", "get_alignment_size") if hasattr(pad_mm, n)}
    try:
        import torch._inductor.template_heuristics.triton as th

        for cname in ("BaseConfigHeuristic", "CUDAConfigHeuristic"):
            try:
                obj = getattr(th, cname)()  # mm_configs is an instance attribute
                out.setdefault("mm_configs", {})[cname] = [
                    [c.block_m, c.block_n, c.block_k, getattr(c, "group_m", 8), c.num_stages, c.num_warps]
                    for c in obj.mm_configs]
            except Exception as exc:
                out.setdefault("mm_configs_errors", {})[cname] = repr(exc)
    except ImportError as exc:
        out["template_heuristics"] = repr(exc)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
