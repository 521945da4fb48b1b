"""Where a model folder came from: the code commit, the build record's steps, file hashes."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ._version import __version__


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
