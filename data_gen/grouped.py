"""The grouped-GEMM sweep's problems, routings, settings and row checks (no CUDA here: `--dry-run`, the CLI
and the tests import this module; the GPU work is in grouped_sweep.py).

A problem is one grouped GEMM of an MoE expert MLP as transformers 5.x runs it
(integrations/moe.py `_grouped_linear`): A = the routed tokens (total_m, K), row-major; B = the expert
weights (G, K, N); offs = the cumulative tokens per expert, int32, offs[-1] = total_m. Weights stored
(G, N, K) as nn.Linear stores them (Mixtral, Qwen-MoE, DeepSeek) are passed as `weight.transpose(-2, -1)`:
B's stride along K is 1 ("kmajor"); GPT-OSS stores them (G, K, N) and passes them as they are ("nmajor").
Inductor's `triton_grouped_mm` template compiles one kernel per (total_m, G, K, N, dtype, layout, config):
the offsets are read at run time, so one compile serves every routing of a problem.
"""
from __future__ import annotations

import hashlib
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from .measure import TimingSettings

KIND = "grouped"  # the shard kind: one unit per problem; rows of kind "triton", "aten" and "other"

# MoE widths: (hidden, expert ffn, expert counts, top-k, weight layout). DeepSeek-V3 has 256 routed
# experts; 32 is its share of one GPU under 8-way expert parallelism and 128 the brief's upper bound.
# GPT-OSS-20b has 32 experts, -120b 128.
FAMILIES: dict[str, tuple[int, int, tuple[int, ...], int, str]] = {
    "mixtral": (4096, 14336, (8,), 2, "kmajor"),
    "qwen15_moe": (2048, 1408, (60,), 4, "kmajor"),
    "qwen3_moe": (2048, 768, (128,), 8, "kmajor"),
    "deepseek_v3": (7168, 2048, (32, 128), 8, "kmajor"),
    "gpt_oss": (2880, 2880, (32, 128), 4, "nmajor"),
}
# Both GEMMs of an expert MLP: gate+up concatenated (transformers' default, N = 2 ffn), up (or gate)
# alone (N = ffn), down (K = ffn, N = hidden).
GEMMS = ("gate_up", "down", "up")
B_LAYOUTS = ("kmajor", "nmajor")
DTYPES = ("bfloat16", "float16")
DTYPE_BYTES = {"bfloat16": 2, "float16": 2}

# Average tokens per expert, in the order the sweep reaches them: every family at a decode and a
# prefill count first, then the rest of the range (decode 1-16 to prefill thousands).
TOKENS_ORDER = (8, 512, 1, 64, 2048, 16, 128, 4096, 2, 32, 256, 1024, 4, 384, 24, 96, 3, 48, 768, 1536, 192, 12, 6,
                3072, 0.5, 0.25)
# Below one row per expert (appended last, so that the order of the others holds): decode with many experts, e.g.
# 8 sequences routed top-8 over Qwen3-MoE's 128 experts is 0.5 rows per expert, most experts idle.

# Routings timed per problem. even_inductor: the offsets Inductor autotunes with (kernel/mm_grouped.py
# create_offsets: equal shares rounded to 16 bytes); even: equal shares (differ by at most one token;
# left out where it equals even_inductor); dirichlet<a>: each of the problem's tokens picks top-k distinct
# experts from expert probabilities drawn from Dirichlet(a), a=1 moderate imbalance, a=0.3 a few hot
# experts and many idle ones.
ROUTINGS = ("even_inductor", "even", "dirichlet1", "dirichlet0.3")
_DIRICHLET = {"dirichlet1": 1.0, "dirichlet0.3": 0.3}

ROW_KINDS = ("triton", "aten", "other")
TIMERS = ("perfmodel", "inductor")


