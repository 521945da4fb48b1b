"""The model folder: its atomic writer, its model card and the build record in its metadata.

Every command that writes a model folder (`perfmodel build`, `perfmodel train` and the head-by-head refits)
writes it here. This module imports nothing from train/: the fitters and the recipe build on it.

The build record (metadata "build"): the recipe (its text and its settings), the command, the code commit,
the sha256 of every shard file read, the threads and seeds, and each step with its settings and wall time.
A refit appends its step with `"refit": true`; the card lists those as fitted after the build.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from perfmodel import __version__
from perfmodel.artifact import METADATA, ModelBundle, export_onnx_all, load, save
from perfmodel.locations import checkout_root

# The columns of the evaluation table (model card, `perfmodel eval`).
TABLE_KEYS = ["float16/top1_eff", "float16/top5_eff", "bfloat16/top1_eff", "bfloat16/top5_eff", "fp32_all/top1_eff",
              "fp32_all/top5_eff", "all/spearman_median", "all/mape", "all/worst_top1"]
# The dataset shard kinds a build reads (data_gen/shards.py): GEMM sweep, cuBLAS re-time, pad, static, cuBLAS-only.
SHARD_KINDS = ("gemm", "cublas", "pad", "gemm_static", "cublas_only")


def format_table(results: dict[str, dict[str, float]], keys: list[str]) -> str:
    """A markdown table: one row per method, one column per metric key."""
    head = "| method | " + " | ".join(keys) + " |"
    sep = "|---|" + "---|" * len(keys)
    lines = [head, sep]
    for method, metrics in results.items():
        cells = []
        for k in keys:
            v = metrics.get(k)
            cells.append("—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def setting_value(v: Any) -> Any:
    """A setting as recorded (metadata, MLflow params, the build record): a path portable (relative to the
    working directory when inside it), several paths or widths a list, other values as they are."""
    if isinstance(v, Path):
        return _portable(v)
    if isinstance(v, (tuple, list)):
        return [setting_value(p) for p in v]
    return v


def settings_record(settings: Any, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """A settings dataclass as recorded: {field: setting_value(value)} but for `exclude`."""
    if not is_dataclass(settings):
        raise TypeError(f"settings: expected a settings dataclass, got {type(settings).__name__}")
    return {f.name: setting_value(getattr(settings, f.name)) for f in fields(settings) if f.name not in exclude}


def shard_files(folder: Path) -> list[Path]:
    """The dataset folder's shard files of the kinds a build reads, sorted by their path in the folder."""
    folder = Path(folder)
    names = [p for p in folder.iterdir() if p.is_file() and any(
        p.name.startswith(k + "-") and (p.name.endswith(".jsonl") or p.name.endswith(".jsonl.gz"))
        for k in SHARD_KINDS)] if folder.is_dir() else []
    return sorted(names, key=lambda p: p.relative_to(folder).as_posix())


def data_sha256(folder: Path) -> dict[str, Any]:
    """sha256 over every shard file of the folder (shard_files): each one's path relative to the folder,
    then its bytes, in sorted order; with the folder as recorded and the number of files."""
    h = hashlib.sha256()
    files = shard_files(folder)
    for p in files:
        h.update(p.relative_to(folder).as_posix().encode())
        h.update(p.read_bytes())
    return {"path": dataset_path(Path(folder)), "sha256": h.hexdigest(), "files": len(files)}


