"""`perfmodel migrate FOLDER`: convert a model folder written in an older layout into the current one, once.

Older folders hold heads that are alternatives to a registered head (perfmodel/heads/legacy.py); the loader
(perfmodel/artifact.py load) refuses them, naming this command, and nothing that serves branches on them. This
module alone reads them (read_old: each head by its registered or its older spec). The conversion:

- cublas, call, call_static (one head per output) -> the problem network (perfmodel/heads/problem.py): the heads
  stacked into one MLP of several outputs -- first layers side by side, hidden layers block-diagonal, each output
  its head's -- which computes each head's output (to float rounding: the same products, with zeros between);
- a head's MLP config without floor_features (written before the field) -> the floor the loader gave it;
- an ensemble's hidden weights stored whole -> as their diagonal blocks (perfmodel/artifact.py BLOCKS);
- screen, static: no exact conversion (the student screens now; the config network serves kernel="inductor"):
  refused, naming the refit, unless `--drop screen` / `--drop static` (ranking then screened by the student, or
  not at all; kernel="inductor" no longer served -- the migration says so).

The weights of every other head are written back as they were, bit for bit; model.onnx is exported again and the
step appended to the folder's build record. The folder is replaced atomically (a failed migration leaves it).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import artifact
from .bundle import PROBLEM, STUDENT, ModelBundle
from .heads import REGISTRY
from .heads.legacy import LEGACY
from .heads.problem import OUTPUTS as PROBLEM_OUTPUTS
from .model import MLPConfig, PerfMLP, stack_linears
from .provenance import append_step, step_record

# the older layout's heads without an exact conversion: the screen head, the static head (kernel="inductor")
SCREEN, STATIC = "screen", "static"
DROPPABLE = (SCREEN, STATIC)
# what refits a dropped head's job in the current layout
REFIT = {SCREEN: "perfmodel build --recipe RECIPE --only student (with [student].screens = true)",
         STATIC: "perfmodel build --recipe RECIPE (with [train].config_net = true)"}


class MigrationError(ValueError):
    """A folder this code cannot convert exactly (without a --drop the user chose)."""


def stack_outputs(heads: list[PerfMLP]) -> PerfMLP:
    """One MLP whose output j is heads[j]'s (each of one output, averaged before its floor): their folded first
    Linears side by side, their hidden and output Linears block-diagonal, output j's overhead and physical floor
    heads[j]'s. MigrationError where the heads differ in depth or input width."""
    folded = [h.folded() for h in heads]
    lins = [[m for m in f.net if isinstance(m, nn.Linear)] for f in folded]
    for h, f, ls in zip(heads, folded, lins):
        if h.cfg.n_outputs != 1 or h.floors_each_member or any(type(m) not in (nn.Linear, nn.ReLU) for m in f.net):
            raise MigrationError("heads: only heads of one output, averaged before the floor, stack into one network")
    depth, n_in = len(lins[0]), heads[0].cfg.n_inputs
    if any(len(ls) != depth for ls in lins) or any(h.cfg.n_inputs != n_in for h in heads):
        raise MigrationError(f"heads: {len(heads)} heads of different depth or inputs do not stack into one network")
    hidden = tuple(sum(ls[i].out_features for ls in lins) for i in range(depth - 1))
    floors = tuple(h.cfg.floor_features[0] if h.cfg.floor_features else -1 for h in heads)
    out = PerfMLP(MLPConfig(n_in, hidden, "none", init_overhead_ms=heads[0].cfg.init_overhead_ms,
                            n_outputs=len(heads), floor_features=floors))
    stack_linears([m for m in out.net if isinstance(m, nn.Linear)], lins)  # each head's output kept
    with torch.no_grad():
        out.log_overhead.copy_(torch.cat([h.log_overhead.detach().reshape(1) for h in heads]))
    return out.eval()


def _problem_network(bundle: ModelBundle) -> list[str]:
    """cublas, call, call_static heads -> the problem network, in place; the changes made."""
    names = [n for n in PROBLEM_OUTPUTS if n in bundle.heads]
    if not names:
        return []
    if names[0] != "cublas":
        raise MigrationError(f"heads: {', '.join(names)} without a cublas head: no problem network to make "
                             "(perfmodel build --recipe RECIPE --only problem)")
    bundle.heads[PROBLEM] = stack_outputs([bundle.heads.pop(n) for n in names])
    bundle.encoders[PROBLEM] = bundle.encoders["cublas"]
    for n in names[1:]:
        bundle.encoders.pop(n, None)
    bundle.metadata = {**bundle.metadata, "problem_outputs": names}
    return [f"{', '.join(names)} -> problem (one network, outputs {names})"]


