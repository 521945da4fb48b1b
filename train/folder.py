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
import tempfile
import time
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from perfmodel import onnx_export
from perfmodel.heads import REGISTRY
from perfmodel.heads.spec import figure
from perfmodel.artifact import METADATA, ModelBundle, append_step, load, save, step_record
from perfmodel.locations import checkout_root
from perfmodel.validation import follow_umask

# The columns of the evaluation table (model card, `perfmodel eval`).
TABLE_KEYS = ["float16/top1_eff", "float16/top5_eff", "bfloat16/top1_eff", "bfloat16/top5_eff", "fp32_all/top1_eff",
              "fp32_all/top5_eff", "all/spearman_median", "all/mape", "all/worst_top1"]
# The dataset shard kinds a build reads (data_gen/shards.py): GEMM sweep, cuBLAS re-time, pad, static, cuBLAS-only.
SHARD_KINDS = ("gemm", "cublas", "pad", "gemm_static", "cublas_only", "bmm")


_fmt = figure  # a card figure: "-" for a missing or NaN one, never "nan"


def device_label(name: str) -> str:
    """A device spec's name as a card's title says it: h100-sxm -> H100, h200 -> H200, h100-pcie -> H100 PCIe."""
    from perfmodel.devices import DEVICE_FOLDER

    return DEVICE_FOLDER.get(name, name).upper().replace("-PCIE", " PCIe")


def card_title(meta: dict[str, Any]) -> str:
    """The card's title: the device the folder is the model for. A model of several devices (models/h200: the H100's
    and the H200's data, the H100 its default) is named for the device of the folder its recipe writes
    (models/<device folder>, perfmodel.devices.DEVICE_FOLDER), else for all its devices."""
    devices = list(meta.get("devices") or [meta["device_spec"]["name"]])
    if len(devices) > 1:
        from perfmodel.devices import DEVICE_FOLDER

        out = _recipe_out((meta.get("build") or {}).get("recipe") or {})
        target = [d for d in devices if out is not None and DEVICE_FOLDER.get(d) == out.name]
        devices = target or devices
    return f"perfmodel {' + '.join(device_label(d) for d in devices)} model"


def _recipe_out(recipe: dict[str, Any]) -> Path | None:
    """The folder a recorded recipe writes ([build].out), None without one (a build's --out is where it was
    written, not what the folder is)."""
    try:
        import tomllib  # Python >= 3.11
    except ModuleNotFoundError:  # 3.10: the tomli backport of the train extra, where installed
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            return None
    try:
        out = tomllib.loads(recipe.get("text") or "").get("build", {}).get("out")
    except (ValueError, AttributeError):  # tomllib.TOMLDecodeError is a ValueError
        return None
    return Path(out) if isinstance(out, str) else None


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


def shard_files(folder: Path, kinds: tuple[str, ...] = SHARD_KINDS) -> list[Path]:
    """The dataset folder's shard files of these kinds (default: every kind a build reads), sorted by their
    path in the folder."""
    folder = Path(folder)
    names = [p for p in folder.iterdir() if p.is_file() and any(
        p.name.startswith(k + "-") and (p.name.endswith(".jsonl") or p.name.endswith(".jsonl.gz"))
        for k in kinds)] if folder.is_dir() else []
    return sorted(names, key=lambda p: p.relative_to(folder).as_posix())


