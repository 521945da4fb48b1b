"""The grouped-GEMM sweep (`perfmodel gen grouped`, data_gen/grouped*.py) on the CPU: the problem draw and its
order, the routings, Inductor's config list and its pruning, config parsing from a choice's description, the
rows' checks, the shard round trip, resume, the time limit, fail-soft problems and --dry-run.

Everything CUDA (Inductor's compile, the re-timing, aten's _grouped_mm) runs only on the GPU machine. Rows
written here come from a stand-in problem runner: they are marked synthetic (a dataset reader refuses them)
and their times are placeholders that test the machinery, not any kernel.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from perfmodel.data_gen import grouped as gr
from perfmodel.data_gen import grouped_sweep as gs


# --------------------------------------------------------------------------------------- the draw

def test_problems_cover_every_family_early_and_the_range_later():
    ps = gr.grouped_problems()
    assert ps == gr.grouped_problems()  # deterministic: a resumed run agrees on the list
    assert len({gr.problem_id(p) for p in ps}) == len(ps)
    combos = {(f, g) for f, v in gr.FAMILIES.items() for g in v[2]}
    # the first 26 problems: every family and expert count, gate+up and down, at a decode and a prefill count
    first = ps[:26]
    for fam, g in combos:
        mine = [p for p in first if (p.family, p.g) == (fam, g)]
        assert {p.gemm for p in mine} >= {"down"}, (fam, g)
        assert min(p.total_m / p.g for p in mine) <= 16 and max(p.total_m / p.g for p in mine) >= 256, (fam, g)
        assert all(p.dtype == "bfloat16" and p.natural for p in mine)
    assert {p.family for p in first if p.gemm == "gate_up"} == set(gr.FAMILIES)
    # over the whole list: both dtypes, both layouts, all three GEMMs, 1 to thousands of rows per expert
    assert {p.dtype for p in ps} == {"bfloat16", "float16"}
    assert {p.b_layout for p in ps} == {"kmajor", "nmajor"} and {p.gemm for p in ps} == set(gr.GEMMS)
    per_expert = [p.total_m / p.g for p in ps]
    assert min(per_expert) <= 1 and max(per_expert) >= 2048
    assert {p.g for p in ps} == {8, 32, 60, 128}
    budget = gr.GroupedBudget()
    for p in ps:
        assert p.total_m == p.tokens * p.topk and gr.within(p, budget)
        assert (p.k, p.n) == gr.gemm_dims(p.family, p.gemm)
    # each family's weights in transformers' layout: transposed (G, N, K) views but GPT-OSS's (G, K, N)
    assert all(p.b_layout == "kmajor" for p in first if p.family != "gpt_oss")
    assert all(p.b_layout == "nmajor" for p in first if p.family == "gpt_oss")


def test_problem_filters_and_their_errors():
    ps = gr.grouped_problems(families=("mixtral",), dtypes=("bfloat16",), gemms=("down",), layouts="natural")
    assert ps and all((p.family, p.dtype, p.gemm, p.b_layout) == ("mixtral", "bfloat16", "down", "kmajor") for p in ps)
    with pytest.raises(ValueError, match="^families:"):
        gr.grouped_problems(families=("llama",))
    with pytest.raises(ValueError, match="^dtypes:"):
        gr.grouped_problems(dtypes=("float32",))
    with pytest.raises(ValueError, match="^layouts:"):
        gr.grouped_problems(layouts="kmajor")


def test_the_budget_leaves_out_the_largest():
    big = gr.GroupedProblem("deepseek_v3", "gate_up", 128, 8, 2048, 7168, 4096, "bfloat16", "kmajor")
    # its B has 128 x 7168 x 4096 > 2**31 elements
    assert big.g * big.k * big.n > gr.GroupedBudget().max_elems and not gr.within(big, gr.GroupedBudget())
    assert gr.problem_id(big) not in {gr.problem_id(p) for p in gr.grouped_problems()}


# ----------------------------------------------------------------------------------------- routings

def test_inductor_offsets_match_create_offsets_by_hand():
    # 64 rows over 8 experts, 8-element alignment: 8 each; 60 rows over 60 experts: offset i+1 rounded to a
    # multiple of 8 (torch rounds half to even: 4 -> 0, 5 -> 8, 12 -> 16, 20 -> 16), the last the total
    assert gr.inductor_offsets(64, 8, 8) == [8 * i for i in range(1, 9)]
    offs = gr.inductor_offsets(60, 60, 8)
    assert offs[:5] == [0, 0, 0, 0, 8] and offs[11] == 16 and offs[19] == 16 and offs[-1] == 60
    assert all(b >= a for a, b in zip(offs, offs[1:]))


def test_routing_counts_sum_and_shapes():
    p = gr.GroupedProblem("qwen3_moe", "down", 128, 8, 64, 768, 2048, "bfloat16", "kmajor")  # 512 rows, 4 per expert
    rs = dict(gr.problem_routings(p))
    assert list(rs) == ["even_inductor", "even", "dirichlet1", "dirichlet0.3"]
    for counts in rs.values():
        assert len(counts) == p.g and sum(counts) == p.total_m and min(counts) >= 0
        # each token picks top-k distinct experts: no expert gets more rows than there are tokens
        assert max(counts) <= p.tokens
    assert rs["even"] == [4] * 128
    assert rs["even_inductor"] != rs["even"]  # Inductor's shares are rounded to 8 rows
    s1, s03 = gr.routing_stats(rs["dirichlet1"]), gr.routing_stats(rs["dirichlet0.3"])
    assert s03["count_cv"] > s1["count_cv"] > 0 and s03["empty_experts"] > 0
    assert gr.problem_routings(p) == gr.problem_routings(p)  # seeded by the problem
    # where Inductor's even offsets are exactly even, "even" is not timed twice
    q = gr.GroupedProblem("mixtral", "down", 8, 2, 256, 14336, 4096, "bfloat16", "kmajor")
    assert [r for r, _ in gr.problem_routings(q)] == ["even_inductor", "dirichlet1", "dirichlet0.3"]
    with pytest.raises(ValueError, match="^routing:"):
        gr.routing_counts(q, "zipf")


# ------------------------------------------------------------------------------------------ configs

def test_expected_configs_are_inductors_pruned_list(monkeypatch):
    from torch._inductor.kernel import mm_grouped

    monkeypatch.setattr(mm_grouped, "get_gpu_shared_memory", lambda: 232448)
    assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.num_stages, c.num_warps)
            for c in mm_grouped.grouped_mm_configs()] == gr.NV_CONFIGS
    for total_m, g in ((8, 8), (128, 8), (256, 8), (512, 8), (65536, 128), (60, 60)):
        p = gr.GroupedProblem("mixtral", "down", g, 1, total_m, 4096, 4096, "bfloat16", "kmajor")
        theirs = mm_grouped.early_config_prune(g, total_m, 2, mm_grouped.grouped_mm_configs(),
                                               {"A_IS_2D": True, "B_IS_2D": False})
        assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.num_stages, c.num_warps)
                for c in theirs] == gr.expected_configs(p, 232448), (total_m, g)
    # the sweep asks Inductor's own function where it can
    p = gr.GroupedProblem("mixtral", "down", 8, 2, 4, 14336, 4096, "bfloat16", "kmajor")
    cfgs, source = gs.inductor_expected(p, 232448)
    assert source == "inductor" and cfgs == gr.expected_configs(p, 232448) and all(c[0] <= 32 for c in cfgs)


def _description(kwargs: dict, num_stages: int, num_warps: int) -> str:
    """A TritonTemplateCaller's description as select_algorithm.py builds it (make_extra, then
    result.extra.strip("-").replace("-", ", "))."""
    parts = [f"{k}={kwargs[k]!r}" for k in sorted(kwargs)] + [f"num_stages={num_stages}", f"num_warps={num_warps}"]
    return ("-".join(parts) + "-").strip("-").replace("-", ", ")


def test_template_config_from_a_description():
    kw = {"SCALED": False, "A_IS_2D": True, "B_IS_2D": False, "A_IS_K_MAJOR": True, "B_IS_K_MAJOR": True,
          "USE_FAST_ACCUM": False, "NUM_SMS": 132, "USE_TMA_LOAD": True, "USE_EXPERIMENTAL_MAKE_TENSOR_DESCRIPTOR": False,
          "BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 256, "NUM_CONSUMER_GROUPS": 1}
    desc = _description(kw, 3, 8)
    parsed = gr.parse_description(desc)
    assert parsed["NUM_SMS"] == 132 and parsed["USE_TMA_LOAD"] is True and parsed["num_warps"] == 8
    info = {"tile_shape": "(64, 256, 128)", "num_stages": 3, "num_warps": 8, "GROUP_M": -1}
    want = {"block_m": 64, "block_n": 128, "block_k": 256, "num_stages": 3, "num_warps": 8}
    assert gr.template_config(info, desc) == want
    assert gr.template_config({}, desc) == want
    with pytest.raises(ValueError, match="^info_dict: tile_shape"):
        gr.template_config({**info, "tile_shape": "(64, 128, 256)"}, desc)
    with pytest.raises(ValueError, match="^info_dict: num_warps"):
        gr.template_config({**info, "num_warps": 4}, desc)
    with pytest.raises(ValueError, match="^description: no integer BLOCK_K"):
        gr.template_config(info, desc.replace("BLOCK_K=256, ", ""))


def test_capture_takes_either_torchs_feedback_signature():
    cap = gs.Capture()
    cap({"c": 0.5}, "grouped_mm", [], ["c"], lambda: {})             # 5 arguments (older torch)
    cap({"d": 0.25}, "grouped_mm", [], ["d"], lambda: {}, {"d": 1.0})  # 6 (torch 2.13: precompile times)
    assert [(n, pairs) for n, pairs, _ in cap.calls] == [("grouped_mm", [("c", 0.5)]), ("grouped_mm", [("d", 0.25)])]


def test_choice_kinds_by_class():
    class Bm:
        num_stages = 3

    TritonTemplateCaller = type("TritonTemplateCaller", (), {"bmreq": Bm()})
    ExternKernelCaller = type("ExternKernelCaller", (), {})
    CuteDSLTemplateCaller = type("CuteDSLTemplateCaller", (), {"bmreq": Bm()})
    assert [gs.choice_kind(c()) for c in (TritonTemplateCaller, ExternKernelCaller, CuteDSLTemplateCaller)] == \
        ["triton", "aten", "other"]


# ------------------------------------------------------------------------------------- rows, shards

def _synthetic_rows(p: gr.GroupedProblem) -> list[dict]:
    """Rows shaped like the sweep's, marked synthetic; the times are placeholders (not kernel timings)."""
    base = {**gs._base(p), "synthetic": True}
    rows = []
    for routing, counts in gr.problem_routings(p):
        st = gr.routing_stats(counts)
        for i, c in enumerate(gr.expected_configs(p, 232448)[:3]):
            rows.append({**base, "kind": "triton", "block_m": c[0], "block_n": c[1], "block_k": c[2],
                         "num_stages": c[3], "num_warps": c[4], "routing": routing, "timer": "perfmodel",
                         "inductor_ms": 1.0 + i, "status": "ok", "ms": 1.0 + i, **st})
        rows.append({**base, "kind": "aten", "routing": routing, "timer": "perfmodel", "inductor_ms": 2.0,
                     "counts": counts, "status": "ok", "ms": 2.0, **st})
    return rows


