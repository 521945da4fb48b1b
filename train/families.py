"""The family-held-out split: whole weight shapes held out, every token count (M) of a held-out layer unseen.

The split by problem (train/data.py split_problems) puts the same layer at neighbouring token counts in
train and in test, which flatters the held-out ranking. Here the unit of the split is a problem's
*family key*: the weight shape (K, N) of B in A (M, K) @ B (K, N), whatever the dtype mode and the
layout. data_gen/problems.py builds its GEMM list from the linear layers of named model families
(LLM_LAYERS: (in_features, out_features) = (K, N); SEED_SHAPES: (M, K, N) per model), each layer at
14 token counts in every dtype mode, then random draws. A key that a family names carries the family's
name(s) -- a shape shared by families (llama3-8b, mistral-7b and mixtral-8x7b share three) is one key
-- and a random draw that lands on a family's shape joins that key. A whole family is 14-23 % of the
problems (one layer about 3 %), too coarse to hold out at about 10 %, so the split holds out whole
layers: the named keys and the random keys are split apart, each to about 80/10/10 % of its problems.

Deterministic: the seed and the problems' keys and counts decide it; a model trained on it records its
validation and test keys (model metadata "family_split"), so an evaluation can reuse them as recorded.
"""
from __future__ import annotations

import numpy as np

# PROBLEM_COLUMNS (perfmodel.features): m, n, k, dtype bytes, is bf16, tf32, transpose_left, transpose_right
_N, _K = 1, 2
SETS = ("train", "val", "test")


def family_names() -> dict[tuple[int, int], tuple[str, ...]]:
    """(K, N) -> the model families of data_gen/problems.py whose layers have that weight shape."""
    from perfmodel.data_gen.problems import LLM_LAYERS, SEED_SHAPES

    out: dict[tuple[int, int], set[str]] = {}
    for name, layers in LLM_LAYERS.items():
        for k, n in layers:
            out.setdefault((k, n), set()).add(name)
    # the seed table's models, in the order data_gen/problems.py lists them (its comments name them)
    seed_models = ["alexnet"] * 3 + ["bert"] * 3 + ["gpt2"] * 4
    for (_, k, n), name in zip(SEED_SHAPES, seed_models, strict=True):
        out.setdefault((k, n), set()).add(name)
    return {kn: tuple(sorted(v)) for kn, v in out.items()}


def family_key(k: int, n: int, names: dict[tuple[int, int], tuple[str, ...]] | None = None) -> str:
    """"<families>:<K>x<N>" for a shape the problem lists name (families joined by "+"), else
    "shape:<K>x<N>" (a random draw)."""
    names = family_names() if names is None else names
    fams = names.get((int(k), int(n)))
    return f"{'+'.join(fams) if fams else 'shape'}:{int(k)}x{int(n)}"


def family_keys(problems: np.ndarray) -> np.ndarray:
    """The family key of each problem row (P, PROBLEM_COLUMNS) -> (P,) object array of str."""
    names = family_names()
    return np.array([family_key(int(r[_K]), int(r[_N]), names) for r in problems], dtype=object)


def is_named(key: str) -> bool:
    return not key.startswith("shape:")


def assign_keys(keys: np.ndarray, seed: int, fractions=(0.8, 0.1, 0.1)) -> dict[str, int]:
    """key -> 0/1/2 (train/val/test). Keys are split within two strata (the shapes the problem lists name,
    and random shapes): in a seeded order, a key goes to test while that brings the stratum's test
    problems no farther from fractions[2] of its problems than leaving it out would, then to val alike,
    else to train. Depends only on the seed and each key's problem count."""
    uniq, counts = np.unique(np.asarray(keys, dtype=str), return_counts=True)
    rng = np.random.default_rng(seed)
    out: dict[str, int] = {}
    for named in (True, False):
        sel = [i for i, u in enumerate(uniq) if is_named(u) == named]
        total = int(sum(counts[i] for i in sel))
        targets = {2: fractions[2] * total, 1: fractions[1] * total}
        got = {2: 0, 1: 0}
        for i in rng.permutation(np.asarray(sel, dtype=np.int64)):
            c, which = int(counts[i]), 0
            for s in (2, 1):
                if abs(got[s] + c - targets[s]) <= abs(got[s] - targets[s]) and got[s] < targets[s]:
                    which = s
                    break
            if which:
                got[which] += c
            out[str(uniq[i])] = which
    return out


