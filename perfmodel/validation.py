"""The edges of a model folder: its metadata's values checked before anything is built from them
(check_metadata), a path that cannot be looked at refused by name (folder_exists), and a written
folder's modes as the umask says (follow_umask).

check_metadata raises ValueError naming the field ("device_spec.sm_count", "heads.gemm.mlp.hidden",
"pad_threshold", ...); perfmodel.artifact.load wraps it in an ArtifactError with the file's path. A value
out of range is refused, never clamped: a NaN or negative pad_threshold would flip every pad decision,
a non-positive SM count or overhead would reach a log() deep in the encoder.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

# Metadata nested deeper than this is refused before anything walks it (the shipped folders' depth is 6;
# a hostile file a thousand levels deep would otherwise end in a RecursionError in whatever reads it).
MAX_DEPTH = 32
# The keys of a device spec's flop_per_sm_clk (perfmodel.devices.DeviceSpec.peak_flops reads them).
FLOP_KEYS = ("float16", "bfloat16", "tf32", "float32")


def check_metadata(meta: dict[str, Any]) -> None:
    """ValueError naming the first field of a model folder's metadata whose value no loader can use: the
    nesting depth, the weights' checksum, the device spec(s), the serving settings and every head's MLP
    config. Fields this does not know are left to the loader."""
    _check_depth(meta)
    sha = meta.get("weights_sha256")
    if sha is None:
        # save() always records it: without it a flipped byte in the weights would load silently
        raise ValueError("weights_sha256: missing, so the weights' integrity cannot be checked (perfmodel writes it "
                         "with every folder); if you trust model.safetensors, add its sha256 as weights_sha256")
    if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise ValueError(f"weights_sha256: expected 64 lowercase hex digits, got {_short(sha)}")
    _check_spec("device_spec", meta.get("device_spec"))
    specs = meta.get("device_specs")
    if isinstance(specs, dict):
        for name, spec in specs.items():
            _check_spec(f"device_specs.{name}", spec)
    for key in ("pad_threshold", "learned_overhead_ms"):  # pad: pads when padded ms x threshold < as-is ms
        if key in meta:
            _positive(key, meta[key])
    for key in ("screen_keep", "lead_keep"):
        if key in meta:
            _integer(key, meta[key], 1 if key == "screen_keep" else 0)
    heads = meta.get("heads")
    if isinstance(heads, dict):
        for name, head in heads.items():
            mlp = head.get("mlp") if isinstance(head, dict) else None
            if isinstance(mlp, dict):
                _check_mlp(f"heads.{name}.mlp", mlp)


def _check_depth(meta: Any) -> None:
    # iterative: a recursive walk of a deep file is what this guards against
    stack = [(meta, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"metadata: nested more than {MAX_DEPTH} levels deep (not a perfmodel metadata file)")
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack.extend((v, depth + 1) for v in children if isinstance(v, (dict, list)))


def _check_spec(field: str, spec: Any) -> None:
    if not isinstance(spec, dict):
        raise ValueError(f"{field}: expected a device spec mapping, got {_short(spec)}")
    for key in ("name", "marketing_name"):
        if key in spec and not isinstance(spec[key], str):
            raise ValueError(f"{field}.{key}: expected a string, got {_short(spec[key])}")
    for key in ("sm_count", "shared_memory_per_block_optin", "l2_bytes", "registers_per_thread_max"):
        if key in spec:
            _integer(f"{field}.{key}", spec[key], 1)
    for key in ("max_sm_clock_mhz", "dram_bw_gbs"):
        if key in spec:
            _positive(f"{field}.{key}", spec[key])
    flops = spec.get("flop_per_sm_clk")
    if flops is not None:
        if not isinstance(flops, dict) or set(flops) != set(FLOP_KEYS):
            raise ValueError(f"{field}.flop_per_sm_clk: expected a mapping of {', '.join(FLOP_KEYS)}, got {_short(flops)}")
        for key in FLOP_KEYS:
            _positive(f"{field}.flop_per_sm_clk.{key}", flops[key])


def _check_mlp(field: str, mlp: dict[str, Any]) -> None:
    for key in ("n_inputs", "n_outputs", "members"):
        if key in mlp:
            _integer(f"{field}.{key}", mlp[key], 1)
    hidden = mlp.get("hidden")
    if hidden is not None:
        if not isinstance(hidden, list):
            raise ValueError(f"{field}.hidden: expected a list of widths, got {_short(hidden)}")
        for i, w in enumerate(hidden):
            _integer(f"{field}.hidden[{i}]", w, 1)
    if "init_overhead_ms" in mlp:  # the overhead floor starts at its log
        _positive(f"{field}.init_overhead_ms", mlp["init_overhead_ms"])
    if "dropout" in mlp:
        d = mlp["dropout"]
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d < 1:
            raise ValueError(f"{field}.dropout: expected a number in [0, 1), got {_short(d)}")


def _positive(field: str, value: Any) -> None:
    """A finite number > 0 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{field}: expected a finite number > 0, got {_short(value)}")


def _integer(field: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{field}: expected an integer >= {low}, got {_short(value)}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def folder_exists(path: Path, field: str = "path_or_uri") -> bool:
    """Path(path).is_dir(), with a path the OS cannot look at (a component over its name limit, a
    permission denied) refused as a ValueError naming `field` instead of an OSError."""
    try:
        return Path(path).is_dir()
    except OSError as exc:
        raise ValueError(f"{field}: cannot read {_short(str(path))}: {exc.strerror or exc}") from None


def umask() -> int:
    """The process's umask (Linux: read from /proc, else set and restored at once)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(*paths: Path) -> None:
    """Each path's mode set as a plain create under the umask gives it (folders 0o777, files 0o666, less the
    umask): a temporary folder (mkdtemp: 0o700) or a file the safetensors writer creates 0o600 is left
    readable as the user's umask says. A folder's files inside it too (not below)."""
    mask = umask()
    for path in paths:
        path = Path(path)
        if path.is_dir():
            os.chmod(path, 0o777 & ~mask)
            for child in path.iterdir():
                if child.is_file() and not child.is_symlink():
                    os.chmod(child, 0o666 & ~mask)
        elif path.is_file():
            os.chmod(path, 0o666 & ~mask)
