"""Which held-out split an evaluation uses (by problem, or by family: train/families.py), whether the model
was trained on it, and the regret distribution of the model's rank path on its test problems."""
from __future__ import annotations

import numpy as np
import torch

from perfmodel import artifact

from . import evaluate as ev
from .data import GemmTable
from .regret import layouts, regret_report

SPLITS = ("problem", "family")


def model_split(bundle: artifact.ModelBundle) -> str:
    """The split a model was trained on: its metadata's settings.split ("problem" when not recorded)."""
    return str(bundle.metadata.get("settings", {}).get("split", "problem"))


def choose_split(bundle: artifact.ModelBundle, datasets: list, kind: str | None, seed: int
                 ) -> tuple[list[np.ndarray], list[np.ndarray], dict]:
    """The per-dataset splits (GEMM problems, pad rows; 0/1/2 train/val/test) of the `kind` of split
    (None: the model's own), and what to say about it: {"kind", "model_split", "contaminated",
    "source", "seed", "test_keys" (family), "trained_share" (contaminated)}. A family split of a model
    trained on it takes the keys its metadata records ("family_split"); of another model it is computed
    from the seed. Evaluated on the other split than its own, a model was trained on some of the test
    problems ("contaminated"; trained_share: the share of them in its own split's training set, before
    any --device-fraction thinning): the figures flatter it."""
    trained_on = model_split(bundle)
    kind = trained_on if kind is None else kind
    if kind not in SPLITS:
        raise ValueError(f"split: expected one of {', '.join(SPLITS)}, got {kind!r}")
    gs, ps, info = _split(bundle, datasets, kind, seed)
    info.update(model_split=trained_on, contaminated=kind != trained_on)
    if info["contaminated"]:  # the share of these test problems that the model's own split trained on
        own = _split(bundle, datasets, trained_on, seed)[0]
        test = np.concatenate([g == 2 for g in gs])
        info["trained_share"] = float((np.concatenate(own)[test] == 0).mean()) if test.any() else 0.0
    return gs, ps, info


def _split(bundle: artifact.ModelBundle, datasets: list, kind: str, seed: int
           ) -> tuple[list[np.ndarray], list[np.ndarray], dict]:
    from .data import joint_split
    from .families import family_keys, joint_family_split

    info: dict = {"kind": kind, "seed": int(seed)}
    if kind == "problem":
        gs, ps = joint_split(datasets, seed)
        return gs, ps, {**info, "source": "split_problems (seed)"}
    record = bundle.metadata.get("family_split") if model_split(bundle) == "family" else None
    gs, ps = joint_family_split(datasets, seed, record)
    info["source"] = "the model's metadata (family_split)" if record else "computed from the seed"
    keys = np.concatenate([family_keys(ds.gemm.problems[g == 2]) for ds, g in zip(datasets, gs)])
    info["test_keys"] = sorted(set(keys.tolist()))
    return gs, ps, info


def rank_path_efficiency(bundle: artifact.ModelBundle, test: GemmTable) -> tuple[np.ndarray, np.ndarray]:
    """Per test problem, the top-1 and top-5 efficiency of the serving rank path (the screen, then the gemm
    head, through the lead with one: train/evaluate.py screened), as evaluate_bundle ranks."""
    P, C = torch.from_numpy(test.problems[test.problem_idx]), torch.from_numpy(test.configs)
    with torch.inference_mode():
        x = bundle.encoders["gemm"].encode(P, C)
    score, pred = ev.head_outputs(bundle.heads["gemm"], x)
    screen = ev.head_outputs(bundle.heads[bundle.screen_name], x)[0] if bundle.screen_name else None
    if screen is not None:
        lead = ev.lead_outputs(bundle.heads["gemm"], x) if bundle.lead_keep else None
        score = ev.screened(test, score, pred, screen, bundle.screen_keep, lead, bundle.lead_keep)
    pp = ev.per_problem(test, score)
    return pp["top1"], pp["top5"]


def rank_path_regret(bundle: artifact.ModelBundle, test: GemmTable) -> dict:
    """regret_report (train/regret.py) of the rank path on the test problems: top-1 and top-5 regret,
    median / p90 / worst, overall, per dtype mode and per layout."""
    top1, top5 = rank_path_efficiency(bundle, test)
    return regret_report(top1, top5, test.modes, layouts(test.problems[:, 6], test.problems[:, 7]))
