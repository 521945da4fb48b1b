"""Serving subcommands: `perfmodel rank`, `perfmodel pad`, `perfmodel export-onnx`, `perfmodel plan`.

Dimensions are handed to the schema as typed (an int, else a float, else the text), so that every bad
value is rejected by GemmProblem/PadProblem with the same one-line message as the Python API.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NoReturn


def _dim(text: str) -> Any:
    """'64' -> 64, '2.5' -> 2.5, 'nan' -> nan, 'x' -> 'x': the schema names what is wrong."""
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _one_line_errors(parser: argparse.ArgumentParser, command: str) -> None:
    # argparse prints the whole usage block before its error; a script wants one line and exit 2.
    def error(message: str) -> NoReturn:
        print(f"perfmodel {command}: error: {message}", file=sys.stderr)
        sys.exit(2)

    parser.error = error  # type: ignore[method-assign]


def _model_args(p: argparse.ArgumentParser, backend: bool = True, model_help: str | None = None) -> None:
    p.add_argument("--model", default=None,
                   help=model_help or "model folder or MLflow URI (models:/name@alias); default: the shipped models/h100")
    if backend:
        p.add_argument("--backend", choices=("torch", "onnx"), default=None,
                       help="default: the fastest available (onnx when onnxruntime imports)")
    p.add_argument("--device", default=None,
                   help="device spec to predict for, one the model was trained for (default: the visible GPU's "
                        "when the model knows it, else the model's default device)")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    rank = sub.add_parser("rank", help="rank Triton GEMM configs for a problem with the model")
    for name in ("m", "n", "k"):
        rank.add_argument(f"--{name}", type=_dim, required=True)
    rank.add_argument("--dtype", default="float16", help="float16, bfloat16 or float32")
    rank.add_argument("--allow-tf32", action="store_true", help="float32 inputs use tf32 tensor cores")
    rank.add_argument("--kernel", choices=("autotune", "inductor", "tutorial"), default="autotune",
                      help="the dataset's kernel (Inductor's template body) as a @triton.autotune user compiles it "
                           "(default), the template as Inductor compiles it (inductor: needs the model's config network "
                           "or inductor head), or the Triton tutorial's matmul (tutorial: needs its tutorial head)")
    rank.add_argument("--transpose-left", action="store_true", help="A stored column-major")
    rank.add_argument("--transpose-right", action="store_true", help="B stored column-major")
    rank.add_argument("--batch", type=_dim, default=1,
                      help="a batched GEMM (torch.bmm) of this many products: Inductor's bmm template and aten::bmm, "
                           "ranked by the model's bmm heads (default 1: torch.mm)")
    rank.add_argument("--top-k", type=_dim, default=5)
    _model_args(rank)
    rank.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _one_line_errors(rank, "rank")

    pad = sub.add_parser("pad", help="predict whether padding a GEMM's operands pays off")
    for name in ("m", "k", "n"):
        pad.add_argument(f"--{name}", type=_dim, required=True)
    pad.add_argument("--dtype", default="float16", help="float16, bfloat16 or float32")
    for flag, what in (("--allow-tf32", "float32 inputs use tf32"), ("--transpose-left", "A column-major"),
                       ("--transpose-right", "B column-major"), ("--prepadded-left", "A's pad is free"),
                       ("--prepadded-right", "B's pad is free")):
        pad.add_argument(flag, action="store_true", help=what)
    _model_args(pad)
    pad.add_argument("--json", action="store_true")
    _one_line_errors(pad, "pad")

    exp = sub.add_parser("export-onnx", help="write a model folder's ONNX files (all heads, one graph each: "
                                             "model.onnx, and model.<device>.onnx for a model's other devices)")
    _model_args(exp, backend=False, model_help="the model folder to export (default with --out: the shipped models/h100). "
                                               "Without --out, its own ONNX files are rewritten in place")
    exp.add_argument("--out", type=Path, default=None,
                     help="output file (default: each trained device's file in the --model folder: model.onnx for the "
                          "default device, model.<device>.onnx for the others); one of --out and --model is needed")
    exp.add_argument("--screen-keep", type=int, default=None,
                     help="also set the folder's screen_keep (configs per problem that the gemm head scores after "
                          "the screen; metadata.json) before exporting the ranking graphs traced with it (every "
                          "trained device's file in the folder)")
    exp.add_argument("--lead-keep", type=int, default=None,
                     help="also set the folder's lead_keep (of the screen's screen_keep, how many the gemm ensemble's "
                          "first member passes on to the whole ensemble; 0: none; metadata.json), as --screen-keep")
    _one_line_errors(exp, "export-onnx")
    _add_plan(sub)


def _add_plan(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="decide every GEMM without a GPU and write Inductor's lookup table "
                                    "(perfmodel.serve.plan: no benchmark at compile time)")
    p.add_argument("--gemm", action="append", default=[], metavar="OP:DIMS",
                   help="mm:M,N,K, addmm:M,N,K (1-D bias) or bmm:B,M,N,K, row-major operands; repeatable")
    p.add_argument("--model-fn", default=None, metavar="PKG.MOD:FACTORY",
                   help="an importable factory returning (model, example_inputs): its forward's GEMMs, traced on "
                        "fake tensors (a model built on the meta device works)")
    p.add_argument("--dtype", default="bfloat16", help="the --gemm operands' dtype: float16, bfloat16 or float32")
    p.add_argument("--device", default="h100", help="the device planned for: h100 or h200 (the shipped models)")
    p.add_argument("--model", default=None, help="model folder (default: the shipped one for --device)")
    p.add_argument("--device-name", default="",
                   help="the key's device part as torch names the card (default: the --device's, e.g. "
                        "'NVIDIA H100 80GB HBM3'); 'none': device-agnostic keys")
    p.add_argument("--no-template-hash", action="store_true",
                   help="leave out the installed torch's template source hashes (Inductor then skips its check)")
    p.add_argument("--out", type=Path, default=None, help="write the lookup table (JSON) here")
    p.add_argument("--json", action="store_true", help="print the table JSON instead of the decisions table")
    _one_line_errors(p, "plan")


def _plan(args: argparse.Namespace) -> int:
    from .plan import plan

    name = None if args.device_name.lower() == "none" else args.device_name
    p = _noted(lambda: plan(args.gemm, model_fn=args.model_fn, device=args.device, dtype=args.dtype,
                            model_dir=args.model, device_name=name, template_hash=not args.no_template_hash))
    if args.out is not None:
        p.write(args.out)
    print(json.dumps(p.table, indent=2) if args.json else p.text())
    if args.out is not None:
        print(f"wrote {args.out} ({len(p.table)} keys)", file=sys.stderr)
    return 0


def _tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def _tf32_note(args: argparse.Namespace, dtype: str) -> None:
    """--allow-tf32 on float16 / bfloat16: ignored (TF32 is a mode of float32 matmuls; GemmProblem reads it
    back False), said on stderr so that --json output stays JSON."""
    if args.allow_tf32 and dtype != "float32":
        print(f"note: --allow-tf32 ignored: TF32 applies to float32 only, not {dtype}", file=sys.stderr)


def _noted(fn: Any) -> Any:
    """fn() with the model's warnings that a problem is outside the shapes it was trained on
    (perfmodel.domain.OutsideDomainWarning) printed as notes on stderr."""
    import warnings

    from perfmodel.domain import OutsideDomainWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", OutsideDomainWarning)
        out = fn()
    for w in caught:
        if issubclass(w.category, OutsideDomainWarning):
            print(f"note: {w.message}", file=sys.stderr)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return out


def _rank(args: argparse.Namespace) -> int:
    from perfmodel import GemmProblem

    from .predictor import Predictor

    prob = GemmProblem(m=args.m, n=args.n, k=args.k, dtype=args.dtype, allow_tf32=args.allow_tf32,
                       transpose_left=args.transpose_left, transpose_right=args.transpose_right, batch=args.batch)
    _tf32_note(args, prob.dtype)
    p = Predictor.load(args.model, backend=args.backend, device=args.device, kernel=args.kernel)
    # the verdict is Candidates.prefer_cublas: cublas_ms below the best config's time, both printed below
    cand = _noted(lambda: p.candidates(prob, top_k=args.top_k, margin=0.0, max_k=args.top_k))
    rows = [{"rank": i + 1, **c.as_dict(), "predicted_ms": ms, "tflops": _tflops(prob.flops, ms)}
            for i, (c, ms) in enumerate(zip(cand.configs, cand.predicted_ms))]
    if args.json:
        out = {"problem": prob.as_dict(), "model": p.source, "backend": p.backend, "kernel": p.kernel, "device": p.spec.name,
               "configs": rows, "cublas_ms": cand.cublas_ms,
               "cublas_tflops": None if cand.cublas_ms is None else _tflops(prob.flops, cand.cublas_ms),
               "prefer_cublas": cand.prefer_cublas}
        print(json.dumps(out, indent=2))
        return 0
    flags = [f for f in ("allow_tf32", "transpose_left", "transpose_right") if getattr(prob, f)]
    batch = f"{prob.batch} x " if prob.batch > 1 else ""
    print(f"{batch}{prob.m} x {prob.n} x {prob.k} {prob.dtype}{' ' + ' '.join(flags) if flags else ''} "
          f"on {p.spec.name} ({p.source}, {p.backend}" + (f", kernel {p.kernel})" if p.kernel != "autotune" else ")"))
    head = f"{'rank':>4}  {'BLOCK_M':>7} {'BLOCK_N':>7} {'BLOCK_K':>7} {'GROUP_M':>7} {'stages':>6} {'warps':>5}" \
           f"  {'pred ms':>10} {'TFLOP/s':>8}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['rank']:>4}  {r['block_m']:>7} {r['block_n']:>7} {r['block_k']:>7} {r['group_m']:>7} "
              f"{r['num_stages']:>6} {r['num_warps']:>5}  {r['predicted_ms']:>10.4f} {r['tflops']:>8.1f}")
    aten = "aten::bmm" if prob.batch > 1 else "cuBLAS (torch.mm)"
    if cand.cublas_ms is None:
        print(f"{aten}: the model has no cuBLAS head")
    else:
        verdict = "faster than the best Triton config" if cand.prefer_cublas else "slower than the best Triton config"
        print(f"{aten} predicted: {cand.cublas_ms:.4f} ms ({_tflops(prob.flops, cand.cublas_ms):.1f} "
              f"TFLOP/s), {verdict}")
    return 0


def _pad(args: argparse.Namespace) -> int:
    from perfmodel import PadProblem

    from .predictor import Predictor

    pp = PadProblem(m=args.m, k=args.k, n=args.n, dtype=args.dtype, transpose_left=args.transpose_left,
                    transpose_right=args.transpose_right, prepadded_left=args.prepadded_left,
                    prepadded_right=args.prepadded_right, allow_tf32=args.allow_tf32)
    _tf32_note(args, pp.dtype)
    p = Predictor.load(args.model, backend=args.backend, device=args.device)
    d = _noted(lambda: p.pad(pp))
    pm, pk, pn = pp.padded_dims()
    if args.json:
        print(json.dumps({"problem": pp.as_dict(), "padded_dims": {"m": pm, "k": pk, "n": pn},
                          "needs_padding": pp.needs_padding(), "should_pad": d.should_pad, "orig_ms": d.orig_ms,
                          "padded_ms": d.padded_ms, "threshold": p.pad_threshold, "model": p.source,
                          "backend": p.backend}, indent=2))
        return 0
    print(f"{pp.m} x {pp.k} x {pp.n} {pp.dtype} (padded {pm} x {pk} x {pn}) on {p.spec.name}")
    print(f"  torch.mm as is : {d.orig_ms:.4f} ms predicted")
    print(f"  padded + mm    : {d.padded_ms:.4f} ms predicted")
    if not pp.needs_padding():
        print("  already aligned: nothing to pad")
    else:
        print(f"  pad: {'yes' if d.should_pad else 'no'} (pads when padded x {p.pad_threshold:g} < as is)")
    return 0


def _record_export(meta: dict[str, Any], args: argparse.Namespace, seconds: float) -> dict[str, Any]:
    """meta with this export appended to the folder's build record (a refit step: the folder's ONNX changed)."""
    import sys

    from perfmodel.artifact import append_step, step_record

    settings = {k: getattr(args, k) for k in ("device", "screen_keep", "lead_keep") if getattr(args, k) is not None}
    command = " ".join(["perfmodel", *sys.argv[1:]]) if sys.argv[1:2] == ["export-onnx"] else "perfmodel export-onnx"
    return append_step(meta, step_record("export-onnx", settings, seconds, refit=True, command=command))


def _export_onnx(args: argparse.Namespace) -> int:
    import time

    from perfmodel.artifact import METADATA, load, onnx_file
    from perfmodel.onnx_export import export_onnx, export_onnx_all

    from perfmodel.locations import default_model_dir

    from .loading import _is_mlflow_uri

    if args.model is not None and _is_mlflow_uri(str(args.model)):
        raise ValueError("--model: export-onnx needs a model folder (download the MLflow artifacts first)")
    # it writes only where told: never the shipped folder in place by default (on a wheel install, site-packages)
    if args.model is None and args.out is None:
        raise ValueError("--out: say where to write: --out FILE, or --model FOLDER to rewrite that folder's own ONNX files")
    if args.model is None and (args.screen_keep is not None or args.lead_keep is not None):
        raise ValueError("--model: --screen-keep and --lead-keep rewrite a model folder's ONNX files and metadata; "
                         "name the folder with --model FOLDER")
    folder = Path(args.model) if args.model is not None else default_model_dir()
    t0 = time.perf_counter()
    bundle = load(folder)
    if args.screen_keep is not None or args.lead_keep is not None:
        return _export_keeps(args, folder, bundle, t0)
    if args.device is not None:  # one device's file
        bundle = bundle.for_device(args.device)
        outs = [export_onnx(bundle, args.out or folder / onnx_file(bundle))]
    elif args.out is not None:   # the default device's, elsewhere
        outs = [export_onnx(bundle, args.out)]
    else:                        # every trained device's, in the folder
        outs = export_onnx_all(bundle, folder)
    if any(out.resolve().parent == folder.resolve() for out in outs):  # the folder changed: its record says so
        meta = json.loads((folder / METADATA).read_text())
        (folder / METADATA).write_text(json.dumps(_record_export(meta, args, time.perf_counter() - t0),
                                                  indent=2, sort_keys=True))
    for out in outs:
        print(f"wrote {out}")
    return 0


def _export_keeps(args: argparse.Namespace, folder: Path, bundle: Any, t0: float) -> int:
    """export-onnx --screen-keep / --lead-keep: they are the folder's (metadata.json, one for all its
    devices), so every trained device's ONNX file in the folder is re-traced with them -- none left with the
    old ones, which the loader would refuse as stale -- and only those files: no --out elsewhere, no single
    --device of a model of several. The graphs are written first (beside, then renamed), the metadata
    last: a failed export leaves the folder as it was."""
    import os
    import time

    from perfmodel.artifact import METADATA, check_lead_keep, onnx_file
    from perfmodel.onnx_export import export_onnx

    flag = "--screen-keep" if args.screen_keep is not None else "--lead-keep"
    if args.screen_keep is not None and args.screen_keep < 1:
        raise ValueError(f"--screen-keep: must be >= 1, got {args.screen_keep}")
    keep = bundle.screen_keep if args.screen_keep is None else args.screen_keep
    lead_keep = bundle.lead_keep if args.lead_keep is None else args.lead_keep
    if args.lead_keep is None and lead_keep >= keep:  # a smaller screen_keep drops a lead it no longer fits
        lead_keep = 0
    try:
        check_lead_keep(bundle, lead_keep, keep)
    except ValueError as exc:
        raise ValueError(f"--{exc}".replace("--lead_keep", "--lead-keep", 1)) from None
    own = [folder / onnx_file(bundle, d) for d in bundle.devices]
    if args.out is not None and (len(own) > 1 or args.out.resolve() != own[0].resolve()):
        raise ValueError(f"{flag}: rewrites the folder's own metadata, so it exports only to the folder's "
                         f"own ONNX files ({', '.join(p.name for p in own)}), not --out")
    if args.device is not None:
        bundle.for_device(args.device)  # an unknown device is refused as without the flag
        if len(own) > 1:
            raise ValueError(f"{flag}: the folder's screen_keep and lead_keep hold for all its devices, so every "
                             "device's ONNX file is re-exported: leave out --device")
    meta = json.loads((folder / METADATA).read_text())
    meta["screen_keep"] = bundle.metadata["screen_keep"] = keep
    meta["lead_keep"] = bundle.metadata["lead_keep"] = lead_keep
    tmps = []
    try:
        for d, out in zip(bundle.devices, own):
            tmp = out.with_name(f".{out.name}.tmp")
            tmps.append(tmp)
            export_onnx(bundle.for_device(d), tmp)
        for tmp, out in zip(tmps, own):
            os.replace(tmp, out)
    finally:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
    meta = _record_export(meta, args, time.perf_counter() - t0)
    (folder / METADATA).write_text(json.dumps(meta, indent=2, sort_keys=True))
    print(f"wrote {', '.join(str(p) for p in own)} and {folder / METADATA} (screen_keep {keep}, lead_keep {lead_keep})")
    return 0


def run(args: argparse.Namespace) -> int:
    handlers = {"rank": _rank, "pad": _pad, "export-onnx": _export_onnx, "plan": _plan}
    if args.command not in handlers:
        raise ValueError(f"unknown command {args.command}")
    return handlers[args.command](args)
