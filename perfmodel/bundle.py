"""A loaded model in memory (ModelBundle) and the roles its heads play in serving.

The heads themselves are registered in perfmodel/heads/ (one spec each); the folder format that stores a
bundle is perfmodel/artifact.py, its ONNX graph perfmodel/onnx_export.py. Here: the bundle, the names of the
heads' roles that serving asks for (what predict serves, what screens a ranking, what serves
kernel="inductor", which column of the problem network gives torch.mm's time or a call). A folder of an older
layout (perfmodel/heads/legacy.py) is converted once by perfmodel/migrate.py; nothing here branches on it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from .devices import DeviceSpec
from .features import FeatureEncoder
from .heads.gemm import INDUCTOR_GEMM, KERNEL_MODE_FEATURE, KERNEL_MODE_INPUT, KERNEL_MODE_VALUES  # noqa: F401
from .heads.tutorial import TUTORIAL_GEMM  # kernel="tutorial": the tutorial head, where the folder stores one
from .heads.problem import OUTPUTS as PROBLEM_OUTPUTS  # noqa: F401  (the folder format's names)
from .model import MLPConfig, PerfMLP

# The head that predict / predict_many serve when a folder has it: one MLP distilled from the gemm head
# (perfmodel/heads/gemm.py STUDENT); a folder without it predicts with the gemm head.
STUDENT = "student"
# The head that screens the ranking (metadata "screen_head"): the student, which then serves both speed jobs,
# the screen and predict (one speed head; docs/model.md, "The speed heads"). A folder without the key is not
# screened (rank scores every config with the gemm head).
SCREEN_HEADS = (STUDENT,)
# The problem network's call outputs (perfmodel/heads/problem.py): per problem, log(cuBLAS ms / the best Triton
# config's ms) for the dataset's kernel (kernel="autotune") and the static one (kernel="inductor"); below 0,
# cuBLAS wins (Candidates.prefer_cublas). Only their score is served.
CALL = "call"
CALL_STATIC = "call_static"
# The problem network: one MLP on the "cublas" encoder's features, one output each of PROBLEM_OUTPUTS (metadata
# "problem_outputs" names them, in column order). problem_output() gives each output as a head of one output.
PROBLEM = "problem"


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
        out = self.head.score(x)
        return out if self.head.cfg.n_outputs == 1 else out[:, self.column]  # one output: (N,) already

    def floor(self, score: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """score (this column's) -> log ms, by the head's floors of the column."""
        if self.head.cfg.n_outputs == 1:
            return self.head.floor(score, x)
        full = torch.zeros(score.shape[0], self.head.cfg.n_outputs, dtype=score.dtype)
        full[:, self.column] = score
        return self.head.floor(full, x)[:, self.column]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.head(x)
        return out if self.head.cfg.n_outputs == 1 else out[:, self.column]


def problem_columns(bundle: "ModelBundle") -> dict[str, int]:
    """{output name: column} of the bundle's problem network (metadata "problem_outputs"); {} without one."""
    if PROBLEM not in bundle.heads:
        return {}
    names = list(bundle.metadata.get("problem_outputs") or [])
    return {n: i for i, n in enumerate(names)}


def problem_output(bundle: "ModelBundle", name: str) -> "OutputColumn | None":
    """The head that gives `name` (one of PROBLEM_OUTPUTS): that column of the problem network, else None (the
    model has no such output)."""
    col = problem_columns(bundle).get(name)
    return None if col is None else OutputColumn(bundle.heads[PROBLEM], col)


# The batched GEMM (torch.bmm / baddbmm) heads (perfmodel/heads/bmm.py): the Predictor serves a GemmProblem
# with batch > 1 by them.
BMM = "bmm"
BMM_ATEN = "bmm_aten"
BMM_CALL = "bmm_call"
# The config network (perfmodel/heads/gemm.py): the folder stores it once, as "gemm"; a loaded bundle serves it as
# two heads, "gemm" (kernel="autotune") and INDUCTOR_GEMM (kernel="inductor", config_heads). A folder whose gemm head
# is not one may store INDUCTOR_GEMM itself: the inductor head (perfmodel/heads/inductor.py), served the same way.


def inductor_head(heads: Any) -> str | None:
    """How a model serves kernel="inductor": INDUCTOR_GEMM (a config network's inductor mode, or the inductor
    head, in place of the gemm head), or None (autotune only)."""
    return INDUCTOR_GEMM if INDUCTOR_GEMM in heads else None


# The head that serves each kernel mode in place of the gemm head, where the model has it (mode_head).
MODE_HEADS = {"inductor": INDUCTOR_GEMM, "tutorial": TUTORIAL_GEMM}


def mode_head(heads: Any, kernel: str) -> str | None:
    """The head that ranks and predicts for kernel mode `kernel`: "gemm" for "autotune"; for "inductor" and
    "tutorial" their head (MODE_HEADS) where the model has it; None where it does not."""
    if kernel == "autotune":
        return "gemm"
    name = MODE_HEADS.get(kernel)
    return name if name is not None and name in heads else None


def inductor_mode(heads: dict[str, Any]) -> Any:
    """A config network's inductor mode (heads[INDUCTOR_GEMM]), or None."""
    name = inductor_head(heads)
    return heads[name] if name else None


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
        """The head that screens the ranking (metadata "screen_head"), None where the metadata names none or
        the folder has no such head (rank then scores every config with the gemm head)."""
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


def spec_from_dict(d: dict[str, Any]) -> DeviceSpec:
    try:
        return DeviceSpec(**d)
    except TypeError as exc:
        raise ArtifactError(f"metadata.device_spec: {exc}") from None



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
    KERNEL_MODE_VALUES) in place of its gemm head; changed in place and returned."""
    bundle.heads.update(config_heads(net, KERNEL_MODE_VALUES))
    bundle.encoders[INDUCTOR_GEMM] = bundle.encoders["gemm"]
    bundle.metadata = {**bundle.metadata, KERNEL_MODE_INPUT: dict(KERNEL_MODE_VALUES)}
    bundle.config_net = net
    return bundle


def screen_name(heads: Any, metadata: dict[str, Any]) -> str | None:
    """The name of the head that screens (metadata "screen_head", one of SCREEN_HEADS) where heads has it, else
    None (no key: no screen)."""
    name = metadata.get("screen_head")
    return name if name is not None and name in heads else None


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


def predict_head(names) -> str:
    """The head that predict / predict_many serve: the student when the model has one, else gemm."""
    return STUDENT if STUDENT in names else "gemm"


