"""`perfmodel plan` (serve/plan.py, serve/plan_trace.py) and the deterministic set-up (choices.DETERMINISTIC), on
the CPU: the table is read back by the installed torch's own LookupTableChoices on Inductor's own MMKernelInputs."""
from __future__ import annotations

import json

import pytest
import torch

from perfmodel.serve import plan as plan_mod
from perfmodel.serve.choices import DETERMINISTIC, LOG, Policy, select
from perfmodel.serve.plan import plan
from perfmodel.serve.plan_trace import opaque_sdpa, trace_gemms

from tests._inductor import MMInputs, choice

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def predictor():
    return plan_mod._predictor("h100-sxm", None, "torch")


@pytest.fixture(scope="module")
def planned(predictor):
    return plan(["mm:4096,4096,4096", "mm:100,200,300", "addmm:8,1024,1024", "bmm:16,512,512,64"],
                predictor=predictor, device="h100")


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kw, names", [
    (dict(gemms=["mm:1,2"]), "M,N,K"),
    (dict(gemms=["mm:1,x,3"]), "N: expected a positive int"),
    (dict(gemms=["mm:1,0,3"]), "N: expected a positive int"),
    (dict(gemms=["conv:1,2,3"]), "expected mm:M,N,K"),
    (dict(gemms=["mm:1,2,3"], dtype="int8"), "--dtype"),
    (dict(gemms=["mm:1,2,3"], device="a100"), "--device: unknown device 'a100'; known: h100, h200"),
    (dict(model_fn="no_such_pkg.mod:build"), "module 'no_such_pkg.mod' does not import"),
    (dict(model_fn="json:no_such_factory"), "has no callable 'no_such_factory'"),
    (dict(model_fn="no_colon"), "package.module:factory"),
    (dict(), "nothing to plan"),
])
def test_bad_input_named(kw, names):
    with pytest.raises(ValueError, match=None) as err:
        plan(**kw)
    assert names in str(err.value)


def test_cli_one_line_error(capsys):
    from perfmodel.cli import main

    assert main(["plan", "--gemm", "mm:1,2,3", "--device", "mi300"]) == 2
    assert "perfmodel plan: error: --device: unknown device 'mi300'" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- the table
def test_rows_and_entries(planned):
    rows = {(r.gemm.op, r.problem.m): r for r in planned.rows}
    assert len(rows) == 4
    for r in planned.rows:
        assert r.margin is None or r.margin >= 0.0  # the chosen side is the one predicted no slower
        for key, entries in r.entries.items():
            assert key.startswith(H100 + "+((torch.bfloat16, ") and key.endswith("+" + r.gemm.op)
            assert len(entries) == 1
    addmm = rows[("addmm", 8)]
    (key,) = addmm.entries  # one key, the bias expanded to [M, N], as the deterministic compile records it
    assert key.split("+")[1].split("), ")[0] == "((torch.bfloat16, [8, 1024], [0, 1]"
    assert key.endswith("+alpha=1&beta=1+addmm")
    (entry,) = addmm.entries[key]
    assert entry["template_id"] == ("triton::mm" if addmm.triton else "aten::bias_addmm")
    table = json.loads(json.dumps(planned.table))
    assert table == planned.table and len(table) == 4
    assert "Triton" in planned.text() and "margin" in planned.text()


def _inductor_inputs(op, operands, scalars):
    """Inductor's own MMKernelInputs for the operands (InputBuffers on a CUDA device: no GPU touched); an addmm's
    with the bias expanded by Inductor's own mm_args, as torch 2.11's tuned_addmm builds them for aten's choices
    and the Triton template's alike (the key its deterministic compile recorded; torch 2.13 builds aten's choices
    from the bias as given)."""
    from torch._inductor import ir
    from torch._inductor.kernel.mm_common import mm_args
    from torch._inductor.kernel_inputs import MMKernelInputs

    dev = torch.device("cuda", 0)
    nodes = [ir.TensorBox.create(ir.InputBuffer(name=f"arg{i}", layout=ir.FixedLayout(
        dev, getattr(torch, o.dtype), list(o.shape), list(o.stride)))) for i, o in enumerate(operands)]
    if op != "addmm":
        return {"both": MMKernelInputs(nodes)}
    *_, mat1, mat2, expanded = mm_args(nodes[1], nodes[2], nodes[0])
    return {"both": MMKernelInputs([expanded, mat1, mat2], scalars=dict(scalars))}