def _head(torch_version: str = "2.11.0", device: str = "NVIDIA H100 80GB HBM3") -> dict:
    return {"device_name": device, "sm_count": 132, "capability": [9, 0], "kernel_hash": "k" + torch_version,
            "schema_version": 1, "torch": torch_version, "triton": "3.6.0", "synthetic": True}


def test_validate_row_names_the_field():
    p = gr.grouped_problems()[0]
    good = {**_synthetic_rows(p)[0], "unit": gr.problem_id(p)}
    gr.validate_row(good)
    bad = [({"routing": "uniform"}, "^routing:"), ({"kind": "cublas"}, "^kind:"), ({"status": "okay"}, "^status:"),
           ({"ms": None}, "^ms:"), ({"ms": float("inf")}, "^ms:"), ({"block_k": 0}, "^block_k:"),
           ({"total_m": good["total_m"] + 1}, "^total_m:"), ({"g": "8"}, "^g:"), ({"timer": "cuda"}, "^timer:"),
           ({"status": "fail:launch:X", "ms": 1.0}, "^ms:"), ({"timer": "inductor", "inductor_ms": 3.0}, "^timer:")]
    for change, match in bad:
        with pytest.raises(ValueError, match=match):
            gr.validate_row({**good, **change})
    with pytest.raises(ValueError, match="^family:"):
        gr.validate_row({k: v for k, v in good.items() if k != "family"})
    gr.validate_row({**good, "status": "fail:wrong_result"})  # a wrong result keeps its time
    gr.validate_row({**good, "status": "fail:not_benchmarked", "ms": None, "inductor_ms": None})


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_shard_round_trip_resume_and_refusals(tmp_path):
    ps = gr.grouped_problems(families=("mixtral", "qwen3_moe"), dtypes=("bfloat16",))[:6]
    settings = gr.GroupedSweepSettings(max_problems=4)
    ran = []

    def run_one(p):
        ran.append(gr.problem_id(p))
        return _synthetic_rows(p)

    stats = gs.sweep(tmp_path, ps, _head(), run_one, settings)
    assert stats["problems"] == 4 and stats["stopped"] == "done" and stats["failed_problems"] == 0
    rows, headers = gr.read_grouped(tmp_path, allow_synthetic=True)
    assert {r["unit"] for r in rows} == {gr.problem_id(p) for p in ps[:4]} and headers[0]["kind"] == gr.KIND
    assert rows == [json.loads(json.dumps(r)) for r in rows] and len(rows) == sum(len(_synthetic_rows(p)) for p in ps[:4])
    with pytest.raises(ValueError, match="synthetic rows"):
        gr.read_grouped(tmp_path)
    # a torn unit (no done marker) does not count: the resumed run redoes it
    part = next(tmp_path.glob("grouped-*.jsonl"))
    with open(part, "a") as f:
        f.write(json.dumps({**_synthetic_rows(ps[4])[0], "unit": gr.problem_id(ps[4])}) + "\n")
    ran.clear()
    stats = gs.sweep(tmp_path, ps, _head(), run_one, gr.GroupedSweepSettings())
    assert ran == [gr.problem_id(p) for p in ps[4:]] and stats["already_done"] == 4
    rows, _ = gr.read_grouped(tmp_path, allow_synthetic=True)
    assert sorted({r["unit"] for r in rows}) == sorted(gr.problem_id(p) for p in ps)
    # nothing left: a third run times nothing
    ran.clear()
    assert gs.sweep(tmp_path, ps, _head(), run_one, gr.GroupedSweepSettings())["problems"] == 0 and not ran
    # another torch or device: refused before anything is timed
    for other in (_head(torch_version="2.13.0"), _head(device="NVIDIA H200")):
        with pytest.raises(RuntimeError, match="^--out: .* use another folder"):
            gs.sweep(tmp_path, ps, other, run_one, gr.GroupedSweepSettings())
    assert not ran