@dataclass(frozen=True)
class GroupedProblem:
    """One grouped GEMM: out (total_m, n) = A (total_m, k) @ B[g] (k, n) over each expert's rows."""
    family: str
    gemm: str
    g: int          # experts (groups)
    topk: int
    tokens: int     # tokens in the batch; total_m = tokens * topk routed rows
    k: int
    n: int
    dtype: str
    b_layout: str   # "kmajor": B a transposed view of (G, N, K) (stride 1 along K); "nmajor": (G, K, N) contiguous

    @property
    def total_m(self) -> int:
        return self.tokens * self.topk

    @property
    def flops(self) -> float:
        return 2.0 * self.total_m * self.k * self.n

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_m": self.total_m, "m_per_expert": round(self.total_m / self.g, 3)}

    @property
    def natural(self) -> bool:
        """Whether B has the layout the family's transformers model passes."""
        return self.b_layout == FAMILIES[self.family][4]


def problem_id(p: GroupedProblem) -> str:
    """The unit id: what decides the kernels (total_m, G, K, N, dtype, layout) and the routings (top-k)."""
    key = f"grouped:{p.g}x{p.total_m}x{p.k}x{p.n}:{p.dtype}:{p.b_layout}:top{p.topk}"
    return "grouped-" + hashlib.sha1(key.encode()).hexdigest()[:12]


def gemm_dims(family: str, gemm: str) -> tuple[int, int]:
    """(K, N) of one GEMM of a family's expert MLP."""
    hidden, ffn = FAMILIES[family][:2]
    return {"gate_up": (hidden, 2 * ffn), "up": (hidden, ffn), "down": (ffn, hidden)}[gemm]


@dataclass(frozen=True)
class GroupedBudget:
    max_flops: float = 4e12       # ~6 ms at the H100's bf16 peak
    max_bytes: float = 8e9        # A + all of B + the output
    max_elems: int = 2**31 - 1    # each operand (DeepSeek gate+up with 128 experts has 3.8e9 weights: left out)


def min_bytes(p: GroupedProblem, active: int | None = None) -> float:
    """Bytes every kernel must move: A, the weights of the experts with tokens (all G when active is None;
    the template skips an expert without tokens), the output."""
    e = DTYPE_BYTES[p.dtype]
    return e * (p.total_m * p.k + (p.g if active is None else active) * p.k * p.n + p.total_m * p.n)


def within(p: GroupedProblem, budget: GroupedBudget) -> bool:
    return (p.flops <= budget.max_flops and min_bytes(p) <= budget.max_bytes
            and max(p.total_m * p.k, p.g * p.k * p.n, p.total_m * p.n) <= budget.max_elems)


def tokens_for(avg_per_expert: float, g: int, topk: int) -> int:
    """Tokens in the batch that route avg_per_expert rows to each expert on average (at least one)."""
    return max(1, round(avg_per_expert * g / topk))