def test_torch_loader_finds_every_entry(planned):
    """The installed torch's LookupTableChoices.lookup_template_configs on Inductor's MMKernelInputs finds and
    parses each entry (template hash checked against the installed templates); only the two overrides that a
    CPU needs: the table (read only where CUDA is available) and the device key (gcnArchName of the CUDA card,
    which CUDA builds set to its name)."""
    from torch._inductor import config
    from torch._inductor.graph import GraphLowering
    from torch._inductor.lookup_table import LookupTableChoices
    from torch._inductor.virtualized import V

    table = json.loads(json.dumps(planned.table))

    class OnCpu(LookupTableChoices):
        def _get_lookup_table(self):
            return table

        @staticmethod
        def _get_device_key(device):
            return H100 if device.type == "cuda" else None

    hashes = plan_mod.template_hashes()
    found = 0
    with V.set_graph_handler(GraphLowering(torch.fx.symbolic_trace(lambda x: x))), \
            config.patch({"lookup_table.check_src_hash": True}):
        for r in planned.rows:
            g = r.gemm
            for side, ki in _inductor_inputs(g.op, g.operands, g.scalars).items():
                uids = [plan_mod.aten_id(plan_mod.kernel_gemm(g, r.problem)), plan_mod.TRITON_ID[g.op]]
                got = OnCpu().lookup_template_configs(ki, g.op, uids, hashes)
                key = OnCpu().make_lookup_key(ki, g.op, include_device=True)
                want = {e["template_id"]: [{k: v for k, v in e.items() if k not in ("template_id", "template_hash")}]
                        for e in table[key]}
                assert got == want, (side, key)
                found += 1
        assert found == 4
        # a stale template hash is refused by torch's check
        stale = {k: [dict(e, template_hash="0" * 64) if "BLOCK_M" in e else e for e in v] for k, v in table.items()}
        table.clear()
        table.update(stale)
        g = next(r.gemm for r in planned.rows if r.triton and r.gemm.op == "mm")
        assert OnCpu().lookup_template_configs(_inductor_inputs("mm", g.operands, ())["both"], "mm",
                                               ["aten::mm", "triton::mm"], hashes) == {}


def test_device_agnostic_keys(predictor):
    p = plan(["mm:64,64,64"], predictor=predictor, device_name=None, template_hash=False)
    (key,) = p.table
    assert key == "((torch.bfloat16, [64, 64], [64, 1]), (torch.bfloat16, [64, 64], [64, 1]))+mm"
    assert all("template_hash" not in e for e in p.table[key])


# ---------------------------------------------------------------------------------------------- a traced model
class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(64, 128)
        self.down = torch.nn.Linear(128, 32, bias=False)

    def forward(self, x, y):
        return self.down(self.up(x)), torch.bmm(y, y.transpose(1, 2))


def build_net():
    """A factory for --model-fn: the model on the meta device (no weights allocated), example inputs."""
    with torch.device("meta"):
        return _Net().to(torch.bfloat16), (torch.empty(4, 16, 64, dtype=torch.bfloat16),
                                            torch.empty(2, 8, 32, dtype=torch.bfloat16))


def test_trace_finds_gemms_without_a_gpu(predictor):
    model, inputs = build_net()
    got = [(g.op, [(o.shape, o.stride) for o in g.operands]) for g in trace_gemms(model, inputs)]
    assert got == [("addmm", [((128,), (1,)), ((64, 64), (64, 1)), ((64, 128), (1, 64))]),
                   ("mm", [((64, 128), (128, 1)), ((128, 32), (1, 128))]),
                   ("bmm", [((2, 8, 32), (256, 32, 1)), ((2, 32, 8), (256, 1, 32))])]
    p = plan(model_fn="tests.test_plan:build_net", predictor=predictor, device="h200")
    assert [r.gemm.op for r in p.rows] == ["addmm", "mm", "bmm"]
    assert all(k.startswith("NVIDIA H200+") for k in p.table)


class _Attn(torch.nn.Module):
    """One attention layer: fused (scaled_dot_product_attention) or eager (its matmuls written out)."""

    def __init__(self, eager: bool) -> None:
        super().__init__()
        self.eager, self.qkv, self.out = eager, torch.nn.Linear(64, 192, bias=False), torch.nn.Linear(64, 64, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, 4, 16).transpose(1, 2) for t in self.qkv(x).split(64, dim=-1))
        if self.eager:
            o = torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1) @ v
        else:
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(o.transpose(1, 2).reshape(b, s, 64))