def test_time_limit_stops_before_a_problem_that_would_pass_it(tmp_path):
    ps = gr.grouped_problems(families=("gpt_oss",))[:10]
    clock = FakeClock()

    def run_one(p):
        clock.t += 30.0  # each problem "takes" 30 s of the fake clock
        return _synthetic_rows(p)

    stats = gs.sweep(tmp_path, ps, _head(), run_one, gr.GroupedSweepSettings(time_limit_s=90.0),
                     estimate_s=lambda p: 10.0, clock_s=clock)
    # 0 -> 30 -> 60: a third problem would need 1.25 x 30 s and end past 90 s
    assert stats["problems"] == 2 and stats["stopped"] == "time_limit"
    assert len({r["unit"] for r in gr.read_grouped(tmp_path, allow_synthetic=True)[0]}) == 2


def test_a_failing_problem_is_recorded_and_the_sweep_goes_on(tmp_path, capsys):
    ps = gr.grouped_problems(families=("qwen15_moe",))[:8]

    def run_one(p):
        if p is ps[1]:
            raise KeyError("no such attribute on torch 2.11")
        return _synthetic_rows(p)

    stats = gs.sweep(tmp_path, ps, _head(), run_one, gr.GroupedSweepSettings(max_problems=4))
    assert stats["problems"] == 4 and stats["failed_problems"] == 1
    rows, _ = gr.read_grouped(tmp_path, allow_synthetic=True)
    failed = [r for r in rows if r["unit"] == gr.problem_id(ps[1])]
    assert len(failed) == 1 and failed[0]["status"].startswith("fail:problem:KeyError") and failed[0]["ms"] is None
    assert "Traceback" in capsys.readouterr().err
    # the same error three problems in a row stops the sweep
    def always(p):
        raise RuntimeError("make_run_fn moved")

    stats = gs.sweep(tmp_path / "b", ps, _head(), always, gr.GroupedSweepSettings())
    assert stats["problems"] == gs.MAX_SAME_FAILURES and stats["stopped"].startswith("3 problems in a row failed")