def data_sha256(folder: Path, kinds: tuple[str, ...] = SHARD_KINDS) -> dict[str, Any]:
    """sha256 over every shard file of the folder of these kinds (shard_files): each one's path relative to
    the folder, then its bytes, in sorted order; with the folder as recorded and the number of files."""
    h = hashlib.sha256()
    files = shard_files(folder, kinds)
    for p in files:
        h.update(p.relative_to(folder).as_posix().encode())
        h.update(p.read_bytes())
    return {"path": dataset_path(Path(folder)), "sha256": h.hexdigest(), "files": len(files)}


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
        text += (f"- Refitted after the {'build' if build.get('command') else 'training run'} (the command above "
                 "does not reproduce these): "
                 + "; ".join(f"`{s['command'] or s['step']}` ({s.get('created', '-')}, commit "
                             f"{str(s.get('commit', '-'))[:12]})" for s in refits) + ".\n")
    return text


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
    pad_md = "\n".join(f"- {k}: {_fmt(v, 4)}" for k, v in {**meta.get("pad_metrics", {}), **meta.get("cublas_metrics", {})}.items()
                       if not k.endswith("problems"))
    return f"""# {card_title(meta)}

{_provenance_md(meta)}
{_devices_md(meta)}
- Dataset: `{meta['dataset']['path']}`, sha256 `{meta['dataset']['sha256']}`, {meta['dataset']['gemm_rows']} GEMM rows over
  {meta['dataset']['gemm_problems']} problems, {meta['dataset']['pad_rows']} pad rows.
- Split: by {meta['settings'].get('split', 'problem')} (seed {meta['settings']['seed']}): train {meta['split']['train']}, val {meta['split']['val']}, test {meta['split']['test']} problems;
  no problem is in two sets. Metrics below are on the test problems only.
- Heads: gemm (Triton config runtime), {_problem_heads(meta)}, pad (orig and padded runtime), and
  {_screen_md(meta)}
  Networks (hidden widths): {'; '.join(nets) or '-'}.
  Output layer `logsumexp(f(x), log overhead)`; learned overhead {_fmt(meta['learned_overhead_ms'], 5)} ms.
{_head_lines(meta)}- Schema version {meta['schema_version']}, encoder version {meta['encoder_version']}; weights `model.safetensors`
  (loaded with safetensors, no pickle) and `model.onnx` (single file, BatchNorm folded).
- Training time on the training machine's CPU: {meta['train_seconds']:.0f} s.
- Trained with perfmodel {meta.get('package_version', '(version not recorded)')}.

## Ranking Triton configs (held-out problems)

Efficiency = geomean over problems of (fastest measured config / the best of the method's top-k).

{table_md}

## Pad decisions and cuBLAS (held-out problems)

{pad_md}

{_bmm_md(meta)}## Caveats

- The sweep measured Inductor's default configs plus a stratified sample of the pruned config space
  per problem (128 configs for aligned compile groups, 40 otherwise), so "oracle" is the best
  measured config, not the best of the whole space.
- cuBLAS times are the dataset's quiet re-time (`perfmodel gen cublas`) where it has one.
"""


def _head_lines(meta: dict[str, Any]) -> str:
    """Each registered head's lines on the card (perfmodel/heads/: HeadSpec.card), in the registry's order."""
    return "".join(spec.card(meta) for spec in REGISTRY.values() if spec.card is not None)


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
        cells = ", ".join(f"{k} {_fmt(r[k], 4)}" for k in ("float16/top1_eff", "bfloat16/top1_eff", "fp32_all/top1_eff",
                                                     "all/top5_eff") if k in r)
        if "pad/total_vs_oracle" in pad:
            cells += f", pad {_fmt(pad['pad/total_vs_oracle'], 4)}x the oracle"
        ds = next((x for x in meta.get("datasets", []) if x.get("device") == name), {})
        lines.append(f"  - {name}: `{ds.get('path', '?')}`; {cells or 'not evaluated'}")
    if meta.get("device_fraction"):
        lines.append(f"  - trained on a fraction of some devices' training problems: {meta['device_fraction']}")
    return "\n".join(lines)


def _screen_md(meta: dict[str, Any]) -> str:
    """The model card's words on the head that screens the ranking: the student, or none (no build writes the
    older screen head)."""
    if meta.get("screen_head") != "student":
        return "no head that screens the ranking (ranking scores every config with the gemm head)."
    who = "the student (below), which screens too: ranking scores every config with it"
    return (f"{who} and the gemm head only its best {meta.get('screen_keep', '-')} per problem, when there are more "
            "than twice as many).")