@pytest.mark.parametrize("eager", [False, True])
def test_trace_keeps_sdpa_opaque(eager):
    """scaled_dot_product_attention is no GEMM of the plan (a CUDA compile runs it fused; traced off CUDA its math
    decomposition would give fp32 bmm); eager attention's matmuls are planned as bmm; the function is restored."""
    import torch.nn.functional as F

    prior = F.scaled_dot_product_attention
    with torch.device("meta"):
        model, x = _Attn(eager).to(torch.bfloat16), torch.empty(2, 8, 64, dtype=torch.bfloat16)
    got = [(g.op, g.operands[0].dtype, g.mats[0].shape, g.mats[1].shape) for g in trace_gemms(model, (x,))]
    attn = [("bmm", "bfloat16", (8, 8, 16), (8, 16, 8)), ("bmm", "bfloat16", (8, 8, 8), (8, 8, 16))] if eager else []
    assert got == [("mm", "bfloat16", (16, 64), (64, 192))] + attn + [("mm", "bfloat16", (16, 64), (64, 64))]
    assert F.scaled_dot_product_attention is prior
    real = torch.randn(1, 2, 4, 8)
    with opaque_sdpa():
        assert torch.equal(F.scaled_dot_product_attention(real, real, real), prior(real, real, real))


# ---------------------------------------------------------------------------------------------- deterministic
def test_deterministic_policy_hands_inductor_one_choice(predictor):
    """SYNTHETIC choices (tests/_inductor.py): aten and Inductor's default Triton configs; DETERMINISTIC keeps one
    choice per call (nothing for Inductor to benchmark), and two runs decide the same."""
    from perfmodel.configs import inductor_default_configs

    assert DETERMINISTIC == Policy(keep_aten=False) and DETERMINISTIC.top_k == 1
    runs = []
    for _ in range(2):
        LOG.reset()
        kept = []
        for m, n, k in ((4096, 4096, 4096), (100, 200, 300), (8, 1024, 1024)):
            choices = [choice("aten::mm")] + [choice("triton::mm", c) for c in inductor_default_configs()]
            out = select(choices, MMInputs(m, n, k, torch.bfloat16), "mm", predictor, DETERMINISTIC)
            assert len(out) == 1
            kept.append(out[0].template.uid + str(out[0].params.to_kwargs()))
        runs.append((kept, [(d.triton, d.configs) for d in LOG.decisions.values()]))
    LOG.reset()
    assert runs[0] == runs[1]
    assert {k.split("{")[0] for k in runs[0][0]} == {"aten::mm", "triton::mm"}


def test_compile_deterministic_argument():
    from perfmodel.serve.choices import MAX_AUTOTUNE
    from perfmodel.serve.compile import _deterministic_policy

    assert _deterministic_policy(None, True) is DETERMINISTIC
    assert _deterministic_policy(None, False) is None
    with pytest.raises(ValueError, match="deterministic"):
        _deterministic_policy(MAX_AUTOTUNE, True)
    with pytest.raises(TypeError, match="deterministic"):
        _deterministic_policy(None, "yes")


# ---------------------------------------------------------------------------------------------- the recorded table
def test_recorded_key_is_torchs(planned, monkeypatch):
    """kernel_inputs_key on Inductor's own MMKernelInputs (CUDA InputBuffers, no GPU touched; the device name
    stubbed) equals the installed torch's LookupTableChoices.make_lookup_key and the plan's key."""
    from torch._inductor.graph import GraphLowering
    from torch._inductor.lookup_table import LookupTableChoices
    from torch._inductor.virtualized import V

    class OnCpu(LookupTableChoices):
        @staticmethod
        def _get_device_key(device):
            return H100 if device.type == "cuda" else None

    monkeypatch.setattr(plan_mod, "_cuda_device_name", lambda index: H100)
    with V.set_graph_handler(GraphLowering(torch.fx.symbolic_trace(lambda x: x))):
        for r in planned.rows:
            g = r.gemm
            for side, ki in _inductor_inputs(g.op, g.operands, g.scalars).items():
                key = plan_mod.kernel_inputs_key(ki, g.op)
                assert key == OnCpu().make_lookup_key(ki, g.op, include_device=True), side
                assert key in planned.table, side


