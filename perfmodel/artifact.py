"""The model folder: weights (safetensors), metadata.json, model.onnx and a model card.

Everything a loader needs -- head configs, feature names, normalisation (inside the weights), device
spec, schema and encoder versions -- is read from the folder, never from constants in code. A folder
whose schema, encoder version or feature names differ from this code's is refused.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch

from ._version import __version__
from .devices import DeviceSpec
from .features import ENCODER_VERSION, SUPPORTED_ENCODER_VERSIONS, FeatureEncoder
from .model import MLPConfig, PerfMLP, diagonal_blocks, floor_features
from .ranking import refines, screened_rank
from .schema import SCHEMA_VERSION
from .validation import check_metadata, folder_exists, follow_umask

FORMAT = "perfmodel-artifact"
WEIGHTS = "model.safetensors"
METADATA = "metadata.json"
ONNX = "model.onnx"
HEADS = ("gemm", "cublas", "pad", "screen", "student", "static", "call", "call_static", "problem", "bmm",
         "bmm_aten", "bmm_call")  # all but gemm are optional
# The head that predict / predict_many serve when a folder has it: one MLP distilled from the gemm head
# (perfmodel distill, train/distill.py); a folder without it predicts with the gemm head.
STUDENT = "student"
# The head that screens the ranking (metadata "screen_head"): "screen", a small head of its own (the default),
# or the student, which then serves both speed jobs, the screen and predict (one speed head;
# docs/model.md, "The speed heads").
SCREEN = "screen"
SCREEN_HEADS = (SCREEN, STUDENT)
# The head whose output, added to the gemm head's score, gives the times of the kernel compiled for one
# problem's shape, as Inductor compiles its mm template (perfmodel static-head, train/static_head.py;
# Predictor.load(kernel="inductor")). Only its score is served.
STATIC = "static"
# The cuBLAS call heads (perfmodel call-head, train/call_head.py): per problem, log(cuBLAS ms / the best
# Triton config's ms) on the cuBLAS head's features, for the dataset's kernel (kernel="autotune") and the
# static one (kernel="inductor"); below 0, cuBLAS wins (Candidates.prefer_cublas). Only their score is served.
CALL = "call"
CALL_STATIC = "call_static"
# The problem network (perfmodel problem-head, train/problem_head.py): one MLP on the cuBLAS head's features
# in place of the cublas, call and call_static heads, one output each (metadata "problem_outputs" names
# them, in column order): torch.mm's log ms (floored as the cuBLAS head is), then the call margins (their
# score served). problem_output() gives each output as the head it replaces; a folder of the old layout
# has those heads themselves.
PROBLEM = "problem"
PROBLEM_OUTPUTS = ("cublas", CALL, CALL_STATIC)


class OutputColumn(torch.nn.Module):
    """One output of a multi-output head, served as a head of one output: score(x) and forward(x) are the
    head's column `column` (forward: after the head's floors)."""

    def __init__(self, head: PerfMLP, column: int) -> None:
        super().__init__()
        self.head, self.column = head, column

    @property
    def cfg(self) -> MLPConfig:
        return replace(self.head.cfg, n_outputs=1)

    def score(self, x: torch.Tensor) -> torch.Tensor:
        return self.head.score(x)[:, self.column]

    def floor(self, score: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """score (this column's) -> log ms, by the head's floors of the column."""
        full = torch.zeros(score.shape[0], self.head.cfg.n_outputs, dtype=score.dtype)
        full[:, self.column] = score
        return self.head.floor(full, x)[:, self.column]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)[:, self.column]


def problem_columns(bundle: "ModelBundle") -> dict[str, int]:
    """{output name: column} of the bundle's problem network (metadata "problem_outputs"); {} without one."""
    if PROBLEM not in bundle.heads:
        return {}
    names = list(bundle.metadata.get("problem_outputs") or [])
    return {n: i for i, n in enumerate(names)}


def problem_output(bundle: "ModelBundle", name: str) -> "PerfMLP | OutputColumn | None":
    """The head that gives `name` (one of PROBLEM_OUTPUTS): the folder's own head of that name (the old
    layout), else that column of the problem network, else None (the model has no such output)."""
    if name in bundle.heads:
        return bundle.heads[name]
    col = problem_columns(bundle).get(name)
    return None if col is None else OutputColumn(bundle.heads[PROBLEM], col)
# The batched GEMM (torch.bmm / baddbmm) heads (perfmodel bmm-head, train/bmm_head.py): log ms of a config of
# Inductor's bmm template as Inductor compiles it, on the "bmm" encoder; and log ms of aten::bmm, on the
# "bmm_aten" encoder; and the bmm call head, per problem log(aten::bmm ms / the best Triton config's ms) on the
# "bmm_aten" encoder (below 0, aten::bmm wins; only its score is served). The Predictor serves a GemmProblem
# with batch > 1 by them.
BMM = "bmm"
BMM_ATEN = "bmm_aten"
BMM_CALL = "bmm_call"
# The config network (docs/model.md, "The config network"): a gemm head with one input more, the kernel mode
# (metadata "kernel_mode_input": {mode: the input's value}), trained on the dataset's rows (autotune) and the
# static rows (inductor) together, in place of the gemm head and the static head. The folder stores it once,
# as "gemm"; a loaded bundle serves it as two heads of the gemm encoder's features, each with the mode held at
# its value (PerfMLP.with_input): "gemm" (kernel="autotune") and INDUCTOR_GEMM (kernel="inductor"), which
# ranks and predicts the inductor mode in place of the gemm head plus the static head.
KERNEL_MODE_INPUT = "kernel_mode_input"
KERNEL_MODE_FEATURE = "kernel_mode"
INDUCTOR_GEMM = "gemm_inductor"


def inductor_head(heads: Any) -> str | None:
    """How a model serves kernel="inductor": INDUCTOR_GEMM (a config network's inductor mode, in place of the
    gemm head), STATIC (the static head's output added to the gemm head's), or None (autotune only)."""
    return INDUCTOR_GEMM if INDUCTOR_GEMM in heads else STATIC if STATIC in heads else None


def inductor_mode(heads: dict[str, Any]) -> Any:
    """The head named by inductor_head(heads) (a config network's inductor mode, or the static head), or None."""
    name = inductor_head(heads)
    return heads[name] if name else None


def with_static(score: torch.Tensor, static: torch.Tensor,
                floor: "Callable[[torch.Tensor], torch.Tensor] | None" = None) -> torch.Tensor:
    """kernel="inductor", the one rule: a gemm (or student) head's score or log ms plus the static head's
    output on the same rows, then `floor` (the gemm head's physical floor on those rows; None for a
    ranking score that is never floored, as the lead member's). The Predictor's torch path and the ONNX
    graphs (export_onnx) both call it."""
    out = score + static.to(score.dtype)
    return out if floor is None else floor(out)
# Configs per problem that the gemm head scores after the screen head (metadata "screen_keep").
DEFAULT_SCREEN_KEEP = 48


class ArtifactError(ValueError):
    """A model folder that is corrupt or does not match this code."""


@dataclass
class ModelBundle:
    spec: DeviceSpec
    heads: dict[str, PerfMLP]
    encoders: dict[str, FeatureEncoder]
    metadata: dict[str, Any] = field(default_factory=dict)
    # the config network as trained (a gemm head with the kernel-mode input, metadata KERNEL_MODE_INPUT), which
    # save() writes as "gemm"; heads["gemm"] and heads[INDUCTOR_GEMM] are its two modes. None: no such network.
    config_net: PerfMLP | None = None

    @property
    def pad_threshold(self) -> float:
        return float(self.metadata.get("pad_threshold", 1.0))

    @property
    def screen_keep(self) -> int:
        """How many configs per problem the gemm head scores after the screen head."""
        return int(self.metadata.get("screen_keep", DEFAULT_SCREEN_KEEP))

    @property
    def screen_name(self) -> str | None:
        """The head that screens the ranking (metadata "screen_head", default "screen"), None where the
        folder has no such head (rank then scores every config with the gemm head)."""
        return screen_name(self.heads, self.metadata)

    @property
    def lead_keep(self) -> int:
        """How many of the screen's screen_keep configs the gemm ensemble's lead member passes on to the
        whole ensemble (metadata "lead_keep"; 0, or a folder written before the field: none, the
        ensemble scores all screen_keep). perfmodel.ranking.screened_rank."""
        return int(self.metadata.get("lead_keep", 0))

    @property
    def devices(self) -> tuple[str, ...]:
        """The device specs the model was trained for, its default first (metadata "devices"; a model
        of one device, or written before the field: its spec)."""
        return tuple(self.metadata.get("devices") or (self.spec.name,))

    @property
    def device_specs(self) -> dict[str, DeviceSpec]:
        """Each trained device's DeviceSpec, as stored in the artifact (metadata "device_specs")."""
        stored = self.metadata.get("device_specs") or {}
        return {name: (spec_from_dict(stored[name]) if name in stored else self.spec) for name in self.devices}

    def for_device(self, name: str) -> "ModelBundle":
        """The same heads with encoders for another device the model was trained for: the device
        features (and every feature derived from the spec) are that device's. ValueError naming the
        device for one the model does not know."""
        if name == self.spec.name:
            return self
        if name not in self.devices:
            raise ValueError(f"device: this model was trained for {', '.join(self.devices)}, not {name!r}")
        spec = self.device_specs[name]
        encoders = {h: FeatureEncoder(spec, enc.kind, enc.version) for h, enc in self.encoders.items()}
        return ModelBundle(spec, self.heads, encoders, self.metadata, self.config_net)


def onnx_file(bundle: ModelBundle, device: str | None = None) -> str:
    """The ONNX file of a model folder that serves `device` (default: the bundle's): model.onnx for the
    model's default device, model.<device>.onnx for each other one. The heads' graph is the same in each
    (it takes encoded rows); the ranking graph encodes problems and configs with that device's spec."""
    device = bundle.spec.name if device is None else device
    return ONNX if device == bundle.devices[0] else f"model.{device}.onnx"


def spec_from_dict(d: dict[str, Any]) -> DeviceSpec:
    try:
        return DeviceSpec(**d)
    except TypeError as exc:
        raise ArtifactError(f"metadata.device_spec: {exc}") from None


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
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    heads_meta = {}
    modes = bundle.config_net is not None
    if modes != (INDUCTOR_GEMM in bundle.heads) or modes != (KERNEL_MODE_INPUT in bundle.metadata) \
            or (modes and STATIC in bundle.heads):
        raise ArtifactError(f"config_net: a config network needs its {INDUCTOR_GEMM!r} head and metadata "
                            f"{KERNEL_MODE_INPUT!r}, and no static head (set config_network())")
    for name, head in bundle.heads.items():
        if name == INDUCTOR_GEMM:  # a mode of the config network, written once as "gemm"
            continue
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
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    if not folder_exists(folder):
        raise FileNotFoundError(f"path_or_uri: no model folder at {folder}")
    meta_path, weights_path = folder / METADATA, folder / WEIGHTS
    for p in (meta_path, weights_path):
        if not p.is_file():
            raise FileNotFoundError(f"path_or_uri: {folder} has no {p.name}")
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nested too deeply
        raise ArtifactError(f"{meta_path}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ArtifactError(f"{meta_path}: not a {FORMAT} metadata file")
    _check_version(folder, meta, "schema_version", (SCHEMA_VERSION,))
    # A folder written with an older encoder version this code still encodes loads with that version's features.
    _check_version(folder, meta, "encoder_version", SUPPORTED_ENCODER_VERSIONS)
    version = meta["encoder_version"]
    try:
        check_metadata(meta)
    except ValueError as exc:
        raise ArtifactError(f"{meta_path}: {exc}") from None
    if meta.get("weights_sha256") and meta["weights_sha256"] != sha256_file(weights_path):
        raise ArtifactError(f"{weights_path}: checksum differs from metadata.weights_sha256 (corrupt or edited)")
    spec = spec_from_dict(meta.get("device_spec", {}))
    devices = meta.get("devices")
    if devices is not None:  # a model of several devices: the default first, each one's spec stored
        specs = meta.get("device_specs")
        if not isinstance(devices, list) or not devices or devices[0] != spec.name or not isinstance(specs, dict) \
                or set(specs) != set(devices):
            raise ArtifactError(f"{meta_path}: 'devices' must list the device_specs' names, device_spec's first")
        for d in specs.values():
            spec_from_dict(d)
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ArtifactError(f"{weights_path}: unreadable weights ({exc})") from None
    heads, encoders = {}, {}
    if not isinstance(meta.get("heads"), dict):
        raise ArtifactError(f"{meta_path}: 'heads' is missing or not a mapping")
    for name, hm in meta["heads"].items():
        try:
            enc = FeatureEncoder(spec, hm.get("encoder_kind", name), version)
            cfg = MLPConfig.from_dict(hm["mlp"])
            if "floor_features" not in hm["mlp"]:  # written before the field: the floor from the names
                cfg = replace(cfg, floor_features=floor_features(enc.names, cfg.n_outputs))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ArtifactError(f"{folder}: head {name!r}: bad metadata ({exc!r})") from None
        names = enc.names + ([KERNEL_MODE_FEATURE] if name == "gemm" and KERNEL_MODE_INPUT in meta else [])
        if list(hm.get("features", [])) != names:
            raise ArtifactError(f"{folder}: head {name!r} was trained on features {hm.get('features')} "
                                f"but this encoder gives {names}")
        head = PerfMLP(cfg)
        sd = {k[len(name) + 1:]: v for k, v in tensors.items() if k.startswith(name + ".")}
        try:
            head.load_state_dict(expand_state(sd), strict=True)
        except RuntimeError as exc:
            raise ArtifactError(f"{weights_path}: head {name!r} does not match its config ({exc})") from None
        heads[name], encoders[name] = head.eval(), enc
    if "gemm" not in heads:
        raise ArtifactError(f"{folder}: no gemm head")
    net = None
    if KERNEL_MODE_INPUT in meta:
        net = heads["gemm"]
        try:
            heads.update(config_heads(net, meta[KERNEL_MODE_INPUT]))
        except (TypeError, ValueError, AttributeError) as exc:
            raise ArtifactError(f"{meta_path}: {KERNEL_MODE_INPUT!r}: {exc}") from None
        encoders[INDUCTOR_GEMM] = encoders["gemm"]
        if STATIC in heads:
            raise ArtifactError(f"{meta_path}: a config network ({KERNEL_MODE_INPUT!r}) and a static head: one "
                                "serves kernel='inductor'")
    elif INDUCTOR_GEMM in heads:
        raise ArtifactError(f"{folder}: head {INDUCTOR_GEMM!r} is a mode of a config network, not stored")
    if PROBLEM in heads:
        outs = meta.get("problem_outputs")
        if not isinstance(outs, list) or len(outs) != heads[PROBLEM].cfg.n_outputs \
                or not set(outs) <= set(PROBLEM_OUTPUTS) or outs[:1] != ["cublas"]:
            raise ArtifactError(f"{meta_path}: 'problem_outputs' must name the problem head's "
                                f"{heads[PROBLEM].cfg.n_outputs} outputs, cublas first, from {PROBLEM_OUTPUTS}")
    if PROBLEM in heads:  # the problem features' encoder by its kind, as the cuBLAS head's (its callers' key)
        encoders.setdefault("cublas", encoders[PROBLEM])
    if meta.get("screen_head", SCREEN) not in SCREEN_HEADS:
        raise ArtifactError(f"{meta_path}: 'screen_head' must be one of {SCREEN_HEADS}, got {meta['screen_head']!r}")
    if meta.get("screen_head", SCREEN) == STUDENT and (SCREEN in heads or STUDENT not in heads):
        raise ArtifactError(f"{meta_path}: 'screen_head' is 'student' but the folder has "
                            + ("no student head" if STUDENT not in heads else "a screen head too"))
    bundle = ModelBundle(spec, heads, encoders, meta, net)
    try:
        check_lead_keep(bundle, meta.get("lead_keep", 0), meta.get("screen_keep", DEFAULT_SCREEN_KEEP))
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"{meta_path}: {exc}") from None
    return bundle


KERNEL_MODE_VALUES = {"autotune": 0.0, "inductor": 1.0}   # the kernel-mode input's values, as trained


def config_heads(net: PerfMLP, values: Any) -> dict[str, PerfMLP]:
    """{"gemm": net's autotune mode, INDUCTOR_GEMM: its inductor mode}: net (a gemm head whose last input is
    the kernel mode) with that input held at values[mode] (PerfMLP.with_input). ValueError naming the field."""
    if not isinstance(values, dict) or set(values) != set(KERNEL_MODE_VALUES) \
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values.values()):
        raise ValueError(f"expected {{mode: value}} for the modes {sorted(KERNEL_MODE_VALUES)}, got {values!r}")
    col = net.cfg.n_inputs - 1
    return {"gemm": net.with_input(col, values["autotune"]), INDUCTOR_GEMM: net.with_input(col, values["inductor"])}