def test_malformed_rows_from_a_problem_become_a_failure(tmp_path):
    ps = gr.grouped_problems(families=("mixtral",))[:2]

    def run_one(p):
        return [{**r, "routing": "nope"} for r in _synthetic_rows(p)]

    stats = gs.sweep(tmp_path, ps, _head(), run_one, gr.GroupedSweepSettings())
    rows, _ = gr.read_grouped(tmp_path, allow_synthetic=True)
    assert stats["failed_problems"] == 2 and all(r["status"].startswith("fail:problem:ValueError:routing") for r in rows)


# --------------------------------------------------------------------------------------------- CLI

def test_dry_run_prints_the_list_and_counts(capsys):
    from perfmodel.cli import main

    assert main(["gen", "grouped", "--dry-run", "--max-problems", "14", "--dtypes", "bfloat16"]) == 0
    out = capsys.readouterr().out
    lines = [l for l in out.splitlines() if l.strip().split(" ")[0].isdigit()]
    assert len(lines) == 14 and all("bfloat16" in l for l in lines)
    counts = json.loads(out[out.index("{"):])
    assert counts["problems"] == 14 and sum(counts["by_family"].values()) == 14
    est = counts["estimate_first_60"]
    assert est["template_choices"] > 0 and est["rows"] > est["template_choices"] and est["wall_s"] > 0