def test_recorded_table_equals_the_plans(predictor, tmp_path):
    """SYNTHETIC choices (tests/_inductor.py, stand-in kernel inputs without a device: device-agnostic keys): the
    deterministic handler's recorded table (record_table) equals the plan's of the same GEMMs, template hash
    aside -- the Triton choices those Inductor offers for each problem (plan.offered_configs, scaled to the sizes:
    BLOCK_M 16 for M=8) --; a second call of one shape adds nothing; reset() clears it."""
    from perfmodel.serve import compile as pc

    shapes = ((4096, 4096, 4096), (100, 200, 300), (8, 1024, 1024))
    pc.reset()
    for m, n, k in shapes + shapes[:1]:
        offered = plan_mod.offered_configs("mm", m, n, k, "bfloat16")
        choices = [choice("aten::mm")] + [choice("triton::mm", c) for c in offered]
        select(choices, MMInputs(m, n, k, torch.bfloat16), "mm", predictor, DETERMINISTIC)
    recorded = pc.lookup_table()
    p = plan([f"mm:{m},{n},{k}" for m, n, k in shapes], predictor=predictor, device_name=None, template_hash=False)
    assert len(recorded) == 3 and all(len(v) == 1 for v in recorded.values())
    cmp = plan_mod.compare_tables(p.table, recorded)
    assert cmp["equal"] and cmp["both"] == 3, cmp
    assert {e["template_id"] for v in recorded.values() for e in v} == {"aten::mm", "triton::mm"}
    assert json.loads(pc.write_lookup_table(tmp_path / "table.json").read_text()) == recorded
    pc.reset()
    assert pc.lookup_table() == {}


def test_compare_tables_names_each_difference():
    a = {"k1": [{"template_id": "aten::mm"}], "k2": [{"template_id": "triton::mm", "BLOCK_M": 64, "template_hash": "x"}],
         "k3": [{"template_id": "aten::mm"}]}
    b = {"k1": [{"template_id": "aten::mm"}], "k2": [{"template_id": "triton::mm", "BLOCK_M": 64, "template_hash": "y"}],
         "k4": [{"template_id": "aten::mm"}]}
    cmp = plan_mod.compare_tables(a, b)
    assert (cmp["both"], cmp["only_a"], cmp["only_b"], cmp["differ"], cmp["equal"]) == (2, ["k3"], ["k4"], {}, False)
    b["k2"][0]["BLOCK_M"] = 128
    assert list(plan_mod.compare_tables(a, b)["differ"]) == ["k2"]
    assert plan_mod.compare_tables(a, a)["equal"]


# ---------------------------------------------------------------------------------------------- offered configs
def test_offered_configs_are_inductors_scaled_list():
    """plan.offered_configs: the installed torch's CUDA mm heuristic's list scaled to the problem and de-duplicated
    (BaseConfigHeuristic._scale_mm_configs / _finalize_mm_configs): for M=8 every BLOCK_M is 16 (next_power_of_2(8)
    raised to the minimum block 16), num_warps capped at one per 16x16 tile -- among them the two configs the H200's
    deterministic compile kept for Llama-3-8B's decode (benchmarks/results/lookup_tables_h200_recorded)."""
    from perfmodel.configs import inductor_default_configs
    from perfmodel.schema import GemmConfig

    big = plan_mod.offered_configs("mm", 4096, 4096, 4096, "bfloat16")
    assert list(big) == inductor_default_configs()  # nothing to scale, nothing merged
    small = plan_mod.offered_configs("mm", 8, 14336, 4096, "bfloat16")
    assert {c.block_m for c in small} == {16} and len(small) == len(set(small)) < len(big)
    assert small[0] == GemmConfig(16, 32, 16, 8, 1, 2)
    assert GemmConfig(16, 128, 128, 8, 4, 4) in small and GemmConfig(16, 128, 128, 8, 4, 8) in small
    assert all(c.num_warps <= c.block_m * c.block_n // 256 for c in small)
    assert plan_mod.offered_configs("bmm", 8, 14336, 4096, "bfloat16") == small


def test_triton_entry_is_torchs_template_kwargs():
    """The plan's Triton entry for a scaled config equals the kwargs torch's own mm heuristic makes of it
    (MMTemplateConfigMixin._convert_config_to_template_kwargs: EVEN_K, ACC_TYPE, ...), hint_override aside."""
    from torch._inductor.runtime.triton_compat import Config
    from torch._inductor.sizevars import SizeVarAllocator
    from torch._inductor.template_heuristics.registry import get_template_heuristic
    from torch._inductor.virtualized import V

    from perfmodel.serve.plan_trace import parse_gemm

    class Graph:
        sizevars = SizeVarAllocator()

    h = get_template_heuristic("triton::mm", "cuda", "mm")
    with V.set_graph_handler(Graph()):
        _entries_are_torchs(h, Config, parse_gemm)


def _entries_are_torchs(h, Config, parse_gemm):
    for dtype, (m, n, k) in (("bfloat16", (8, 14336, 4096)), ("float32", (100, 200, 300))):
        g = parse_gemm(f"mm:{m},{n},{k}", dtype)
        for cfg in plan_mod.offered_configs("mm", m, n, k, dtype):
            tc = Config(dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m),
                        num_stages=cfg.num_stages, num_warps=cfg.num_warps)
            want = h._convert_config_to_template_kwargs(tc, m, n, k, getattr(torch, dtype))
            got = plan_mod.triton_entry(g, cfg, None)
            assert got == dict(want, template_id="triton::mm"), cfg


