"""The heads a model folder may hold: one registry, one small spec per head (perfmodel/heads/spec.py).

The folder format (perfmodel/artifact.py) saves and loads by looping over REGISTRY; `perfmodel build`
(train/build.py) fits any subset of it (`--only HEAD`); the model card takes each head's lines from its spec.
A new head is one new module (its HeadSpec) and one line below (docs/architecture.md, "Adding a head").
"""
from __future__ import annotations

from . import bmm, gemm, grouped, inductor, pad, problem, tutorial
from .spec import HeadSpec

# The registry, in the order the heads are fitted and the card lists them (a head after those it needs).
REGISTRY: dict[str, HeadSpec] = {s.name: s for s in (
    gemm.GEMM,
    gemm.STUDENT,
    pad.PAD,
    problem.PROBLEM,
    bmm.BMM,
    bmm.BMM_ATEN,
    bmm.BMM_CALL,
    grouped.GROUPED,
    inductor.INDUCTOR,
    tutorial.TUTORIAL,
)}


def head_spec(name: str) -> HeadSpec:
    """The registered spec of head `name`; ValueError naming the head and the registry's names otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"head: no registered head {name!r} (registered: {', '.join(REGISTRY)})") from None


__all__ = ["REGISTRY", "HeadSpec", "head_spec"]