def _problem_heads(meta: dict[str, Any]) -> str:
    """The card's name of the heads on the problem features: the cublas head, or the problem network's outputs."""
    outs = meta.get("problem_outputs")
    return "cublas (torch.mm runtime)" if not outs else f"problem (one network: {', '.join(outs)})"


def _bmm_md(meta: dict[str, Any]) -> str:
    """The model card's section on the bmm heads' held-out figures, if the folder has them."""
    m = meta.get("bmm_metrics")
    if not m or "test/all/top1_eff" not in m:
        return ""
    zero = m.get("zero_shot") or {}
    rows = ["| test problems | problems | top-1 | top-5 | the mm heads on one matrix, top-1 |", "|---|---:|---:|---:|---:|"]
    for g in ("all", "float16", "bfloat16", "tf32", "float32"):
        if f"test/{g}/top1_eff" in m:
            z = zero.get(f"test/{g}/top1_eff")
            rows.append(f"| {g} | {m[f'test/{g}/problems']} | {_fmt(m[f'test/{g}/top1_eff'], 4)} | {_fmt(m[f'test/{g}/top5_eff'], 4)} "
                        f"| {'-' if z is None else f'{_fmt(z, 4)}'} |")
    for dev, dm in (m.get("devices") or {}).items():  # a model of several devices: its other devices' test problems
        if "test/all/top1_eff" in dm:
            rows.append(f"| all, {dev} | {dm['test/problems']} | {_fmt(dm['test/all/top1_eff'], 4)} | "
                        f"{_fmt(dm['test/all/top5_eff'], 4)} | - |")
    call = m.get("test/call/accuracy")
    times = ("no bmm_aten head: aten::bmm's time is the one the call implies" if m.get("aten_head") is False else
             f"aten::bmm's predicted time against the best ranked config's: "
             f"{_fmt(m.get('test/call/accuracy_times'), 3)}")
    call_md = "" if call is None else (
        f"\nThe aten-or-Triton call (the bmm_call head) is right on {_fmt(call, 3)} of the {m['test/call/problems']} test "
        f"problems ({times}; always Triton: {_fmt(m.get('test/call/accuracy_always_triton'), 3)}).\n")
    cv = m.get("cv/all/top1_eff")
    if cv is not None:
        per = ", ".join(f"{g} {_fmt(m[f'cv/{g}/top1_eff'], 4)} / {_fmt(m[f'cv/{g}/top5_eff'], 4)}"
                        for g in ("float16", "bfloat16", "tf32", "float32") if f"cv/{g}/top1_eff" in m)
        call_md += (f"\nCross-validated ({m['cv/folds']} folds by {m.get('cv/by', 'shape')}, every one of the {m['cv/problems']} problems "
                    f"held out once; the Triton head {m['cv/members']} member per fold): top-1 / top-5 {_fmt(cv, 4)} / "
                    f"{_fmt(m['cv/all/top5_eff'], 4)} ({per}); the call right on {_fmt(m.get('cv/call/accuracy'), 3)}.\n")
    return "## Batched GEMMs (held-out problems)\n\n" + "\n".join(rows) + "\n" + call_md + "\n"


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
        onnx_export.export_onnx_all(bundle, tmp)  # model.onnx, and model.<device>.onnx for each other device
        if record_step is not None:  # the write's own time, into the metadata just written
            bundle.metadata = append_step(bundle.metadata, step_record(record_step, {"onnx": True},
                                                                       time.perf_counter() - t0))
            (tmp / METADATA).write_text(json.dumps(bundle.metadata, indent=2, sort_keys=True))
        if ("training_command" in meta or "build" in meta) and "metrics" in meta:  # a trained and evaluated model
            (tmp / "MODEL_CARD.md").write_text(model_card(bundle.metadata))
        elif (out / "MODEL_CARD.md").is_file():  # a folder perfmodel train/build did not write keeps its own card
            shutil.copy(out / "MODEL_CARD.md", tmp / "MODEL_CARD.md")
        load(tmp)  # refuse to ship what does not load
        follow_umask(tmp)  # mkdtemp made it 0o700: the folder and its files as the umask says, as a plain mkdir's
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