def config_network(bundle: ModelBundle, net: PerfMLP) -> ModelBundle:
    """bundle serving the config network net (a gemm head with the kernel-mode input last, trained with
    KERNEL_MODE_VALUES) in place of its gemm head (and any static head); changed in place and returned."""
    bundle.heads.pop(STATIC, None)
    bundle.encoders.pop(STATIC, None)
    bundle.heads.update(config_heads(net, KERNEL_MODE_VALUES))
    bundle.encoders[INDUCTOR_GEMM] = bundle.encoders["gemm"]
    bundle.metadata = {**bundle.metadata, KERNEL_MODE_INPUT: dict(KERNEL_MODE_VALUES)}
    bundle.config_net = net
    return bundle


def screen_name(heads: Any, metadata: dict[str, Any]) -> str | None:
    """The name of the head that screens (metadata "screen_head", one of SCREEN_HEADS, default "screen") where
    heads has it, else None."""
    name = metadata.get("screen_head", SCREEN)
    return name if name in heads else None


def check_lead_keep(bundle: ModelBundle, lead_keep: Any, screen_keep: Any) -> None:
    """ValueError/TypeError naming lead_keep unless it is 0, or 1 <= lead_keep < screen_keep on a model whose
    gemm head has a lead (PerfMLP.has_lead) and that has a screen head."""
    for name, v in (("lead_keep", lead_keep), ("screen_keep", screen_keep)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name}: expected an int, got {type(v).__name__} ({v!r})")
    if lead_keep == 0:
        return
    if not 1 <= lead_keep < screen_keep:
        raise ValueError(f"lead_keep: must be 0 (none) or from 1 to screen_keep - 1 ({screen_keep - 1}), got {lead_keep}")
    if bundle.screen_name is None or not bundle.heads["gemm"].has_lead:
        raise ValueError("lead_keep: needs a screen head and a gemm ensemble averaged after the floor "
                         f"(this model's gemm head has {bundle.heads['gemm'].cfg.members} member(s)); use 0")


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


