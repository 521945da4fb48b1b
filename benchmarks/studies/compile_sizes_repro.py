"""GPU repro (python -m benchmarks.studies.compile_sizes_repro): compile sizes through Dynamo's mark_dynamic(specialize_on=...) on this torch, plain torch.compile and the set-up, each in a subprocess, the full exception chain printed (torch 2.11: DataDependentOutputException on the .item() of transformers' rotary attention_scaling, under Dynamo's masking AttributeError)."""
import os, subprocess, sys, traceback, json, inspect

CASES = ["plain", "plain-ro", "perfmodel", "perfmodel-nocg"]


def case(name):
    import torch
    from benchmarks import model_bench as mb
    wl = next(w for w in mb.WORKLOADS if w.name.startswith("Dynamic Llama"))
    dev = torch.device("cuda")
    torch.manual_seed(0)
    module, inputs, fwd = wl.build(dev)
    ins = {b: wl.inputs_at(dev, (b, 1)) for b in (8, 32, 16)}
    with torch.no_grad():
        refs = {b: mb._flat(fwd(module, *ins[b])).float() for b in ins}
    if name.startswith("plain"):
        kw = {"mode": "reduce-overhead"} if name == "plain-ro" else {}
        compiled = torch.compile(module, dynamic=True, **kw)
        def call(b):
            x = ins[b][0]
            if b > 1 and not getattr(x, "_m", False):
                torch._dynamo.mark_dynamic(x, 0, specialize_on=[lambda x: x == 8, lambda x: x == 32])
                x._m = True
            return fwd(compiled, *ins[b])
    else:
        from perfmodel.serve import compile as pc
        opts = {"triton.cudagraphs": False} if name.endswith("nocg") else None
        compiled = pc.compile(module, dynamic=True, sizes=[8, 32], specialize=True, pad=True, options=opts)
        def call(b):
            return fwd(compiled, *ins[b])
    with torch.no_grad():
        for b in (8, 32, 16, 8):
            for _ in range(3):
                torch.compiler.cudagraph_mark_step_begin()
                out = mb._flat(call(b)).float()
            err = ((out - refs[b]).norm() / refs[b].norm()).item()
            print(f"{name}: batch {b} ok rel_err {err:.4f}", flush=True)
    print("graphs", torch._dynamo.utils.counters["stats"].get("unique_graphs"))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        try:
            case(sys.argv[1])
            print("CASE PASSED", sys.argv[1])
        except BaseException:
            print("CASE FAILED", sys.argv[1])
            traceback.print_exc()
            e = sys.exc_info()[1]
            while e is not None:
                print("--- chained:", type(e).__name__, str(e)[:2000])
                e = e.__cause__ or e.__context__
        sys.exit(0)
    import torch
    print("torch", torch.__version__)
    try:
        from torch._inductor.lookup_table import choices as lc
        print(inspect.getsource(lc.LookupTableChoices._generate_kernel_inputs_key))
        print(inspect.getsource(lc.LookupTableChoices._entry_is_valid))
        from torch._inductor import config
        print("lookup_table config:", {k: getattr(config.lookup_table, k) for k in dir(config.lookup_table) if not k.startswith("_")})
        from torch._inductor.kernel.mm import mm_template
        from torch._inductor.kernel.bmm import bmm_template
        print("mm src_hash", getattr(mm_template, "src_hash", None), "bmm", getattr(bmm_template, "src_hash", None))
    except Exception:
        traceback.print_exc()
    for c in CASES:
        print("=" * 30, c, flush=True)
        subprocess.run([sys.executable, "-m", "benchmarks.studies.compile_sizes_repro", c], timeout=240)
