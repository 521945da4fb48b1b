"""HeadSpec: what the code knows about one head of a model folder, in one place.

A head is a PerfMLP (perfmodel/model.py) on the features of one FeatureEncoder kind; its spec says which
kind (its inputs), what its output columns are, which feature column floors each output (the physical
floor, docs/design.md), what it is trained on and by which build step, and its lines on the model card.
The folder stores each head's MLP config and feature names (metadata "heads"); loading checks them
against the spec's encoder, never against constants elsewhere.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable


def figure(v: Any, digits: int) -> str:
    """A figure of the model card with `digits` decimals; "-" for one not recorded or not a number (a NaN of a
    build too small to have, say, a float32 test problem): a card never prints "nan"."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return "-"
    return f"{v:.{digits}f}"


@dataclass(frozen=True)
class HeadSpec:
    name: str                    # the stored name: weights "<name>.*", metadata heads[<name>]
    encoder: str                 # the FeatureEncoder kind of its inputs (perfmodel/features.py)
    outputs: tuple[str, ...]     # its output columns, in order (a head of one output: (name,))
    # per output, the feature whose value floors it (its log roofline ms: the output is max(prediction, it));
    # "" for an output without a floor (a margin, a score)
    floors: tuple[str, ...]
    targets: str                 # what it is fitted to (docs, `perfmodel build --help`)
    step: str                    # the build step, and recipe section, that fits it (train/build.py)
    # metadata key naming the outputs a folder stores, in column order, where a folder may hold a prefix of
    # `outputs` (the problem network without its inductor-mode call); None: always all of them
    outputs_key: str | None = None
    # an extra last input a folder may store the head with, and the metadata key that then holds its
    # values (the gemm head's kernel-mode input: the config network); None: no such input
    mode_input: str | None = None
    mode_key: str | None = None
    required: bool = False       # every folder has it
    # its lines on the model card, from the folder's metadata ("" where it has nothing to say)
    card: Callable[[dict[str, Any]], str] | None = None

    def floor_features(self, names: list[str], n_outputs: int) -> tuple[int, ...]:
        """The physical floor's input column of each of n_outputs outputs on features `names` (-1: none), for
        MLPConfig.floor_features."""
        floors = self.floors[:n_outputs] + ("",) * (n_outputs - len(self.floors))
        return tuple(names.index(f) if f and f in names else -1 for f in floors)

    def feature_names(self, encoder_names: list[str], metadata: dict[str, Any]) -> list[str]:
        """The features a folder stores this head on: its encoder's, and the mode input where the metadata
        has its values."""
        return encoder_names + ([self.mode_input] if self.mode_input and self.mode_key in metadata else [])