def family_split(problems: np.ndarray, seed: int, fractions=(0.8, 0.1, 0.1)) -> np.ndarray:
    """0/1/2 (train/val/test) per problem row: whole family keys (assign_keys); no key is in two sets."""
    keys = family_keys(problems)
    sets = assign_keys(keys, seed, fractions)
    return np.array([sets[k] for k in keys], dtype=np.int64)


def split_from_record(problems: np.ndarray, record: dict) -> np.ndarray:
    """The split of problems by a recorded family split (held_out_record): a key recorded as test or val
    goes there, every other key to train."""
    keys = family_keys(problems)
    test, val = set(record["test_keys"]), set(record["val_keys"])
    return np.array([2 if k in test else 1 if k in val else 0 for k in keys], dtype=np.int64)


def extra_key_side(key: str, seed: int) -> int:
    """0/1/2 (train/val/test) of a family key that no dataset's gemm rows hold (a mode's own problems, such as the
    tutorial kernel's unaligned sweep): by a hash of the seed and the key alone, one key in ten to test and one to
    val, so the side of a key does not depend on which of its problems a stopped sweep reached."""
    import hashlib

    h = int(hashlib.sha1(f"{int(seed)}:{key}".encode()).hexdigest()[:8], 16) % 10
    return 2 if h == 0 else 1 if h == 1 else 0


def extra_sides(problems: np.ndarray, record: dict, gemm_keys: set[str]) -> tuple[np.ndarray, dict[str, int]]:
    """The split of a mode's own problems (rows of PROBLEM_COLUMNS: a tutorial sweep's, some of them shapes no
    dataset's gemm rows hold) by a recorded family split: a key the gemm rows hold takes its side in `record`
    (split_from_record), any other key extra_key_side's (with the record's seed). Returns (0/1/2 per problem,
    {extra key: its side})."""
    extra = {k: extra_key_side(k, int(record.get("seed", 0))) for k in set(family_keys(problems)) - gemm_keys}
    return split_from_record(problems, with_extra_keys(record, extra)), extra


def with_extra_keys(record: dict, extra: dict[str, int]) -> dict:
    """record with the extra keys' (extra_sides) test and val keys added to its own, and their count ("extra":
    keys of a mode's own problems that no gemm row holds), so that split_from_record splits those problems too."""
    return {**record, "test_keys": sorted(set(record["test_keys"]) | {k for k, v in extra.items() if v == 2}),
            "val_keys": sorted(set(record["val_keys"]) | {k for k, v in extra.items() if v == 1}),
            "extra": {"keys": len(extra), "test_keys": sum(v == 2 for v in extra.values()),
                      "val_keys": sum(v == 1 for v in extra.values()), "rule": "train/families.py extra_key_side"}}


def joint_family_split(datasets: list, seed: int, record: dict | None = None
                       ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """As train/data.py joint_split, with the GEMM problems split by family key: the keys are assigned over
    every dataset's problems together (or taken from `record`), so a held-out shape is held out on every
    device. Pad rows keep joint_split's split by problem: the pad problems are random draws, no family's."""
    from .data import joint_split

    _, pad_splits = joint_split(datasets, seed)
    if record is None:
        sets = assign_keys(np.concatenate([family_keys(ds.gemm.problems) for ds in datasets]), seed)
        record = {"test_keys": [k for k, v in sets.items() if v == 2], "val_keys": [k for k, v in sets.items() if v == 1]}
    return [split_from_record(ds.gemm.problems, record) for ds in datasets], pad_splits


def held_out_record(datasets: list, seed: int) -> dict:
    """What a model trained on the family split records (metadata "family_split"): the seed, the
    validation and test keys (sorted), and the problems per set over every dataset."""
    sets = assign_keys(np.concatenate([family_keys(ds.gemm.problems) for ds in datasets]), seed)
    keys = np.concatenate([family_keys(ds.gemm.problems) for ds in datasets])
    counts = {name: int(sum(sets[k] == i for k in keys)) for i, name in enumerate(SETS)}
    return {"seed": int(seed), "unit": "weight shape (K, N) of B, every dtype mode and layout",
            "test_keys": sorted(k for k, v in sets.items() if v == 2),
            "val_keys": sorted(k for k, v in sets.items() if v == 1), "problems": counts}
