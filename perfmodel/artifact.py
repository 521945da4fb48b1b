"""The model folder: weights (safetensors), metadata.json, model.onnx and a model card.

Everything a loader needs -- head configs, feature names, normalisation (inside the weights), device
spec, schema and encoder versions -- is read from the folder, never from constants in code. A folder
whose schema, encoder version or feature names differ from this code's is refused.

save and load loop over the heads registered in perfmodel/heads/ (one spec each): a head the registry does
not know is refused, and a folder of an older layout (a head of perfmodel/heads/legacy.py) is refused with the
command that converts it once (`perfmodel migrate FOLDER`, perfmodel/migrate.py). The bundle in memory is perfmodel/bundle.py's, the ONNX graph perfmodel/onnx_export.py's,
the build record's helpers perfmodel/provenance.py's (their names are importable from here too).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ._version import __version__
from .bundle import (BMM, BMM_ATEN, BMM_CALL, CALL, CALL_STATIC, DEFAULT_SCREEN_KEEP, INDUCTOR_GEMM,  # noqa: F401
                     KERNEL_MODE_FEATURE, KERNEL_MODE_INPUT, KERNEL_MODE_VALUES, MODE_HEADS, PROBLEM, PROBLEM_OUTPUTS,
                     SCREEN_HEADS, STUDENT, TUTORIAL_GEMM, ArtifactError, ModelBundle, OutputColumn, check_lead_keep,
                     config_heads, config_network, inductor_head, inductor_mode, mode_head, predict_head,
                     problem_columns, problem_output, screen_name, spec_from_dict)
from .features import ENCODER_VERSION, SUPPORTED_ENCODER_VERSIONS, FeatureEncoder  # noqa: F401  (the versions a folder records)
from .heads import REGISTRY
from .heads.legacy import LEGACY
from .heads.spec import HeadSpec
from .model import MLPConfig, PerfMLP, diagonal_blocks, floor_features
from .provenance import append_step, code_commit, sha256_file, step_record  # noqa: F401
from .schema import SCHEMA_VERSION
from .validation import check_metadata, folder_exists, follow_umask

FORMAT = "perfmodel-artifact"
WEIGHTS = "model.safetensors"
METADATA = "metadata.json"
ONNX = "model.onnx"
# The heads a folder may hold: the registry's (gemm required)
HEADS = tuple(REGISTRY)


def older_layout(meta: dict[str, Any]) -> str | None:
    """What makes a folder's metadata one of an older layout -- its heads of perfmodel/heads/legacy.py, a
    "screen_head" naming the older screen head -- or None for a folder in the current layout."""
    old = [n for n in meta.get("heads", {}) if n in LEGACY]
    if old:
        return f"head{'s' if len(old) > 1 else ''} {', '.join(map(repr, old))}"
    if isinstance(meta.get("screen_head"), str) and meta["screen_head"] in LEGACY:
        return f"'screen_head' {meta['screen_head']!r}"
    return None


def refuse_older_layout(folder: Path, meta: dict[str, Any]) -> None:
    """ArtifactError naming what is of an older layout in the folder and the command that converts it once."""
    what = older_layout(meta)
    if what is not None:
        raise ArtifactError(f"{folder}: {what} of an older folder layout (perfmodel/heads/legacy.py), no longer "
                            f"loaded; convert the folder once with: perfmodel migrate {folder}"
                            + (" (a screen or static head has no exact conversion: the migration names its refit, "
                               "or drops it with --drop)" if any(h in what for h in ("'screen'", "'static'")) else ""))


def onnx_file(bundle: ModelBundle, device: str | None = None) -> str:
    """The ONNX file of a model folder that serves `device` (default: the bundle's): model.onnx for the
    model's default device, model.<device>.onnx for each other one. The heads' graph is the same in each
    (it takes encoded rows); the ranking graph encodes problems and configs with that device's spec."""
    device = bundle.spec.name if device is None else device
    return ONNX if device == bundle.devices[0] else f"model.{device}.onnx"


# A weight stored as its diagonal blocks: "<key>.blocks", (G, rows / G, cols / G). An ensemble head
# (PerfMLP.ensemble, cfg.members = G) has block-diagonal hidden Linears, G times larger than its members' weights.
BLOCKS = ".blocks"


def compact_state(sd: dict[str, torch.Tensor], members: int) -> dict[str, torch.Tensor]:
    """A head's state dict as the folder stores it: each block-diagonal weight of an ensemble of `members`
    as its blocks ("<key>.blocks"), every other tensor as it is. expand_state inverts it bit for bit."""
    out = {}
    for k, v in sd.items():
        blocks = diagonal_blocks(v, members) if k.endswith("weight") else None
        out[k if blocks is None else k + BLOCKS] = v if blocks is None else blocks
    return out


def expand_state(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict of a stored head: each "<key>.blocks" (G, r, c) as the block-diagonal (G r, G c) "<key>"
    (folders written before blocks were stored have none)."""
    out = {}
    for k, v in sd.items():
        if not k.endswith(BLOCKS):
            out[k] = v
        elif v.dim() != 3:
            raise ArtifactError(f"{k}: stored diagonal blocks must be (blocks, rows, cols), got {tuple(v.shape)}")
        else:
            out[k[:-len(BLOCKS)]] = torch.block_diag(*v)
    return out


def save(bundle: ModelBundle, folder: Path, extra_metadata: dict[str, Any] | None = None) -> Path:
    """Write bundle's weights and metadata.json into folder (no ONNX file, no card: perfmodel/onnx_export.py and
    train/folder.py). Every head must be registered (perfmodel/heads/)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    modes = bundle.config_net is not None
    if (modes and INDUCTOR_GEMM not in bundle.heads) or modes != (KERNEL_MODE_INPUT in bundle.metadata):
        raise ArtifactError(f"config_net: a config network needs its {INDUCTOR_GEMM!r} head and metadata "
                            f"{KERNEL_MODE_INPUT!r} (set config_network())")
    tensors, heads_meta = {}, {}
    for name, head in bundle.heads.items():
        if name == INDUCTOR_GEMM and modes:  # a mode of the config network, written once as "gemm"
            continue
        if name not in REGISTRY:
            raise ArtifactError(f"heads: {name!r} is not a registered head (perfmodel/heads/: {', '.join(REGISTRY)})")
        features = bundle.encoders[name].names
        if modes and name == "gemm":
            head, features = bundle.config_net, features + [KERNEL_MODE_FEATURE]
        for k, v in compact_state(head.state_dict(), head.cfg.members).items():
            tensors[f"{name}.{k}"] = v.detach().contiguous().cpu()
        heads_meta[name] = {"mlp": head.cfg.as_dict(), "features": features,
                            "encoder_kind": bundle.encoders[name].kind}
    versions = {enc.version for enc in bundle.encoders.values()}
    if len(versions) != 1:
        raise ArtifactError(f"encoders: one encoder version per model folder, got {sorted(versions)}")
    save_file(tensors, str(folder / WEIGHTS))
    follow_umask(folder / WEIGHTS)  # the writer creates it 0o600
    meta = {**bundle.metadata, **(extra_metadata or {}), "format": FORMAT, "schema_version": SCHEMA_VERSION,
            "encoder_version": versions.pop(), "device_spec": bundle.spec.as_dict(), "heads": heads_meta,
            "weights_sha256": sha256_file(folder / WEIGHTS)}
    if len(bundle.devices) > 1 or "devices" in meta:  # several devices: each one's spec, the default first
        if bundle.spec.name != bundle.devices[0]:
            raise ArtifactError(f"devices: the bundle's spec {bundle.spec.name!r} is not its default device "
                                f"{bundle.devices[0]!r} (save the bundle as trained, not for_device())")
        meta["devices"] = list(bundle.devices)
        meta["device_specs"] = {name: spec.as_dict() for name, spec in bundle.device_specs.items()}
    (folder / METADATA).write_text(json.dumps(meta, indent=2, sort_keys=True))
    bundle.metadata = meta
    return folder


def load(folder: Path) -> ModelBundle:
    """The bundle of a model folder: its metadata checked (format, versions, checksum, devices), each stored head
    built from its registered spec and its stored config, then the heads' roles checked (the config network's
    modes, the problem network's outputs, the screen, the lead). FileNotFoundError for a missing folder or file,
    ArtifactError (a ValueError) naming what is wrong with a corrupt or mismatched one."""
    folder = Path(folder)
    meta, tensors = read_folder(folder)
    refuse_older_layout(folder, meta)
    spec = spec_from_dict(meta.get("device_spec", {}))
    heads, encoders, net = load_heads(folder, meta, tensors, REGISTRY)
    _check_roles(folder / METADATA, meta, heads, encoders)
    bundle = ModelBundle(spec, heads, encoders, meta, net)
    try:
        check_lead_keep(bundle, meta.get("lead_keep", 0), meta.get("screen_keep", DEFAULT_SCREEN_KEEP))
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"{folder / METADATA}: {exc}") from None
    return bundle