def code_commit() -> str:
    """`git rev-parse HEAD` of the checkout this package runs from, with "-dirty" where its tracked files
    differ from that commit; "unknown" outside a checkout or without git."""
    import subprocess

    from .locations import checkout_root

    root = checkout_root()
    if root is None:
        return "unknown"
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if out.returncode != 0 or not out.stdout.strip():
        return "unknown"
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                            text=True, timeout=30)
    return out.stdout.strip() + ("-dirty" if status.returncode != 0 or status.stdout.strip() else "")


def step_record(name: str, settings: dict[str, Any], seconds: float, refit: bool = False,
                command: str = "") -> dict[str, Any]:
    """One step of a folder's build record (metadata "build", written by `perfmodel build`): its name,
    settings and wall time; a refit -- a command that changes a built folder -- also its command, the code
    commit and when it ran."""
    import time

    rec: dict[str, Any] = {"step": name, "settings": settings, "seconds": round(float(seconds), 3)}
    if refit:
        rec.update({"refit": True, "command": command, "commit": code_commit(),
                    "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "package_version": __version__})
    return rec


def append_step(meta: dict[str, Any], step: dict[str, Any]) -> dict[str, Any]:
    """meta with step appended to its build record (a folder written before build records: a record of
    its refits only). Every command that rewrites a model folder appends its step (step_record)."""
    build = dict(meta.get("build") or {"recipe": None, "steps": []})
    build["steps"] = [*build.get("steps", []), step]
    return {**meta, "build": build}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class _OnnxHeads(torch.nn.Module):
    """All heads in one graph: per head one input <head>_x and two outputs, <head>_log_ms and
    <head>_score (its output before the floors, which ranking sorts by: PerfMLP.score). Then, on
    `rank_problems` x `rank_configs` (RANK_INPUTS, the GEMM encoding inside the graph): with a screen
    head, the whole screened ranking (RANK_OUTPUTS), traced from perfmodel.ranking.screened_rank -- the
    screen on every config, the gemm head on its best `keep` per problem; and what predict serves
    (PREDICT_OUTPUTS): the log ms of every config by the student head (else the gemm head). With a static
    head, the same two for kernel="inductor" (RANK_STATIC_OUTPUTS, PREDICT_STATIC_OUTPUTS): the static
    head's output added by with_static wherever the Predictor's torch path adds it; with a config network
    (heads holding INDUCTOR_GEMM), the same two by its inductor mode in place of the gemm head (predict: that
    mode on every config). One onnxruntime call each, where the torch backend dispatches ~100 small ops."""

    def __init__(self, heads: dict[str, PerfMLP], encoder: FeatureEncoder, keep: int = 0, lead_keep: int = 0,
                 screen: str | None = SCREEN) -> None:
        super().__init__()
        self.names = list(heads)
        self.heads = torch.nn.ModuleList(heads[n].for_onnx() for n in self.names)
        self.encoder, self.keep, self.lead_keep = encoder, keep, lead_keep
        self.gemm = self.heads[self.names.index("gemm")]
        self.rank = screen in self.names  # screen: the head that screens (ModelBundle.screen_name)
        if self.rank:
            self.screen = self.heads[self.names.index(screen)]
        self.predict = self.heads[self.names.index(predict_head(self.names))]
        self.static = self.heads[self.names.index(STATIC)] if STATIC in self.names else None
        # a config network's inductor mode: the inductor graphs rank and predict with it in place of gemm + static
        self.inductor = self.heads[self.names.index(INDUCTOR_GEMM)] if INDUCTOR_GEMM in self.names else None

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = len(self.names)
        out = tuple(h(x) for h, x in zip(self.heads, xs[:n]))
        out = out + tuple(h.score(x) for h, x in zip(self.heads, xs[:n]))
        problems, configs, cfg_part, cfg_smem = xs[n:]
        n_prob, n_cfg = problems.shape[0], configs.shape[0]
        # The encoding's three parts: cross (P, C, 8), config part (1, C, F), problem part (P, 1, F); the
        # features of a row are cross @ cross_map + config part + problem part.
        cross, cpart, ppart = _cross_parts_by_tile(self.encoder, problems, configs, cfg_part, cfg_smem)
        cmap = self.encoder.cross_map
        x = (cross @ cmap + cpart + ppart).reshape(n_prob * n_cfg, cmap.shape[1])    # (P * C, F)

        def score_all(head: PerfMLP, fused: bool = False) -> torch.Tensor:
            """head.score on every (problem, config) row, (P * C,). A plain Linear/ReLU head's first Linear
            is taken through the sum: the 8 cross columns by (cross_map W^T), the config part once per
            config, the problem part once per problem -- no (P * C, F) features or product (the same
            result, to float rounding). fused (the ranking graph's screen, which has problems and configs;
            returned (P * C, 1), for the caller's one reshape):
            the config and problem parts summed first, then one Gemm of the cross columns onto that sum,
            which onnxruntime fuses with the ReLU after it (one node for the 3-D MatMul, two Adds, Reshape
            and Relu; ~5 % of a one-problem rank)."""
            first = _first_linear(head)
            if first is None:
                return head.score(x)
            w = first.weight.t()
            if fused:
                parts = (cpart @ w + (ppart @ w + first.bias)).reshape(-1, w.shape[1])        # (P * C, H)
                h = torch.addmm(parts, cross.reshape(-1, cmap.shape[0]), cmap @ w)
                return head.net[1:](h)                                                  # (P * C, 1)
            h = cross @ (cmap @ w) + cpart @ w + (ppart @ w + first.bias)
            return head.net[1:](h.reshape(n_prob * n_cfg, w.shape[1])).reshape(n_prob * n_cfg)

        def physical_floor(head: PerfMLP) -> Callable[[torch.Tensor], torch.Tensor]:
            """head.physical_floor on every row (its first output), from the encoding's parts: the log
            roofline is a problem column (cross and config parts are 0 there); no (P * C, F) features."""
            col = head.cfg.floor_features[0] if head.cfg.floor_features else -1
            if col < 0:
                return lambda v: v
            low = (cross @ cmap[:, col:col + 1] + cpart[..., col:col + 1] + ppart[..., col:col + 1])
            return lambda v: torch.maximum(v, low.reshape(n_prob * n_cfg))

        # predict: every row's log ms; its floors read one problem feature column (the log roofline)
        z = score_all(self.predict)
        if _first_linear(self.predict) is None:
            pred = self.predict.floor(z, x)
        else:
            pred = physical_floor(self.predict)(self.predict.overhead_floor(z.unsqueeze(-1)))
        # every size explicit: onnxruntime cannot infer a -1 in an empty tensor
        out = out + (pred.reshape(n_prob, n_cfg),)
        if self.static is not None:  # kernel="inductor": the static head's output, then the gemm head's floor
            out = out + (with_static(pred, score_all(self.static), physical_floor(self.gemm)).reshape(n_prob, n_cfg),)
        elif self.inductor is not None:  # kernel="inductor" of a config network: its inductor mode on every row
            out = out + (self.inductor.floor(self.inductor.score(x), x).reshape(n_prob, n_cfg),)
        if not self.rank:
            return out
        # The ranking graph always has problems and more than 2 * keep configs (Predictor runs it only
        # then): a -1 in its shapes is safe, and saves the Shape/Gather/Concat nodes of explicit sizes.
        screen = score_all(self.screen, fused=True).reshape(-1, n_cfg)                  # (P, C)
        cpart2, width = cpart.reshape(n_cfg, -1), cmap.shape[1]

        def rows(cand: torch.Tensor | None) -> torch.Tensor:
            if cand is None:
                return x
            # only the kept rows' features: cand (P, n), each problem's kept configs. Each problem's cross
            # rows gathered in place (GatherElements; the index broadcast to the 8 cross columns by adding
            # zeros), the config parts by index, the problem part by broadcasting: the same sums as the
            # (P * C, F) features' rows
            idx = cand.unsqueeze(-1) + torch.zeros(1, 1, cmap.shape[0], dtype=cand.dtype)
            return torch.gather(cross, 1, idx) @ cmap + cpart2[cand] + ppart                # (P, n, F)

        scored: list[torch.Tensor] = []  # the features the lead scored, (P, keep, F)

        def ranking(head: PerfMLP, static: PerfMLP | None) -> tuple[torch.Tensor, torch.Tensor]:
            """screened_rank for a kernel mode: by the gemm head `head` (the gemm head, or a config network's
            inductor mode), with static None, or the static head whose output with_static adds to the lead's
            and the gemm head's scores (inductor)."""
            def lead(cand: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                scored.append(rows(cand))
                xr = scored[-1].reshape(-1, width)
                score, outputs = head.lead_score(xr)
                return (score if static is None else with_static(score, static.score(xr))), outputs

            def gemm(cand: torch.Tensor | None, lead: tuple[torch.Tensor, torch.Tensor] | None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
                if lead is None:
                    xr = rows(cand).reshape(-1, width) if cand is not None else x
                    score = head.score(xr)
                else:  # the picked rows' features gathered from those the lead scored, not computed again
                    out, pick = lead
                    idx = pick.unsqueeze(-1) + torch.zeros(1, 1, width, dtype=pick.dtype)
                    xr = torch.gather(scored[-1], 1, idx).reshape(-1, width)
                    score = head.score_with_lead(xr, out.reshape(-1))
                if static is None:
                    return score, head.floor(score, xr)
                score = with_static(score, static.score(xr))
                return score, head.physical_floor(score, xr)

            # traced with k = the longest ranking the rule gives in one pass: lead_keep when the lead refines
            k = self.lead_keep if refines(self.lead_keep, self.keep, self.lead_keep) else self.keep
            return screened_rank(gemm, n_prob, n_cfg, screen, self.keep, k, by_config=True,
                                 lead=lead, lead_keep=self.lead_keep)

        out = out + ranking(self.gemm, None)
        if self.inductor is not None:
            return out + ranking(self.inductor, None)
        return out if self.static is None else out + ranking(self.gemm, self.static)


# Tile sizes and group_m below this make an exact float64 key of the four (BLOCK_M/N/K, GROUP_M): 9000**4 < 2**53.
_TILE_KEY_BASE = 9000.0


def _distinct_tiles(configs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(first, inverse) of a config set (C, 6) over its distinct (block_m, block_n, block_k, group_m): the
    index of one config of each distinct four (U,), and each config's position among them (C,), so that
    configs[first][inverse] has the configs' four columns. Every config its own group when the four are
    not small non-negative integers (no exact key). Reads only the configs: the graph's config stage."""
    four = configs[:, 0:4]
    base = four.max() + 1
    key = ((four[:, 0] * base + four[:, 1]) * base + four[:, 2]) * base + four[:, 3]
    n = configs.shape[0]
    exact = (base < _TILE_KEY_BASE) & (four >= 0).all() & (four == four.floor()).all()
    key = torch.where(exact, key, torch.arange(n, dtype=key.dtype))
    if torch.onnx.is_in_onnx_export():  # equal keys end up adjacent in any sort
        order = torch.topk(key, n, largest=False, sorted=True)[1]
    else:
        order = torch.sort(key, stable=True)[1]
    skey = key[order]
    new = torch.cat([torch.ones(1, dtype=torch.bool), skey[1:] != skey[:-1]])
    group = torch.cumsum(new.to(torch.int64), 0) - 1                                   # per sorted config
    inverse = torch.zeros_like(order).scatter(0, order, group)
    return order[new.nonzero().squeeze(1)], inverse


def _cross_parts_by_tile(encoder: FeatureEncoder, problems: torch.Tensor, configs: torch.Tensor,
                         cfg_part: torch.Tensor, cfg_smem: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """encoder.cross_parts(problems, configs, (cfg_part, cfg_smem)), bit for bit, for the ONNX graph: the
    cross columns that depend on a config only through its (block_m, block_n, block_k, group_m) -- tile
    counts, loads, waves, their logs -- computed once per distinct four (120 of 368 in serve_latency's
    sample) and gathered to the configs; the last, shared memory x dtype bytes, per config. The same
    elementwise float64 operations on the same values, then the same float32 cast."""
    first, inverse = _distinct_tiles(configs)
    cross, _, ppart = encoder.cross_parts(problems, configs[first], (cfg_part[first], cfg_smem[first]))
    db = problems[:, None, 3:4].to(torch.float64)                                       # (P, 1, 1)
    smem = (cfg_smem.unsqueeze(0) * db).to(torch.float32)                               # (P, C, 1)
    return torch.cat([cross[..., :-1].index_select(1, inverse), smem], -1), cfg_part.unsqueeze(0), ppart


def _first_linear(head: PerfMLP) -> torch.nn.Linear | None:
    """The first Linear of a served (folded) single head whose score is its net's output -- a plain
    Linear, ReLU, ... chain -- else None."""
    net = head.net
    if not getattr(head, "_norm_folded", False) or head.floors_each_member or head.cfg.n_outputs != 1 \
            or not isinstance(net, torch.nn.Sequential) or not isinstance(net[0], torch.nn.Linear):
        return None
    return net[0]


def predict_head(names) -> str:
    """The head that predict / predict_many serve: the student when the model has one, else gemm."""
    return STUDENT if STUDENT in names else "gemm"


RANK_INPUTS = ("rank_problems", "rank_configs", "rank_config_part", "rank_config_smem")
# Per problem, the screen's best `keep` configs (indices) and their log ms by the gemm head, fastest
# first, ties in config order (perfmodel.ranking.screened_rank); with a lead (lead_keep), the lead's
# best lead_keep of them.
RANK_OUTPUTS = ("rank_kept", "rank_log_ms")
# (P, C) log ms of every problem with every config by predict_head(); from RANK_INPUTS. A model.onnx
# written before it has none (the predictor then encodes in torch and runs the head's own graph).
PREDICT_OUTPUTS = ("predict_log_ms",)
# The same two for kernel="inductor" (with_static, or a config network's inductor mode), in the graph of a
# model with a static head or a config network. A model.onnx written before them serves kernel="autotune" only.
RANK_STATIC_OUTPUTS = ("rank_static_kept", "rank_static_log_ms")
PREDICT_STATIC_OUTPUTS = ("predict_static_log_ms",)


def export_onnx_all(bundle: ModelBundle, folder: Path) -> list[Path]:
    """Every device's ONNX file of a model folder (onnx_file): one for a model of one device."""
    return [export_onnx(bundle.for_device(d), Path(folder) / onnx_file(bundle, d)) for d in bundle.devices]


def export_onnx(bundle: ModelBundle, path: Path) -> Path:
    """A single-file ONNX graph (no external data) with inputs <head>_x and outputs <head>_log_ms and
    <head>_score; from RANK_INPUTS, predict's log ms (PREDICT_OUTPUTS) and, when the bundle has a screen
    head, the screened ranking (RANK_OUTPUTS) -- with a static head or a config network both again for kernel="inductor"
    (PREDICT_STATIC_OUTPUTS, RANK_STATIC_OUTPUTS) -- all for the bundle's device (its spec's constants are folded
    into the graph's encoder: export_onnx_all writes one file per device)."""
    keep = bundle.screen_keep
    enc = bundle.encoders["gemm"]
    mod = _OnnxHeads(bundle.heads, enc, keep, bundle.lead_keep, bundle.screen_name).eval()
    xs = tuple(torch.randn(4, len(bundle.encoders[n])) for n in mod.names)
    names_in = [f"{n}_x" for n in mod.names]
    names_out = [f"{n}_log_ms" for n in mod.names] + [f"{n}_score" for n in mod.names]
    # One batch dimension per head: a shared name would force every input to the same row count.
    axes = {**{f"{n}_x": {0: f"{n}_batch"} for n in mod.names}, **{f"{n}_log_ms": {0: f"{n}_batch"} for n in mod.names},
            **{f"{n}_score": {0: f"{n}_batch"} for n in mod.names}}
    # traced with 2 problems and 3 * keep configs, so that neither count is frozen at 1
    gen = torch.Generator().manual_seed(0)
    problems = torch.tensor([[4096.0, 4096, 4096, 2, 0, 0, 0, 0], [1000.0, 37, 129, 4, 0, 1, 1, 0]], dtype=torch.float64)
    configs = torch.tensor([16.0, 32, 64, 128, 256], dtype=torch.float64)[torch.randint(0, 5, (3 * keep, 3), generator=gen)]
    configs = torch.cat([configs, torch.tensor([[8.0, 3, 4]], dtype=torch.float64).expand(3 * keep, 3)], 1)
    xs = xs + (problems, configs, *enc.config_part(configs))
    names_in += list(RANK_INPUTS)
    static = mod.static is not None or mod.inductor is not None
    names_out += list(PREDICT_OUTPUTS) + (list(PREDICT_STATIC_OUTPUTS) if static else [])
    names_out += (list(RANK_OUTPUTS) + (list(RANK_STATIC_OUTPUTS) if static else [])) if mod.rank else []
    axes.update({"rank_problems": {0: "rank_p"}, "rank_configs": {0: "rank_c"}, "rank_config_part": {0: "rank_c"},
                 "rank_config_smem": {0: "rank_c"}, "rank_kept": {0: "rank_p"}, "rank_log_ms": {0: "rank_p"},
                 "predict_log_ms": {0: "rank_p", 1: "rank_c"}, "rank_static_kept": {0: "rank_p"},
                 "rank_static_log_ms": {0: "rank_p"}, "predict_static_log_ms": {0: "rank_p", 1: "rank_c"}})
    axes = {name: a for name, a in axes.items() if name in names_in or name in names_out}
    torch.onnx.export(mod, xs, str(path), input_names=names_in, output_names=names_out,
                      dynamic_axes=axes, opset_version=17, dynamo=False)
    return Path(path)