@pytest.mark.parametrize("pads", [True, False])
def test_an_mm_the_model_pads_is_keyed_as_pad_mm_lowers_it(predictor, monkeypatch, pads):
    """GPT-2's lm head (x @ W.T, N = 50257 misaligned for fp16): where the pad decision (stubbed here: the set-up's
    hook_pad_decision) pads, pad_mm pads N to 50264 and mat2 becomes a new contiguous tensor, and the plan keys the
    padded mm as the H200 compile recorded it ([768, 50264] stride [50264, 1]); else the mm as traced."""
    from perfmodel.schema import PadDecision
    from perfmodel.serve import decisions
    from perfmodel.serve.plan_trace import Gemm, Operand

    seen = []

    def decide(pred, pp, in_play, configs):
        seen.append((pp.m, pp.k, pp.n, pp.transpose_right, in_play))
        return PadDecision(pads, 1.0, 0.9)

    monkeypatch.setattr(decisions, "hook_pad_decision", decide)
    lm_head = Gemm("mm", (Operand("float16", (4096, 768), (768, 1)), Operand("float16", (768, 50257), (1, 768))))
    p = plan([lm_head], predictor=predictor, device="h200", template_hash=False)
    assert seen == [(4096, 768, 50257, True, True)]
    (key,) = p.table
    if pads:
        assert "(torch.float16, [768, 50264], [50264, 1])" in key and p.rows[0].padded_from == lm_head
        assert "padded from 4096x50257x768" in p.text()
    else:
        assert "(torch.float16, [768, 50257], [1, 768])" in key and p.rows[0].padded_from is None
    aligned = Gemm("mm", (Operand("float16", (4096, 768), (768, 1)), Operand("float16", (768, 768), (1, 768))))
    plan([aligned], predictor=predictor, device="h200", template_hash=False)
    assert len(seen) == 1  # nothing misaligned: no pad decision asked


# ------------------------------------------------------------------------- the trace as a CUDA compile sees it
def _qkv(dtype=torch.float16, b=2, h=4, n=8, d=16):
    return tuple(torch.empty(b, h, n, d, dtype=dtype, device="meta") for _ in range(3))


def test_cuda_sdpa_fused_follows_torchs_checks():
    """torch's CUDA choice (sdp_utils): flash for half without a mask; memory-efficient attention with a mask whose
    last dimension has stride 1, fp32 too; no fused kernel for a mask broadcast along its last dimension (stride 0,
    what transformers builds for BERT under Dynamo), for 3-D inputs, or for a head dim efficient attention cannot
    align (fp16 with a mask: a multiple of 8)."""
    from perfmodel.serve.plan_trace import cuda_sdpa_fused

    q, k, v = _qkv()
    assert cuda_sdpa_fused(q, k, v, None, True)
    row = torch.empty(2, 1, 1, 8, dtype=torch.bool, device="meta")
    assert cuda_sdpa_fused(q, k, v, row.expand(2, 1, 8, 8))                      # last-dim stride 1
    assert not cuda_sdpa_fused(q, k, v, torch.empty(2, 1, 8, 1, dtype=torch.bool, device="meta").expand(2, 1, 8, 8))
    assert cuda_sdpa_fused(*_qkv(torch.float32), row.expand(2, 1, 8, 8))        # efficient attention takes fp32
    assert not cuda_sdpa_fused(*(t[0] for t in _qkv()))                          # 3-D
    assert not cuda_sdpa_fused(*_qkv(d=12), row.expand(2, 1, 8, 8))              # 12 % 8 with a mask
    assert cuda_sdpa_fused(*_qkv(d=12))                                           # flash takes it without one