@pytest.mark.parametrize("argv,match", [(["--dtypes", "fp8"], "--dtypes"), (["--time-limit", "0"], "--time-limit"),
                                        (["--max-problems", "0"], "--max-problems"), (["--families", "x"], "--families")])
def test_bad_flags_exit_2_naming_the_flag(argv, match, capsys):
    from perfmodel.cli import main

    assert main(["gen", "grouped", "--dry-run", *argv]) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err


def test_make_run_fn_takes_either_output_keyword_and_operands_follow_the_compiled_layout():
    import torch

    class New:
        def make_run_fn(self, *inputs, out):
            return ("out", inputs, out)

    class Old:
        def make_run_fn(self, *inputs, output_tensor):
            return ("output_tensor", inputs, output_tensor)

    class Neither:
        def make_run_fn(self, *inputs):
            return None

    assert gs.make_run_fn(New(), [1, 2], "o") == ("out", (1, 2), "o")
    assert gs.make_run_fn(Old(), [1, 2], "o") == ("output_tensor", (1, 2), "o")
    with pytest.raises(TypeError, match="no out / output_tensor"):
        gs.make_run_fn(Neither(), [1], "o")

    class Meta:
        def __init__(self, t):
            self.sizes, self.strides, self.dtype = tuple(t.shape), tuple(t.stride()), t.dtype

    b = torch.randn(4, 16, 8).transpose(-2, -1)  # (G, K, N) = (4, 8, 16), stride 1 along K
    copies: dict = {}
    assert gs.operand_as(Meta(b), b, copies) is b and not copies
    contiguous = Meta(b.contiguous())
    c = gs.operand_as(contiguous, b, copies)
    assert c.stride() == b.contiguous().stride() and torch.equal(c, b) and gs.operand_as(contiguous, b, copies) is c
    with pytest.raises(RuntimeError, match="input meta"):
        gs.operand_as(Meta(b.float()[:2]), b, copies)