def parse_per_expert(text: str) -> tuple[float, ...]:
    """--per-expert's comma-separated rows per expert; ValueError naming the flag unless each is in TOKENS_ORDER."""
    allowed = ",".join(map(str, TOKENS_ORDER))
    try:
        values = tuple(int(v) if (v := float(x)).is_integer() else v for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--per-expert: must be some of {allowed}, got {text!r}") from None
    if not values or any(t not in TOKENS_ORDER for t in values):
        raise ValueError(f"--per-expert: must be some of {allowed}, got {text!r}")
    return values


def check_choice(name: str, values: tuple[str, ...] | None, allowed: tuple[str, ...]) -> tuple[str, ...] | None:
    """values, checked against allowed; ValueError naming the field otherwise."""
    if values is None:
        return None
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise ValueError(f"{name}: must be some of {', '.join(allowed)}, got {', '.join(values) or 'none'}")
    return values


def grouped_problems(families: tuple[str, ...] | None = None, dtypes: tuple[str, ...] | None = None,
                     gemms: tuple[str, ...] | None = None, layouts: str = "both",
                     budget: GroupedBudget = GroupedBudget(),
                     per_expert: tuple[float, ...] | None = None) -> list[GroupedProblem]:
    """Every problem within the budget, in sweep order: by a priority that puts each family's bf16 gate+up and
    down GEMMs (its model's weight layout) at one decode and one prefill token count first, then further token
    counts (TOKENS_ORDER), with fp16, the up-only GEMM and the other weight layout a few ranks later each;
    families interleaved within a rank. Deterministic. layouts: "natural" (the family's only), "both".
    per_expert: only these average rows per expert (values of TOKENS_ORDER; None: all)."""
    families = check_choice("families", families, tuple(FAMILIES)) or tuple(FAMILIES)
    dtypes = check_choice("dtypes", dtypes, DTYPES) or DTYPES
    gemms = check_choice("gemms", gemms, GEMMS) or GEMMS
    if layouts not in ("natural", "both"):
        raise ValueError(f"layouts: must be natural or both, got {layouts!r}")
    if per_expert is not None and (not per_expert or any(t not in TOKENS_ORDER for t in per_expert)):
        raise ValueError(f"per_expert: must be some of {', '.join(map(str, TOKENS_ORDER))}, got {per_expert}")
    keyed: dict[str, tuple[tuple, GroupedProblem]] = {}
    combos = [(f, g) for f in families for g in FAMILIES[f][2]]
    for ci, (fam, g) in enumerate(combos):
        topk, natural = FAMILIES[fam][3], FAMILIES[fam][4]
        for gi, gemm in enumerate(gemms):
            k, n = gemm_dims(fam, gemm)
            for dtype in dtypes:
                for layout in (natural,) if layouts == "natural" else (natural, *[x for x in B_LAYOUTS if x != natural]):
                    for ti, t in enumerate(TOKENS_ORDER):
                        if per_expert is not None and t not in per_expert:
                            continue
                        p = GroupedProblem(fam, gemm, g, topk, tokens_for(t, g, topk), k, n, dtype, layout)
                        if not within(p, budget):
                            continue
                        rank = (ti + 2.5 * (dtype != "bfloat16") + 3.5 * (gemm == "up")
                                + 6.5 * (layout != natural))
                        key = (rank, GEMMS.index(gemm) if gemm != "up" else 0, ci)
                        pid = problem_id(p)
                        if pid not in keyed or key < keyed[pid][0]:  # the same shape from two families: once
                            keyed[pid] = (key, p)
    return [p for _, p in sorted(keyed.values(), key=lambda kp: kp[0])]


# ----------------------------------------------------------------------------------------- routings

def inductor_offsets(total_m: int, g: int, alignment: int) -> list[int]:
    """The offsets Inductor benchmarks the grouped-GEMM choices with: kernel/mm_grouped.py create_offsets for a
    2-D A and a 3-D B (end = total_m), in torch's float32 arithmetic, as Inductor computes them."""
    import torch

    offs = torch.arange(1, g + 1, dtype=torch.float32) * (total_m / g)
    offs[:-1] = (offs[:-1] / alignment).round() * alignment
    offs[-1] = total_m
    return [int(x) for x in offs.to(torch.int32).tolist()]


def counts_from_offsets(offs: list[int]) -> list[int]:
    return [b - a for a, b in zip([0, *offs[:-1]], offs)]


def routing_counts(p: GroupedProblem, routing: str) -> list[int]:
    """Rows per expert (length G, sum total_m) of one routing (ROUTINGS). The dirichlet routings are seeded by
    the problem and the routing: a resumed run, and any reader, gets the same counts."""
    import numpy as np

    g, total = p.g, p.total_m
    if routing == "even_inductor":
        return counts_from_offsets(inductor_offsets(total, g, 16 // DTYPE_BYTES[p.dtype]))
    if routing == "even":
        return [total // g + (i < total % g) for i in range(g)]
    if routing not in _DIRICHLET:
        raise ValueError(f"routing: must be one of {', '.join(ROUTINGS)}, got {routing!r}")
    seed = int(hashlib.sha1(f"{problem_id(p)}:{routing}".encode()).hexdigest()[:12], 16)
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(g, _DIRICHLET[routing]))
    counts = np.zeros(g, dtype=np.int64)
    # Each token picks its top-k experts without replacement in proportion to probs (the Gumbel top-k trick),
    # in chunks of tokens to bound memory (tokens x G scores).
    logp = np.log(np.maximum(probs, 1e-300))
    for start in range(0, p.tokens, 8192):
        t = min(8192, p.tokens - start)
        scores = logp[None, :] + rng.gumbel(size=(t, g))
        top = np.argpartition(-scores, p.topk - 1, axis=1)[:, :p.topk]
        counts += np.bincount(top.ravel(), minlength=g)
    out = [int(c) for c in counts]
    assert sum(out) == total, (sum(out), total)
    return out


def problem_routings(p: GroupedProblem) -> list[tuple[str, list[int]]]:
    """(routing, counts) pairs timed for a problem: ROUTINGS, "even" left out where it equals even_inductor."""
    out: list[tuple[str, list[int]]] = []
    for r in ROUTINGS:
        counts = routing_counts(p, r)
        if r == "even" and counts == out[0][1]:
            continue
        out.append((r, counts))
    return out


def routing_stats(counts: list[int]) -> dict[str, Any]:
    """The shape of a routing on every row: max and min rows per expert, experts without rows, and the
    coefficient of variation of the counts."""
    g = len(counts)
    mean = sum(counts) / g
    sd = math.sqrt(sum((c - mean) ** 2 for c in counts) / g)
    return {"max_rows": max(counts), "min_rows": min(counts), "empty_experts": sum(c == 0 for c in counts),
            "active_experts": sum(c > 0 for c in counts), "count_cv": round(sd / mean, 4) if mean else 0.0}


# ------------------------------------------------------------------------------------------ configs

# Inductor's grouped-GEMM configs (kernel/mm_grouped.py _NV_CONFIGS, torch 2.11-2.13), as
# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps) in its order. Used for --dry-run's counts and as
# the expected list where Inductor's own cannot be imported; the sweep takes Inductor's own on the GPU.
NV_CONFIGS = [(bm, bn, bk, s, w) for bm in (16, 32, 64, 128) for bn in (64, 128, 256) for bk in (64, 128, 256)
              for s in (3, 4) for w in (4, 8)]


def expected_configs(p: GroupedProblem, smem_bytes: int) -> list[tuple[int, int, int, int, int]]:
    """_NV_CONFIGS after Inductor's early_config_prune for a 2-D A and a 3-D B: BLOCK_M by the average rows per
    expert (total_m // G: <= 16 keeps BLOCK_M <= 32, <= 32 keeps <= 64, <= 64 keeps >= 32, above keeps >= 64),
    then the configs whose (BLOCK_M + BLOCK_N) * BLOCK_K * stages * dtype bytes fit the shared memory."""
    m_avg = p.total_m // p.g
    out = []
    for bm, bn, bk, s, w in NV_CONFIGS:
        if m_avg <= 16:
            if bm > 32:
                continue
        elif m_avg <= 32:
            if bm > 64:
                continue
        elif m_avg <= 64:
            if bm <= 16:
                continue
        elif bm <= 32:
            continue
        if (bm + bn) * bk * s * DTYPE_BYTES[p.dtype] > smem_bytes:
            continue
        out.append((bm, bn, bk, s, w))
    return out


_KW = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(True|False|None|-?\d+(?:\.\d+)?|'[^']*'|\"[^\"]*\")")


def parse_description(desc: str) -> dict[str, Any]:
    """The keyword values of a TritonTemplateCaller's description (select_algorithm.py: its template kwargs as
    `NAME=repr(value)` joined by ", ", then num_stages and num_warps): ints, bools, None and strings."""
    out: dict[str, Any] = {}
    for key, raw in _KW.findall(desc or ""):
        if raw in ("True", "False", "None"):
            out[key] = {"True": True, "False": False, "None": None}[raw]
        elif raw[0] in "'\"":
            out[key] = raw[1:-1]
        else:
            out[key] = float(raw) if "." in raw else int(raw)
    return out


def template_config(info: dict[str, Any] | None, desc: str) -> dict[str, int]:
    """(block_m, block_n, block_k, num_stages, num_warps) of a template choice, from its description, checked
    against its info_dict where that has them (tile_shape is "(BLOCK_M, BLOCK_K, BLOCK_N)"); ValueError when a
    field is missing or the two disagree."""
    kw = parse_description(desc)
    keys = {"block_m": "BLOCK_M", "block_n": "BLOCK_N", "block_k": "BLOCK_K", "num_stages": "num_stages",
            "num_warps": "num_warps"}
    cfg: dict[str, int] = {}
    for field_, key in keys.items():
        if not isinstance(kw.get(key), int) or isinstance(kw.get(key), bool):
            raise ValueError(f"description: no integer {key} in {desc[:200]!r}")
        cfg[field_] = kw[key]
    info = info or {}
    tile = info.get("tile_shape")
    if tile is not None:
        nums = [int(x) for x in re.findall(r"-?\d+", str(tile))]
        if len(nums) == 3 and nums != [-1, -1, -1] and nums != [cfg["block_m"], cfg["block_k"], cfg["block_n"]]:
            raise ValueError(f"info_dict: tile_shape {tile} disagrees with the description's blocks {cfg}")
    for key in ("num_stages", "num_warps"):
        if key in info and info[key] is not None and int(info[key]) != cfg[key]:
            raise ValueError(f"info_dict: {key} {info[key]} disagrees with the description's {cfg[key]}")
    return cfg


# ----------------------------------------------------------------------------------------- settings

@dataclass
class GroupedSweepSettings:
    families: tuple[str, ...] | None = None   # None: all of FAMILIES
    dtypes: tuple[str, ...] | None = None     # None: both
    gemms: tuple[str, ...] | None = None      # None: all of GEMMS
    layouts: str = "both"                     # "natural": each family's own weight layout only
    per_expert: tuple[float, ...] | None = None # None: every rows-per-expert value of TOKENS_ORDER
    max_problems: int | None = None           # new problems this run
    time_limit_s: float | None = None         # stop cleanly before starting a problem that would pass it
    retime: bool = True                       # re-time every choice on each routing (else Inductor's timings only)
    budget: GroupedBudget = field(default_factory=GroupedBudget)
    timing: TimingSettings = field(default_factory=TimingSettings)
    aten_pre_sleep_us: float = 200.0          # the spin before aten's _grouped_mm (a host-side dispatch)


def settings_dict(s: GroupedSweepSettings) -> dict[str, Any]:
    return {"families": list(s.families) if s.families else None, "dtypes": list(s.dtypes) if s.dtypes else None,
            "gemms": list(s.gemms) if s.gemms else None, "layouts": s.layouts,
            "per_expert": list(s.per_expert) if s.per_expert else None, "max_problems": s.max_problems,
            "time_limit_s": s.time_limit_s, "retime": s.retime, "budget": asdict(s.budget), "timing": vars(s.timing),
            "aten_pre_sleep_us": s.aten_pre_sleep_us, "routings": list(ROUTINGS)}


# Worker-seconds per Triton compile on the GPU host (~16 kernels/s with 15 workers, docs/data.md) and
# the rest of a problem's wall time, to estimate a run: Inductor's own benchmark of each choice (its
# benchmarker's ~25 ms budget a choice plus set-up), the dynamo trace and the final compile, and our timing
# of every choice on each routing.
KERNEL_WORKER_S = 15 / 16
INDUCTOR_BENCH_S = 0.04
PROBLEM_OVERHEAD_S = 2.5
RETIME_S = 0.01


def estimate(problems: list[GroupedProblem], smem_bytes: int, workers: int) -> dict[str, Any]:
    """Choices, rows and seconds a run of these problems should take (fp16 compiles are expected to fail at
    once: torch's meta function of _grouped_mm takes bf16 only in 2.13, so they time aten alone)."""
    choices = rows = 0
    seconds = 0.0
    for p in problems:
        r = len(ROUTINGS) - (routing_counts(p, "even") == routing_counts(p, "even_inductor"))
        c = len(expected_configs(p, smem_bytes)) if p.dtype == "bfloat16" else 0
        choices += c
        rows += (c + 1) * r + (c == 0)
        seconds += (PROBLEM_OVERHEAD_S + c * KERNEL_WORKER_S / max(1, workers) + c * INDUCTOR_BENCH_S
                    + (c + 1) * r * RETIME_S) if c else 1.0
    return {"problems": len(problems), "template_choices": choices, "rows": rows, "wall_s": round(seconds, 1)}


# ----------------------------------------------------------------------------------------- row checks

_REQUIRED = {"unit": str, "family": str, "gemm": str, "g": int, "topk": int, "tokens": int, "total_m": int, "k": int,
             "n": int, "dtype": str, "b_layout": str, "kind": str, "routing": str, "status": str, "timer": str}


def validate_row(r: dict[str, Any]) -> None:
    """ValueError naming the field when a row of a grouped part is malformed (the writer checks every row
    before it is written; readers check what they read)."""
    for key, typ in _REQUIRED.items():
        if key not in r:
            raise ValueError(f"{key}: missing from a grouped row")
        if not isinstance(r[key], typ) or (typ is int and isinstance(r[key], bool)):
            raise ValueError(f"{key}: expected {typ.__name__}, got {r[key]!r}")
    for key, allowed in (("family", tuple(FAMILIES)), ("gemm", GEMMS), ("dtype", DTYPES), ("b_layout", B_LAYOUTS),
                         ("kind", ROW_KINDS), ("routing", ROUTINGS), ("timer", TIMERS)):
        if r[key] not in allowed:
            raise ValueError(f"{key}: expected one of {', '.join(allowed)}, got {r[key]!r}")
    if r["total_m"] != r["tokens"] * r["topk"]:
        raise ValueError(f"total_m: {r['total_m']} is not tokens {r['tokens']} x topk {r['topk']}")
    st = r["status"]
    if st not in ("ok", "rejected_peak") and not st.startswith("fail:"):
        raise ValueError(f"status: expected ok, rejected_peak or fail:<why>, got {st!r}")
    ms = r.get("ms")
    if st == "ok":
        if not isinstance(ms, (int, float)) or isinstance(ms, bool) or not (ms > 0 and math.isfinite(ms)):
            raise ValueError(f"ms: an ok row needs a finite time > 0, got {ms!r}")
    elif st.startswith("fail:") and st != "fail:wrong_result" and ms is not None:
        raise ValueError(f"ms: a failed row has no time (but a wrong result's), got {ms!r}")
    if r["kind"] == "triton":
        for key in ("block_m", "block_n", "block_k", "num_stages", "num_warps"):
            v = r.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{key}: a triton row needs a positive int, got {v!r}")
    im = r.get("inductor_ms")
    if im is not None and (not isinstance(im, (int, float)) or isinstance(im, bool) or not im > 0):
        raise ValueError(f"inductor_ms: expected a time > 0 or None, got {im!r}")
    if r["timer"] == "inductor" and st == "ok" and r.get("inductor_ms") != ms:
        raise ValueError("timer: a row timed by Inductor carries Inductor's time as ms")


def read_grouped(folder, allow_synthetic: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows, headers) of a folder's grouped parts, every row validated; rows marked synthetic (tests) are
    refused unless allow_synthetic."""
    from .shards import read_dataset

    rows, headers = read_dataset(folder, KIND)
    for r in rows:
        try:
            validate_row(r)
        except ValueError as exc:
            raise ValueError(f"{folder}: unit {r.get('unit')}: {exc}") from None
        if r.get("synthetic") and not allow_synthetic:
            raise ValueError(f"{folder}: unit {r.get('unit')}: synthetic rows (a test's) in a dataset")
    return rows, headers