def _drop(bundle: ModelBundle, name: str) -> str:
    """Drop a legacy head without an exact conversion; what changes in serving."""
    bundle.heads.pop(name)
    bundle.encoders.pop(name, None)
    meta = dict(bundle.metadata)
    if name == STATIC:
        meta.pop("static_metrics", None)
        what = 'kernel="inductor" is no longer served'
    else:
        if STUDENT in bundle.heads:
            meta["screen_head"] = STUDENT
        else:  # no screen left: no lead either (perfmodel.bundle.check_lead_keep)
            meta.pop("screen_head", None)
            meta["lead_keep"] = 0
        what = "rank is screened by the student" if STUDENT in bundle.heads else "rank scores every config"
    bundle.metadata = meta
    return f"{name} dropped: {what} (refit: {REFIT[name]})"


def convert(bundle: ModelBundle, drop: tuple[str, ...] = ()) -> list[str]:
    """bundle in the current layout, in place; the changes made ([] where it is current already)."""
    bad = set(drop) - set(DROPPABLE)
    if bad:
        raise ValueError(f"drop: expected some of {', '.join(DROPPABLE)}, got {', '.join(sorted(bad))}")
    changes = _problem_network(bundle)
    for name in DROPPABLE:
        if name not in bundle.heads:
            continue
        if name not in drop:
            raise MigrationError(f"{name}: the folder's {name} head has no exact conversion; refit its job with "
                                 f"{REFIT[name]}, or migrate with --drop {name}")
        changes.append(_drop(bundle, name))
    if bundle.metadata.get("screen_head") == SCREEN and SCREEN not in bundle.heads:  # names a head it has not
        meta = {k: v for k, v in bundle.metadata.items() if k != "screen_head"}
        bundle.metadata = {**meta, **({"screen_head": STUDENT} if STUDENT in bundle.heads else {})}
        changes.append(f"screen_head: {bundle.metadata.get('screen_head', 'none')} (the folder has no screen head)")
    return changes


def _stored_changes(meta: dict[str, Any], tensors: dict[str, torch.Tensor], bundle: ModelBundle) -> list[str]:
    """What rewriting the folder changes besides the heads: floor_features written, blocks stored."""
    out = [f"{n}: floor_features written" for n, hm in meta["heads"].items() if "floor_features" not in hm["mlp"]]
    for name in meta["heads"]:
        stored = bundle.config_net if name == "gemm" and bundle.config_net is not None else bundle.heads[name]
        keys = artifact.compact_state(stored.state_dict(), stored.cfg.members)
        if any(k.endswith(artifact.BLOCKS) and f"{name}.{k}" not in tensors for k in keys):
            out.append(f"{name}: hidden weights stored as their diagonal blocks")
    return out


def read_old(folder: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor], ModelBundle]:
    """(metadata, stored tensors, bundle) of a folder in the current or an older layout: each head built by its
    registered spec or its older one (perfmodel/heads/legacy.py); the roles are checked once it is converted."""
    meta, tensors = artifact.read_folder(folder)
    heads, encoders, net = artifact.load_heads(folder, meta, tensors, {**LEGACY, **REGISTRY})
    if PROBLEM in heads:
        encoders.setdefault("cublas", encoders[PROBLEM])
    bundle = ModelBundle(artifact.spec_from_dict(meta.get("device_spec", {})), heads, encoders, meta, net)
    return meta, tensors, bundle


def migrate(folder: Path, drop: tuple[str, ...] = (), log: Any = print) -> list[str]:
    """Convert the model folder in place (atomically: a temporary sibling, then swapped in); the changes made, []
    for a folder in the current layout (nothing written). MigrationError naming the head it cannot convert."""
    from .onnx_export import export_onnx_all

    folder = Path(folder)
    t0 = time.perf_counter()
    meta, tensors, bundle = read_old(folder)
    changes = _stored_changes(meta, tensors, bundle) + convert(bundle, tuple(drop))
    if not changes:
        log(f"migrate: {folder} is in the current layout; nothing to do")
        return []
    step = step_record("migrate", {"changes": changes}, time.perf_counter() - t0, refit=True,
                       command="perfmodel migrate " + folder.as_posix() + "".join(f" --drop {d}" for d in drop))
    bundle.metadata = append_step(bundle.metadata, step)
    with tempfile.TemporaryDirectory(prefix=".migrate-", dir=folder.parent) as tmp:
        new = Path(tmp) / folder.name
        artifact.save(bundle, new)
        export_onnx_all(bundle, new)
        for extra in folder.iterdir():  # the card and anything else the folder carries
            if not (new / extra.name).exists() and extra.is_file() and not extra.name.endswith(".onnx"):
                shutil.copy2(extra, new / extra.name)
        artifact.load(new)  # the converted folder loads, or the old one stays
        old = Path(tmp) / (folder.name + ".old")
        os.replace(folder, old)
        os.replace(new, folder)
    for c in changes:
        log(f"migrate: {c}")
    return changes