class _Meta:
    def __init__(self, t):
        self.sizes, self.strides, self.dtype = tuple(t.shape), tuple(t.stride()), t.dtype


class _FakeBench:
    """Bench's interface on the CPU: runs each callable (so outputs are real) and returns placeholder times."""

    def __init__(self):
        import torch

        self.device = torch.device("cpu")
        self.last_stalls: list[int] = []

    def timed_run(self, fn):
        fn()
        return (None, None, False)

    def time_many(self, fns, on_busy=None, first_runs=None, peers=None):
        if on_busy:
            on_busy()
        self.last_stalls = [0] * len(fns)
        return [(0.5 + 0.01 * i, 3) for i in range(len(fns))]


def test_run_problem_end_to_end_with_stand_in_choices(monkeypatch):
    """run_problem's path on the CPU: Inductor's compile replaced by a capture of stand-in choices (a template
    choice per expected config whose run function computes the product with aten, one that writes a wrong
    result, one missing, aten's extern choice); the times are placeholders. Checks the rows, not any timing."""
    import torch
    from torch._inductor.kernel import mm_grouped

    from perfmodel.devices import get_spec

    monkeypatch.setattr(mm_grouped, "get_gpu_shared_memory", lambda: 232448)
    p = gr.GroupedProblem("mixtral", "down", 8, 2, 16, 256, 128, "bfloat16", "kmajor")  # 32 rows, 4 per expert
    expected = gr.expected_configs(p, 232448)

    class Bm:
        num_stages = 3

        def __init__(self, wrong):
            self.wrong = wrong

        def make_run_fn(self, a, b, offs, out):

            def run():
                out.copy_(torch._grouped_mm(a, b, offs=offs) * (2 if self.wrong else 1))
            return run

    TritonTemplateCaller = type("TritonTemplateCaller", (), {})
    ExternKernelCaller = type("ExternKernelCaller", (), {})

    def fake_autotune(p_, a, b, offs, patches):
        cap = gs.Capture()
        out = torch.empty(p_.total_m, p_.n, dtype=a.dtype)
        timings = {}
        for i, c in enumerate(expected[:-1]):  # the last config: "Inductor did not benchmark it"
            ch = TritonTemplateCaller()
            ch.bmreq = Bm(wrong=i == 1)
            ch.bmreq.input_tensor_meta = [_Meta(a), _Meta(b), _Meta(offs)]
            ch.bmreq.output_tensor_meta = _Meta(out)
            kw = {"BLOCK_M": c[0], "BLOCK_N": c[1], "BLOCK_K": c[2], "NUM_SMS": 132, "A_IS_2D": True}
            ch.description = _description(kw, c[3], c[4])
            ch.info_dict = lambda c=c: {"tile_shape": str((c[0], c[2], c[1])), "num_stages": c[3], "num_warps": c[4]}
            timings[ch] = 0.1 + 0.01 * i
        timings[ExternKernelCaller()] = 0.2
        cap({**timings}, "grouped_mm", [], list(timings), lambda: {})
        return cap

    monkeypatch.setattr(gs, "autotune", fake_autotune)
    monkeypatch.setattr(gs, "_fresh_cache", lambda: __import__("contextlib").nullcontext())

    class Clock:
        def sm_clock_mhz(self):
            return 1980.0

    stats = {"compile_s": 0.0, "timing_s": 0.0, "choices": 0}
    rows = gs.run_problem(p, get_spec("h100-sxm"), _FakeBench(), _FakeBench(), Clock(), gr.GroupedSweepSettings(),
                          {}, {}, stats)
    pid = gr.problem_id(p)
    for r in rows:
        gr.validate_row({**r, "unit": pid})
    routings = [r for r, _ in gr.problem_routings(p)]
    tri = [r for r in rows if r["kind"] == "triton"]
    assert stats["choices"] == len(expected) - 1
    # every benchmarked config on every routing; the missing one once, as a failure
    assert len([r for r in tri if r["timer"] == "perfmodel"]) == (len(expected) - 1) * len(routings)
    missing = [r for r in tri if r["status"] == "fail:not_benchmarked"]
    assert len(missing) == 1 and missing[0]["block_m"] == expected[-1][0] and missing[0]["block_k"] == expected[-1][2]
    wrong = [r for r in tri if r["status"] == "fail:wrong_result"]
    assert len(wrong) == len(routings) and all((r["block_m"], r["block_n"], r["block_k"]) == expected[1][:3] for r in wrong)
    ok = [r for r in tri if r["status"] == "ok"]
    assert ok and all(r["rel_err"] < 0.03 and r["inductor_ms"] is not None and r["sm_clock_mhz"] == 1980.0 for r in ok)
    aten = [r for r in rows if r["kind"] == "aten"]
    assert [r["routing"] for r in aten] == routings and all(r["status"] == "ok" and r["inductor_ms"] == 0.2 for r in aten)
    assert all(sum(r["counts"]) == p.total_m for r in aten)
    # an fp16 problem whose compile fails (torch's meta function takes bf16 only): failure rows, aten still timed
    def failing(*a, **k):
        raise RuntimeError("Failed running call_function: Expected inputs of BF16 type but got float16")

    monkeypatch.setattr(gs, "autotune", failing)
    q = gr.GroupedProblem("mixtral", "down", 8, 2, 16, 256, 128, "float16", "kmajor")
    known_bad: dict = {}
    rows = gs.run_problem(q, get_spec("h100-sxm"), _FakeBench(), _FakeBench(), Clock(), gr.GroupedSweepSettings(),
                          {}, known_bad, stats)
    assert "float16" in known_bad
    assert all(r["status"].startswith("fail:compile:RuntimeError") for r in rows if r["kind"] == "triton")
    assert len([r for r in rows if r["kind"] == "triton"]) == len(gr.expected_configs(q, 232448))
    assert {r["routing"] for r in rows if r["kind"] == "aten"} == set(r for r, _ in gr.problem_routings(q))


def test_per_expert_selects_rows_per_expert_and_refuses_others():
    ps = gr.grouped_problems(families=("mixtral", "qwen3_moe"), dtypes=("bfloat16",), per_expert=(64,))
    assert ps and all(round(p.total_m / p.g) == 64 for p in ps)
    assert gr.parse_per_expert("64,512") == (64, 512)
    for bad in ("7", "x", ""):
        with pytest.raises(ValueError, match="--per-expert"):
            gr.parse_per_expert(bad)
    with pytest.raises(ValueError, match="per_expert"):
        gr.grouped_problems(per_expert=(7,))