def load_heads(folder: Path, meta: dict[str, Any], tensors: dict[str, torch.Tensor], specs: dict[str, HeadSpec]
               ) -> tuple[dict[str, PerfMLP], dict[str, FeatureEncoder], PerfMLP | None]:
    """(heads, encoders, the config network or None) of a read folder (read_folder), each stored head built from
    its spec in `specs` (load: the registry's; perfmodel/migrate.py: those of the older layout too) and the
    config network's modes added; ArtifactError for a head `specs` does not know or a folder without a gemm head."""
    spec = spec_from_dict(meta.get("device_spec", {}))
    heads, encoders = {}, {}
    for name, hm in meta["heads"].items():
        if name not in specs:
            raise ArtifactError(f"{folder}: head {name!r} is not a registered head (perfmodel/heads/: "
                                f"{', '.join(REGISTRY)})")
        heads[name], encoders[name] = _load_head(folder, meta, name, hm, tensors, spec, specs[name])
    if "gemm" not in heads:
        raise ArtifactError(f"{folder}: no gemm head")
    return heads, encoders, _config_modes(folder / METADATA, meta, heads, encoders)


def read_folder(folder: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(metadata, the weights' tensors by stored key) of a model folder, the metadata's format, versions, weights
    checksum and devices checked."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not folder_exists(folder):  # ValueError naming path_or_uri where the OS cannot look (a name too long)
        raise FileNotFoundError(f"path_or_uri: no model folder at {folder}")
    meta_path, weights_path = folder / METADATA, folder / WEIGHTS
    for p in (meta_path, weights_path):
        if not p.is_file():
            raise FileNotFoundError(f"path_or_uri: {folder} has no {p.name}")
    try:
        meta = json.loads(meta_path.read_text())
    except RecursionError:  # valid JSON, nested deeper than the reader goes
        raise ArtifactError(f"{meta_path}: nested too deeply to read (not a perfmodel metadata file)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{meta_path}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ArtifactError(f"{meta_path}: not a {FORMAT} metadata file")
    _check_version(folder, meta, "schema_version", (SCHEMA_VERSION,))
    # A folder written with an older encoder version this code still encodes loads with that version's features.
    _check_version(folder, meta, "encoder_version", SUPPORTED_ENCODER_VERSIONS)
    try:
        check_metadata(meta)  # perfmodel/validation.py: every value a loader builds from, named where out of range
    except ValueError as exc:
        raise ArtifactError(f"{meta_path}: {exc}") from None
    if meta.get("weights_sha256") and meta["weights_sha256"] != sha256_file(weights_path):
        raise ArtifactError(f"{weights_path}: checksum differs from metadata.weights_sha256 (corrupt or edited)")
    _check_devices(meta_path, meta)
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ArtifactError(f"{weights_path}: unreadable weights ({exc})") from None
    if not isinstance(meta.get("heads"), dict):
        raise ArtifactError(f"{meta_path}: 'heads' is missing or not a mapping")
    return meta, tensors


def _check_devices(meta_path: Path, meta: dict[str, Any]) -> None:
    """A model of several devices: "devices" lists the device_specs' names, device_spec's first; each spec valid."""
    spec = spec_from_dict(meta.get("device_spec", {}))
    devices = meta.get("devices")
    if devices is None:
        return
    specs = meta.get("device_specs")
    if not isinstance(devices, list) or not devices or devices[0] != spec.name or not isinstance(specs, dict) \
            or set(specs) != set(devices):
        raise ArtifactError(f"{meta_path}: 'devices' must list the device_specs' names, device_spec's first")
    for d in specs.values():
        spec_from_dict(d)


def _load_head(folder: Path, meta: dict[str, Any], name: str, hm: Any, tensors: dict[str, torch.Tensor],
               device: Any, head_spec: HeadSpec) -> tuple[PerfMLP, FeatureEncoder]:
    """One stored head (eval mode) and its encoder, by its spec: its encoder kind and feature names checked
    against the spec's, its weights against its stored config."""
    try:
        enc = FeatureEncoder(device, hm.get("encoder_kind", head_spec.encoder), meta["encoder_version"])
        cfg = MLPConfig.from_dict(hm["mlp"])
        if "floor_features" not in hm["mlp"]:  # written before the field: the floor from the names
            cfg = MLPConfig.from_dict({**hm["mlp"], "floor_features": floor_features(enc.names, cfg.n_outputs)})
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ArtifactError(f"{folder}: head {name!r}: bad metadata ({exc!r})") from None
    names = head_spec.feature_names(enc.names, meta)
    if list(hm.get("features", [])) != names:
        raise ArtifactError(f"{folder}: head {name!r} was trained on features {hm.get('features')} "
                            f"but this encoder gives {names}")
    head = PerfMLP(cfg)
    sd = {k[len(name) + 1:]: v for k, v in tensors.items() if k.startswith(name + ".")}
    try:
        head.load_state_dict(expand_state(sd), strict=True)
    except RuntimeError as exc:
        raise ArtifactError(f"{folder / WEIGHTS}: head {name!r} does not match its config ({exc})") from None
    return head.eval(), enc


def _config_modes(meta_path: Path, meta: dict[str, Any], heads: dict[str, PerfMLP],
                  encoders: dict[str, FeatureEncoder]) -> PerfMLP | None:
    """A config network (metadata KERNEL_MODE_INPUT): its two modes added to heads (config_heads); returns the
    network as stored, None for a folder without one."""
    if KERNEL_MODE_INPUT not in meta:  # a stored INDUCTOR_GEMM is the inductor head (perfmodel/heads/inductor.py)
        return None
    if INDUCTOR_GEMM in heads:
        raise ArtifactError(f"{meta_path.parent}: head {INDUCTOR_GEMM!r} is stored beside a config network, whose "
                            "inductor mode it would replace: a folder holds one or the other")
    net = heads["gemm"]
    try:
        heads.update(config_heads(net, meta[KERNEL_MODE_INPUT]))
    except (TypeError, ValueError, AttributeError) as exc:
        raise ArtifactError(f"{meta_path}: {KERNEL_MODE_INPUT!r}: {exc}") from None
    encoders[INDUCTOR_GEMM] = encoders["gemm"]
    return net


def _check_roles(meta_path: Path, meta: dict[str, Any], heads: dict[str, PerfMLP],
                 encoders: dict[str, FeatureEncoder]) -> None:
    """The problem network's outputs (metadata "problem_outputs", cublas first) and the head that screens
    (metadata "screen_head"); the problem features' encoder kept by its kind, "cublas" (its callers' key)."""
    if PROBLEM in heads:
        outs = meta.get("problem_outputs")
        if not isinstance(outs, list) or len(outs) != heads[PROBLEM].cfg.n_outputs \
                or not set(outs) <= set(PROBLEM_OUTPUTS) or outs[:1] != ["cublas"]:
            raise ArtifactError(f"{meta_path}: 'problem_outputs' must name the problem head's "
                                f"{heads[PROBLEM].cfg.n_outputs} outputs, cublas first, from {PROBLEM_OUTPUTS}")
        encoders.setdefault("cublas", encoders[PROBLEM])
    if "screen_head" in meta and meta["screen_head"] not in SCREEN_HEADS:
        raise ArtifactError(f"{meta_path}: 'screen_head' must be one of {SCREEN_HEADS}, got {meta['screen_head']!r}")
    if meta.get("screen_head") == STUDENT and STUDENT not in heads:
        raise ArtifactError(f"{meta_path}: 'screen_head' is 'student' but the folder has no student head")


def _check_version(folder: Path, meta: dict[str, Any], key: str, supported: tuple[int, ...]) -> None:
    """Refuse a folder whose schema/encoder version is not one this code reads, saying which side is newer."""
    got = meta.get(key)
    if isinstance(got, int) and not isinstance(got, bool) and got in supported:
        return
    want = max(supported)
    by = meta.get("package_version")
    written = f"written by perfmodel {by}" if by else "written by an unrecorded perfmodel version"
    if isinstance(got, int) and not isinstance(got, bool) and got > want:
        raise ArtifactError(f"{folder}: {key} {got} is newer than this code's {key} {want} ({written}, this is "
                            f"perfmodel {__version__}); upgrade perfmodel to load this model")
    need = want if len(supported) == 1 else f"one of {', '.join(map(str, supported))}"
    raise ArtifactError(f"{folder}: {key} is {got!r}, this code needs {need} ({written}, this is perfmodel "
                        f"{__version__}); retrain the model with this version, or load it with the one that wrote it")