def code_commit() -> str:
    """`git rev-parse HEAD` of the checkout this package runs from, "unknown" outside one or without git."""
    root = checkout_root()
    if root is None:
        return "unknown"
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def step_record(name: str, settings: dict[str, Any], seconds: float, refit: bool = False,
                command: str = "") -> dict[str, Any]:
    """One step of the build record: its name, settings and wall time (a refit: also its command, the
    code commit and when it ran)."""
    rec: dict[str, Any] = {"step": name, "settings": settings, "seconds": round(float(seconds), 3)}
    if refit:
        rec.update({"refit": True, "command": command, "commit": code_commit(),
                    "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "package_version": __version__})
    return rec


def append_step(meta: dict[str, Any], step: dict[str, Any]) -> dict[str, Any]:
    """meta with step appended to its build record (a folder written before build records: a record of
    its refits only)."""
    build = dict(meta.get("build") or {"recipe": None, "steps": []})
    build["steps"] = [*build.get("steps", []), step]
    return {**meta, "build": build}


def _provenance_md(meta: dict[str, Any]) -> str:
    """The card's opening: the one command that regenerates the folder, what it recorded, and the steps
    refitted after it (which the command does not reproduce)."""
    build = meta.get("build") or {}
    refits = [s for s in build.get("steps", []) if s.get("refit")]
    if build.get("command"):
        data = "; ".join(f"`{d['path']}` sha256 `{d['sha256']}` ({d['files']} shard files)" for d in build["data"])
        steps = ", ".join(f"{s['step']} {s['seconds']:.0f} s" for s in build["steps"] if not s.get("refit"))
        text = (f"Generated by `perfmodel build`; do not edit. Regenerate with:\n\n    {build['command']}\n\n"
                f"- Build: code commit `{build['commit']}`, {build['threads']} CPU threads, seed {build['seed']}; "
                f"data {data}.\n- Steps (wall time): {steps}.\n")
    else:
        text = f"Generated by `perfmodel train`; do not edit. Regenerate with:\n\n    {meta.get('training_command', '-')}\n"
    if refits:
        text += ("- Refitted after the build (the command above does not reproduce these): "
                 + "; ".join(f"`{s['command'] or s['step']}` ({s.get('created', '-')}, commit "
                             f"{str(s.get('commit', '-'))[:12]})" for s in refits) + ".\n")
    return text


def _has_before(m: dict[str, Any]) -> bool:
    return any(k.startswith("before/") for k in m) or any(
        any(k.startswith("before/") for k in d) for d in (m.get("by_device") or {}).values())


def model_card(meta: dict[str, Any]) -> str:
    """The model card, built from the folder's metadata alone (so it can be regenerated from it)."""
    results = {"perfmodel": meta["metrics"], **meta.get("baselines", {})}
    table_md = format_table(results, TABLE_KEYS)
    nets = []
    for name, head in sorted(meta.get("heads", {}).items()):
        mlp = head["mlp"]
        k = int(mlp.get("members", 1))
        shape = "x".join(str(w // k) for w in mlp["hidden"])
        nets.append(f"{name} {shape}" if k == 1 else
                    f"{name} {k} x {shape}, averaged {mlp.get('average', 'before_floor').replace('_', ' ')}")
    pad_md = "\n".join(f"- {k}: {v:.4f}" for k, v in {**meta.get("pad_metrics", {}), **meta.get("cublas_metrics", {})}.items()
                       if not k.endswith("problems"))
    return f"""# perfmodel H100 model

{_provenance_md(meta)}
{_devices_md(meta)}
- Dataset: `{meta['dataset']['path']}`, sha256 `{meta['dataset']['sha256']}`, {meta['dataset']['gemm_rows']} GEMM rows over
  {meta['dataset']['gemm_problems']} problems, {meta['dataset']['pad_rows']} pad rows.
- Split: by problem (seed {meta['settings']['seed']}): train {meta['split']['train']}, val {meta['split']['val']}, test {meta['split']['test']} problems;
  no problem is in two sets. Metrics below are on the test problems only.
- Heads: gemm (Triton config runtime), cublas (torch.mm runtime), pad (orig and padded runtime), and
  screen (a small head distilled from gemm: ranking scores every config with it and the gemm head
  only its best {meta.get('screen_keep', '-')} per problem, when there are more than twice as many).
  Networks (hidden widths): {'; '.join(nets) or '-'}.
  Output layer `logsumexp(f(x), log overhead)`; learned overhead {meta['learned_overhead_ms']:.5f} ms.
{_student_line(meta)}{_static_line(meta)}{_cublas_line(meta)}{_call_line(meta)}- Schema version {meta['schema_version']}, encoder version {meta['encoder_version']}; weights `model.safetensors`
  (loaded with safetensors, no pickle) and `model.onnx` (single file, BatchNorm folded).
- Training time on the training machine's CPU: {meta['train_seconds']:.0f} s.
- Trained with perfmodel {meta.get('package_version', '(version not recorded)')}.

## Ranking Triton configs (held-out problems)

Efficiency = geomean over problems of (fastest measured config / the best of the method's top-k).

{table_md}

## Pad decisions and cuBLAS (held-out problems)

{pad_md}

## Caveats

- The sweep measured Inductor's default configs plus a stratified sample of the pruned config space
  per problem (128 configs for aligned compile groups, 40 otherwise), so "oracle" is the best
  measured config, not the best of the whole space.
- cuBLAS times are the dataset's quiet re-time (`perfmodel gen cublas`) where it has one.
"""


def _devices_md(meta: dict[str, Any]) -> str:
    """The model card's device lines: one device, or several with each one's held-out figures."""
    spec = meta["device_spec"]
    devices = meta.get("devices") or [spec["name"]]
    if len(devices) == 1:
        return (f"- Device: {spec['name']} ({spec['marketing_name']}, {spec['sm_count']} SMs);\n"
                "  the model predicts for this device only (its features use the device's SM count and peaks).")
    lines = [f"- Devices: {', '.join(devices)} (default {devices[0]}): one model whose features include each "
             "device's spec (`Predictor.load(device=...)`); the tables below are the default device's. Per device "
             "(held-out problems of its own dataset):"]
    for name in devices:
        m = meta.get("metrics_by_device", {}).get(name, {})
        r, pad = m.get("results", {}), m.get("pad", {})
        cells = ", ".join(f"{k} {r[k]:.4f}" for k in ("float16/top1_eff", "bfloat16/top1_eff", "fp32_all/top1_eff",
                                                     "all/top5_eff") if k in r)
        if "pad/total_vs_oracle" in pad:
            cells += f", pad {pad['pad/total_vs_oracle']:.4f}x the oracle"
        ds = next((x for x in meta.get("datasets", []) if x.get("device") == name), {})
        lines.append(f"  - {name}: `{ds.get('path', '?')}`; {cells or 'not evaluated'}")
    if meta.get("device_fraction"):
        lines.append(f"  - trained on a fraction of some devices' training problems: {meta['device_fraction']}")
    return "\n".join(lines)


def _student_line(meta: dict[str, Any]) -> str:
    """The model card's line on the student head (what predict serves), if the folder has one."""
    m = meta.get("student_metrics")
    if not m:
        return "- No student head: `predict` runs the gemm head.\n"
    return (f"- Student head (what `predict` serves; `rank` keeps the gemm head): one MLP distilled from the gemm "
            f"head by `perfmodel distill`. On the test problems' whole config spaces its log ms are a median "
            f"{m['student/median_abs_log_diff']:.4f} from the gemm head's (90th percentile "
            f"{m['student/p90_abs_log_diff']:.4f}); the gemm head's own members, around their mean: "
            f"{m.get('gemm/member_spread_median', float('nan')):.4f}{_student_by_device(meta)}.\n")


def _static_line(meta: dict[str, Any]) -> str:
    """The model card's line on the static head (kernel="inductor"), if the folder has one."""
    m = meta.get("static_metrics")
    if not m:
        return "- No static head: the model predicts `kernel=\"autotune\"` only.\n"
    w, wo = "test_static/static_head/", "test_static/without/"
    return (f"- Static head (`kernel=\"inductor\"`, the kernel as Inductor compiles it; `perfmodel static-head`): on "
            f"the {m['test_static/problems']} test problems timed statically, the ranking's top-1 fp16 / bf16 / fp32 "
            f"{m[w + 'float16/top1_eff']:.3f} / {m[w + 'bfloat16/top1_eff']:.3f} / {m[w + 'fp32_all/top1_eff']:.3f} "
            f"(without the head {m[wo + 'float16/top1_eff']:.3f} / {m[wo + 'bfloat16/top1_eff']:.3f} / "
            f"{m[wo + 'fp32_all/top1_eff']:.3f}), top-5 {m[w + 'all/top5_eff']:.3f}; fitted on "
            f"{m['problems/train']} train problems' static rows.\n")


def _cublas_line(meta: dict[str, Any]) -> str:
    """The model card's line on a cuBLAS head refitted on every torch.mm time (`perfmodel cublas-head`)."""
    m = meta.get("cublas_head_metrics")
    if not m:
        return ""

    def errors(d: dict[str, Any]) -> str:
        def one(k: str) -> str:  # a head fitted in a build has no previous head to compare with
            was = d.get(f"before/{k}/test/mean_abs_log_err")
            return (f"{was:.3f} -> " if was is not None else "") + f"{d[k + '/test/mean_abs_log_err']:.3f}"

        return "; ".join(f"{what} {one(k)}" for k, what in (("gemm", "GEMM problems"), ("cublas_only", "cuBLAS-only problems"),
                                                            ("pad_orig", "pad rows' unpadded problems"))
                         if f"{k}/test/mean_abs_log_err" in d)

    by = m.get("by_device") or {}
    n = sum(sum(d.get("rows", {}).values()) for d in by.values()) if by else sum(m.get("rows", {}).values())
    per = " ".join(f"{dev}: {errors(d)}." for dev, d in by.items()) if by else errors(m) + "."
    return (f"- cuBLAS head (`perfmodel cublas-head`): fitted on {n} torch.mm times{f' of {len(by)} devices' if by else ''} "
            f"(GEMM problems, problems of every alignment class and layout timed for cuBLAS alone, pad rows' unpadded "
            f"times); mean |log error| on each kind's test rows{' (the head before it -> this one)' if _has_before(m) else ''}: "
            f"{per}\n")


def _call_line(meta: dict[str, Any]) -> str:
    """The model card's line on the cuBLAS call heads (`perfmodel call-head`), if the folder has them."""
    m = meta.get("call_metrics")
    if not m:
        return ""

    def right(d: dict[str, Any]) -> str:
        parts = []
        for name, what in (("call", "`kernel=\"autotune\"`, against the dataset's times"),
                           ("call_static", "`kernel=\"inductor\"`, against the static times")):
            if f"{name}/test/choice_accuracy" in d:
                parts.append(f"{d[name + '/test/choice_accuracy']:.3f} ({what}; the cuBLAS head against the gemm "
                             f"head's best: {d[name + '/test/choice_accuracy_times']:.3f})")
        return f"{' and '.join(parts)} of the {d.get('call/test/problems', '-')} test problems"

    by = m.get("by_device") or {}
    where = "; ".join(f"{dev}: {right(d)}" for dev, d in by.items()) if by else right(m)
    return (f"- cuBLAS call heads (`perfmodel call-head`; `prefer_cublas`): the call whether cuBLAS beats the best "
            f"Triton config is right on {where}.\n")


def _student_by_device(meta: dict[str, Any]) -> str:
    """A model of several devices: the student's median distance from the gemm head on each device's test problems."""
    by = meta.get("student_metrics_by_device") or {}
    if len(by) < 2:
        return ""
    return " (" + "; ".join(f"{dev}: median {m['student/median_abs_log_diff']:.4f}" for dev, m in by.items()) \
        + ", each device's test problems, its own features)"


def _portable(path: Path) -> str:
    """A path as recorded in the model's metadata: relative to the working directory when inside it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def dataset_path(data: Path) -> str:
    """The dataset as recorded in the model's metadata: relative to the checkout (data/h100) when run
    from one, else as given."""
    root = checkout_root()
    return os.path.relpath(data, root) if root is not None else _portable(data)




def write_model_folder(bundle: ModelBundle, meta: dict[str, Any], out: Path, record_step: str | None = None) -> Path:
    """Write to a temporary sibling folder, verify it loads, then swap it in: the previous model stays
    in place if anything fails before the swap. record_step: the name of a last step of the build record
    that times this write itself (weights, ONNX export, card)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    t0 = time.perf_counter()
    try:
        bundle.metadata = meta
        save(bundle, tmp)
        export_onnx_all(bundle, tmp)  # model.onnx, and model.<device>.onnx for each other device
        if record_step is not None:  # the write's own time, into the metadata just written
            bundle.metadata = append_step(bundle.metadata, step_record(record_step, {"onnx": True},
                                                                       time.perf_counter() - t0))
            (tmp / METADATA).write_text(json.dumps(bundle.metadata, indent=2, sort_keys=True))
        if ("training_command" in meta or "build" in meta) and "metrics" in meta:  # a trained and evaluated model
            (tmp / "MODEL_CARD.md").write_text(model_card(bundle.metadata))
        elif (out / "MODEL_CARD.md").is_file():  # a folder perfmodel train/build did not write keeps its own card
            shutil.copy(out / "MODEL_CARD.md", tmp / "MODEL_CARD.md")
        load(tmp)  # refuse to ship what does not load
        _swap(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        backup = out.with_name(f".{out.name}.old")
        if backup.exists() and not out.exists():  # interrupted between the two renames: put it back
            backup.rename(out)
        raise
    return out


def _swap(tmp: Path, out: Path) -> None:
    """tmp renamed to out, the previous out moved aside first and removed after."""
    backup = out.with_name(f".{out.name}.old")
    if backup.exists():
        shutil.rmtree(backup)
    if out.exists():
        out.rename(backup)
    tmp.rename(out)
    if backup.exists():
        shutil.rmtree(backup)