class _MaskedAttn(torch.nn.Module):
    """Attention with a mask broadcast along its last dimension (stride 0), as transformers builds BERT's under
    Dynamo: a CUDA compile runs it as torch's math, in fp32 for fp16 inputs."""

    def forward(self, q, k, v, keep):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep.expand(2, 1, 8, 8))


def test_trace_runs_sdpa_as_math_where_no_fused_kernel_takes_it():
    q, k, v = _qkv()
    keep = torch.empty(2, 1, 8, 1, dtype=torch.bool, device="meta")
    got = [(g.op, g.operands[0].dtype, g.mats[0].shape, g.mats[1].shape)
           for g in trace_gemms(_MaskedAttn(), (q, k, v, keep))]
    assert got == [("bmm", "float32", (8, 8, 16), (8, 16, 8)), ("bmm", "float32", (8, 8, 8), (8, 8, 16))]


class _Rotary(torch.nn.Module):
    """An outer product as transformers' rotary embedding writes it ([1, 64, 1] @ [1, 1, n]), on CPU tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv_freq", torch.ones(64))

    def forward(self, pos):
        return self.inv_freq[None, :, None].float() @ pos[:, None, :].float()


def test_trace_sees_a_batch_one_bmm_as_inductors_mm():
    """A bmm of batch 1 is the mm Inductor's joint-graph pass makes of it, where the installed torch lowers the outer
    product as a GEMM at all (torch 2.11 does; 2.13's bmm decomposition makes it a pointwise product)."""
    from perfmodel.serve.plan_trace import Gemm, Operand, batch_one_as_mm

    g = Gemm("bmm", (Operand("float32", (1, 64, 1), (64, 1, 1)), Operand("float32", (1, 1, 512), (512, 512, 1))))
    assert batch_one_as_mm(g) == Gemm("mm", (Operand("float32", (64, 1), (1, 1)),
                                              Operand("float32", (1, 512), (512, 1))))
    two = Gemm("bmm", (Operand("float32", (2, 64, 1), (64, 1, 1)), Operand("float32", (2, 1, 512), (512, 512, 1))))
    assert batch_one_as_mm(two) == two
    got = trace_gemms(_Rotary(), (torch.zeros(1, 512, dtype=torch.int64),))
    assert all(g.op == "mm" for g in got)          # traced with meta tensors although the module is on the CPU
    assert _Rotary().inv_freq.device.type == "cpu"


def test_keys_alias_the_strides_of_size_one_dims():
    """The entry is written under every stride a size-1 dimension may get in Inductor's IR (as traced, 0, the
    contiguous one); compare_tables sees them as one key and tells a missing GEMM from a different one."""
    from perfmodel.serve.plan import canonical_key, compare_tables, lookup_key, stride_aliases
    from perfmodel.serve.plan_trace import Operand

    a, b = Operand("float32", (64, 1), (1, 1)), Operand("float32", (1, 512), (512, 1))
    keys = {lookup_key("NVIDIA H200", ops, (), "mm") for ops in stride_aliases((a, b))}
    recorded = "NVIDIA H200+((torch.float32, [64, 1], [1, 0]), (torch.float32, [1, 512], [0, 1]))+mm"
    assert recorded in keys and len(keys) == 2 * 2   # {1, 0} for a, {512, 0} for b
    assert {canonical_key(k) for k in keys} == {canonical_key(recorded)}
    entry = [{"template_id": "mm"}]
    assert compare_tables(dict.fromkeys(keys, entry), {recorded: entry})["equal"]
    other = compare_tables(dict.fromkeys(keys, entry), {recorded: [{"template_id": "aten::mm"}]})
    assert not other["equal"] and len(other["differ"]) == 1
    assert stride_aliases((Operand("float16", (8, 64), (64, 1)),)) == [(Operand("float16", (8, 64), (64, 1)),)]
