"""Whole models under torch.compile: default mode, stock max-autotune and perfmodel's set-up, side by side (GPU).

Each workload is one line of WORKLOADS (a user adds theirs in one line): a model built from its config with
random weights (transformers / torchvision; nothing is downloaded), its inputs, its dtype, and whether any
perfmodel rule was tuned on it. Every workload runs in a fresh worker process; inside it the variants run one
after the other, each after torch._dynamo.reset() in a fresh Inductor cache:

  default          torch.compile(mode="reduce-overhead")       (default mode with CUDA graphs)
  max-autotune     torch.compile(mode="max-autotune")          (stock: every GEMM/bmm/conv config benchmarked,
                                                                 coordinate descent on pointwise kernels)
  perfmodel        perfmodel.serve.compile.compile(model)       (the recommended set-up: Policy())
  perfmodel-aten   the same options, the model never keeps Triton (a check: default mode's choices under the
                   set-up's options)
  perfmodel-top1   the set-up with Policy(top_k=1) (one Triton config beside aten where Triton is kept)
  perfmodel-top3   the set-up with Policy(top_k=3) (three)
  perfmodel-zero   Triton alone where predicted >= 10 % faster: no GEMM benchmark at all
  hook             the max-autotune hook: torch.compile(mode="max-autotune") inside
                   perfmodel.serve.inductor.installed(top_k=5, pad=True) (max-autotune itself, with the
                   model's top-5 Triton configs and cuBLAS call for mm/addmm/bmm)
  hook-m0          the hook with cublas_margin=0 (Triton kept wherever predicted faster than cuBLAS at all, the
                   set-up's rule) instead of -0.05
  hook-top1        the hook with top_k=1
  hook-nocd        the hook with Inductor's coordinate_descent_tuning off (max-autotune's tuning of each
                   Triton kernel's block sizes by benchmarks), everything else the hook's
  hook-nosure      the hook with bmm_sure_gain=None (aten::bmm always beside the kept bmm config, as before the
                   rule)
  perfmodel-nosure the set-up with Policy(bmm_sure_gain=None): aten::bmm always beside the kept bmm config (the
                   set-up before the rule that keeps a bmm's config alone where the model is sure of it)
  perfmodel-bmm3   the set-up with Policy(bmm_top_k=3) (three Triton bmm configs beside aten::bmm, as for mm;
                   the set-up keeps one)
  perfmodel-v2     the set-up (Policy()) run with the model folder shipped before the recipe build (models/h100:
                   encoder version 2; models/h200: the folder several commands made; git history): its rows,
                   kept beside the recipe-built folder's "perfmodel" rows; run it with --model pointing at that
                   folder
  perfmodel-b1     the set-up with the recipe's first build of models/h100 (its mm heads are the shipped folder's bit
                   for bit; its bmm heads were fitted on 1,200 bmm problems, the shipped on 1,800): its BERT-large,
                   T5-base and Swin-T rows (where the two decide bmm differently); run it with --model
  perfmodel-b2     the set-up with the recipe builds of models/h100 before the config network (a gemm head and a
                   static head; their mm decisions alike): its rows of the workloads where the config network
                   decides differently (Swin-T, Llama decode); run it with --model
  perfmodel-b3     the set-up with the recipe builds of models/h100 whose bmm heads were fitted on 1,800 bmm
                   problems (before the fifth and sixth bmm sweeps; their mm decisions the shipped folder's): its
                   rows of the workloads where the shipped bmm heads decide differently (BERT-large, T5-base,
                   Swin-T); run it with --model
  perfmodel-b4     the set-up before its two bmm rules (a bmm's config kept alone where the model is sure of it,
                   Policy.bmm_sure_gain; a bmm the model keeps Triton for left unpadded by the pad hook): its
                   BERT-large and Swin-T rows (the workloads the rules change)
  perfmodel-p0, perfmodel-nosure-p0, hook-p0, hook-nosure-p0
                   perfmodel, perfmodel-nosure, hook and hook-nosure before the pad hook's bmm rule (run r50)
  perfmodel-ieee   the set-up before it decided a float32 GEMM on TF32 as TF32 (it decided every float32 problem as
                   IEEE float32): run r70's FP32 BERT-base row
  perfmodel-1x1mm  the set-up with Inductor's max_autotune_gemm lowering of channels-last 1x1 convolutions as
                   mm (ranked like any mm) instead of default mode's convolution

Per variant: compile time = the first call's wall time, split into GEMM autotuning (Inductor's mm/addmm
template precompiling and autotuning timers, plus pad_mm's padding decision), other autotuning (bmm,
convolution and other templates' timers, coordinate-descent tuning and config benchmarking of pointwise and
reduction kernels) and the rest; step time = the median GPU time of 30 CUDA-graph replays (CUDA events, L2
flushed before each, a GPU spin ahead of each so that the host's launch work is not timed); the output
checked against eager (relative Frobenius error; a training step: the loss and one weight's gradient).
Inductor's own benchmark timings of every autotuned op are kept (select_algorithm's feedback saver), and
perfmodel's decisions for its variants.

    python benchmarks/model_bench.py [--workloads NAME,...] [--variants default,max-autotune,perfmodel]
        [--out benchmarks/results/model_bench_h100.json] [--time-limit 560] [--model models/h100]

Results merge into --out by (workload, variant): a run resumes where the last one stopped (--force re-runs).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_shared/clock.py

from _shared.clock import CompileClock  # noqa: E402


# ---------------------------------------------------------------------------------------------- workloads
@dataclass(frozen=True)
class Workload:
    name: str
    build: Callable[[Any], tuple[Any, tuple, Callable]]   # device -> (module, inputs, forward(module, *inputs))
    dtype: str
    train: bool = False
    tuned: bool = False      # a perfmodel rule was tuned on this workload (the five are "tuned")
    tf32: bool = False       # float32 matmuls on TF32 (torch.backends.cuda.matmul.allow_tf32) for every variant


def _hf(cls_name: str, cfg_name: str, **cfg: Any) -> Callable:
    def make(dtype: Any) -> Any:
        import transformers

        config = getattr(transformers, cfg_name)(**cfg)
        return getattr(transformers, cls_name)(config).to(dtype=dtype)
    return make


def _ids(vocab: int, *shape: int) -> Callable:
    return lambda dev: __import__("torch").randint(0, vocab, shape, device=dev)


def _lm(make: Callable, dtype: str, ids: Callable, key: str = "logits") -> Callable:
    def build(dev: Any):
        import torch

        m = make(getattr(torch, dtype)).to(dev).eval()
        return m, (ids(dev),), lambda mod, x: getattr(mod(input_ids=x), key)
    return build


def _vision(name: str, dtype: str, batch: int) -> Callable:
    def build(dev: Any):
        import torch
        import torchvision

        m = getattr(torchvision.models, name)().to(dev, getattr(torch, dtype)).eval()
        return m, (torch.randn(batch, 3, 224, 224, device=dev, dtype=getattr(torch, dtype)),), lambda mod, x: mod(x)
    return build


def _hf_vision(cls_name: str, cfg_name: str, dtype: str, batch: int, **cfg: Any) -> Callable:
    """A transformers vision model (random weights) on a batch of 224x224 images; last_hidden_state."""
    def build(dev: Any):
        import torch

        m = _hf(cls_name, cfg_name, **cfg)(getattr(torch, dtype)).to(dev).eval()
        x = torch.randn(batch, 3, 224, 224, device=dev, dtype=getattr(torch, dtype))
        return m, (x,), lambda mod, x: mod(pixel_values=x).last_hidden_state
    return build


def _whisper_encoder(dtype: str, batch: int, **cfg: Any) -> Callable:
    """transformers' Whisper encoder (random weights) on `batch` 30 s log-mel inputs (80 x 3000): 1,500 tokens."""
    def build(dev: Any):
        import torch

        m = _hf("WhisperModel", "WhisperConfig", **cfg)(getattr(torch, dtype)).get_encoder().to(dev).eval()
        x = torch.randn(batch, 80, 3000, device=dev, dtype=getattr(torch, dtype))
        return m, (x,), lambda mod, x: mod(input_features=x).last_hidden_state
    return build


def _t5(dtype: str, batch: int, src: int, tgt: int) -> Callable:
    def build(dev: Any):
        import torch

        m = _hf("T5ForConditionalGeneration", "T5Config", d_model=768, d_ff=3072, num_layers=12,
                num_decoder_layers=12, num_heads=12, use_cache=False)(getattr(torch, dtype)).to(dev).eval()
        return m, (_ids(32128, batch, src)(dev), _ids(32128, batch, tgt)(dev)), \
            lambda mod, x, y: mod(input_ids=x, decoder_input_ids=y).logits
    return build


def _gpt2_train(dtype: str, batch: int, seq: int, layers: int) -> Callable:
    def build(dev: Any):
        import torch

        m = _hf("GPT2LMHeadModel", "GPT2Config", n_layer=layers, use_cache=False, resid_pdrop=0.0,
                embd_pdrop=0.0, attn_pdrop=0.0)(getattr(torch, dtype)).to(dev).train()
        return m, (_ids(50257, batch, seq)(dev),), lambda mod, x: mod(input_ids=x).logits
    return build


_LLAMA = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=2, num_attention_heads=32,
              num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, use_cache=False)
_QWEN2 = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=2, num_attention_heads=28,
              num_key_value_heads=4, vocab_size=152064, max_position_embeddings=8192, use_cache=False)
_PHI3 = dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=2, num_attention_heads=32,
             num_key_value_heads=32, vocab_size=32064, max_position_embeddings=4096, use_cache=False)
_GEMMA = dict(hidden_size=2048, intermediate_size=16384, num_hidden_layers=2, num_attention_heads=8,
              num_key_value_heads=1, head_dim=256, vocab_size=256000, max_position_embeddings=8192, use_cache=False)
_BERT_L = dict(hidden_size=1024, num_hidden_layers=4, num_attention_heads=16, intermediate_size=4096)
_OPT = dict(hidden_size=2048, ffn_dim=8192, num_hidden_layers=2, num_attention_heads=32, word_embed_proj_dim=2048,
            vocab_size=50272, max_position_embeddings=2048, use_cache=False)

# One line a workload. tuned=True: the workloads of the issue that the set-up's rules were studied on.
WORKLOADS = [
    Workload("GPT-2 124M, fp16, 8x512", _lm(_hf("GPT2LMHeadModel", "GPT2Config", use_cache=False), "float16",
                                           _ids(50257, 8, 512)), "float16", tuned=True),
    Workload("BERT-large (4 layers), fp16, 16x384", _lm(_hf("BertModel", "BertConfig", **_BERT_L), "float16",
                                                       _ids(30522, 16, 384), "last_hidden_state"), "float16",
             tuned=True),
    Workload("ViT-B/16, fp16, batch 32", _vision("vit_b_16", "float16", 32), "float16", tuned=True),
    Workload("Llama-3-8B widths (2 layers), bf16, prefill 1x2048", _lm(_hf("LlamaForCausalLM", "LlamaConfig", **_LLAMA),
                                                                     "bfloat16", _ids(128256, 1, 2048)), "bfloat16",
             tuned=True),
    Workload("Llama-3-8B widths (2 layers), bf16, decode 8x1", _lm(_hf("LlamaForCausalLM", "LlamaConfig", **_LLAMA),
                                                                  "bfloat16", _ids(128256, 8, 1)), "bfloat16",
             tuned=True),
    Workload("Qwen2-7B widths (2 layers), bf16, 4x512", _lm(_hf("Qwen2ForCausalLM", "Qwen2Config", **_QWEN2),
                                                           "bfloat16", _ids(152064, 4, 512)), "bfloat16"),
    Workload("T5-base, bf16, 8x512 -> 128", _t5("bfloat16", 8, 512, 128), "bfloat16"),
    Workload("ResNet-50, fp16, batch 64", _vision("resnet50", "float16", 64), "float16", tuned=True),  # 1x1 convs
    Workload("GPT-2 (6 layers) training step, bf16, 8x512", _gpt2_train("bfloat16", 8, 512, 6), "bfloat16",
             train=True, tuned=True),  # the set-up's top_k = 3 was chosen on it
    Workload("Phi-3-mini widths (2 layers), bf16, prefill 2x1024", _lm(_hf("Phi3ForCausalLM", "Phi3Config", **_PHI3),
                                                                     "bfloat16", _ids(32064, 2, 1024)), "bfloat16"),
    Workload("ConvNeXt-T, fp16, batch 32", _vision("convnext_tiny", "float16", 32), "float16"),
    # window attention: q @ k^T and attn @ v as bmm over batch x windows x heads, head dim 32
    Workload("Swin-T, fp16, batch 32", _vision("swin_t", "float16", 32), "float16"),
    # added after every rule was set, none tuned on them: widths, vocabularies and batch shapes of their own
    Workload("RoBERTa-base, fp16, 32x128", _lm(_hf("RobertaModel", "RobertaConfig"), "float16",
                                              _ids(50265, 32, 128), "last_hidden_state"), "float16"),
    Workload("Gemma-2B widths (2 layers), bf16, 4x512", _lm(_hf("GemmaForCausalLM", "GemmaConfig", **_GEMMA),
                                                           "bfloat16", _ids(256000, 4, 512)), "bfloat16"),
    Workload("ViT-L/16, fp16, batch 16", _vision("vit_l_16", "float16", 16), "float16"),
    Workload("MobileNetV3-Large, fp16, batch 128", _vision("mobilenet_v3_large", "float16", 128), "float16"),
    # float32 models, IEEE (torch's default) and TF32 (set by the user; names start "FP32" so that no prefix of an
    # earlier workload selects them), and another decoder's widths
    Workload("FP32 GPT-2 124M (IEEE), 4x512", _lm(_hf("GPT2LMHeadModel", "GPT2Config", use_cache=False), "float32",
                                                 _ids(50257, 4, 512)), "float32"),
    Workload("FP32 BERT-base (TF32), 16x256", _lm(_hf("BertModel", "BertConfig"), "float32",
                                                 _ids(30522, 16, 256), "last_hidden_state"), "float32", tf32=True),
    Workload("OPT-1.3B widths (2 layers), fp16, 8x512", _lm(_hf("OPTForCausalLM", "OPTConfig", **_OPT), "float16",
                                                           _ids(50272, 8, 512)), "float16"),
    # attention written as matmuls (transformers' "eager" attention): q @ k^T and attn @ v as bmm over batch x
    # heads, 197 tokens (a length no bmm rule was tuned on, misaligned), head dim 64
    Workload("HF ViT-B/16 (eager attention), fp16, batch 32", _hf_vision("ViTModel", "ViTConfig", "float16", 32,
                                                                         attn_implementation="eager"), "float16"),
    # Whisper-base's encoder, eager attention: bmm over 8 x 8 heads of 1,500 tokens, head dim 64
    Workload("Whisper-base encoder (eager attention), fp16, batch 8",
             _whisper_encoder("float16", 8, d_model=512, encoder_layers=6, encoder_attention_heads=8,
                              encoder_ffn_dim=2048, decoder_layers=1, decoder_attention_heads=8,
                              attn_implementation="eager"), "float16"),
]
VARIANTS = ("default", "max-autotune", "perfmodel", "perfmodel-top1", "perfmodel-top3", "perfmodel-aten", "perfmodel-zero", "perfmodel-1x1mm", "hook",
            "hook-m0", "hook-top1", "hook-nosure", "hook-nocd", "perfmodel-nosure", "perfmodel-bmm3", "perfmodel-v2", "perfmodel-b1", "perfmodel-b2", "perfmodel-b3",
            "perfmodel-b4", "perfmodel-p0", "perfmodel-nosure-p0", "hook-p0", "hook-nosure-p0", "perfmodel-ieee")
BASELINES = ("default", "max-autotune")
TIMED_RUNS = 30
REL_TOL = 0.05   # relative Frobenius error against eager allowed for a fp16/bf16 model with random weights


# ------------------------------------------------------------------------------------------------- worker
def _base(variant: str) -> str:
    """A variant's name without its repeat tag ("default@2" is default run again in the same process)."""
    return variant.split("@", 1)[0]


def _policy(variant: str) -> Any:
    from perfmodel.serve.compile import Policy

    return {"perfmodel": Policy(),
            "perfmodel-top1": Policy(top_k=1),
            "perfmodel-top3": Policy(top_k=3),
            "perfmodel-aten": Policy(triton_gain=float("inf")),
            "perfmodel-zero": Policy(triton_gain=0.10, top_k=1, keep_aten=False),
            "perfmodel-1x1mm": Policy(conv_1x1_as_mm=True),
            "perfmodel-bmm3": Policy(bmm_top_k=3),
            "perfmodel-nosure": Policy(bmm_sure_gain=None),
            "perfmodel-v2": Policy(),
            "perfmodel-b1": Policy()}[_base(variant)]


def _compile(variant: str, module: Any, predictor: Any) -> tuple[Any, Any]:
    """(compiled module, the context its calls run in). The perfmodel variants are
    perfmodel.serve.compile.compile(), as users run it: its backend installs the set-up around every graph
    compile, the backward's included (the pad-decision clock then times Inductor's own pad benchmarks, for
    the ops the model leaves to it, and not the model's pad decisions: a few ms, counted in the rest)."""
    import contextlib

    import torch

    variant = _base(variant)
    if variant == "default":
        return torch.compile(module, mode="reduce-overhead"), contextlib.nullcontext()
    if variant == "max-autotune":
        return torch.compile(module, mode="max-autotune"), contextlib.nullcontext()
    if variant.startswith("hook"):
        from perfmodel.serve import inductor

        kw = {"hook": {}, "hook-m0": {"cublas_margin": 0.0}, "hook-top1": {"top_k": 1},
              "hook-nosure": {"bmm_sure_gain": None}, "hook-nocd": {}}[variant]
        ctx = inductor.installed(**{"top_k": 5, **kw}, predictor=predictor, pad=True)
        if variant == "hook-nocd":  # mode="max-autotune"'s options with coordinate-descent tuning off
            return torch.compile(module, options={**torch._inductor.list_mode_options("max-autotune"),
                                                  "coordinate_descent_tuning": False}), ctx
        return torch.compile(module, mode="max-autotune"), ctx
    from perfmodel.serve import compile as pc

    return pc.compile(module, predictor=predictor, policy=_policy(variant), pad=True), contextlib.nullcontext()


class _Feedback:
    """Inductor's benchmark timings of every autotuned op (select_algorithm.add_feedback_saver)."""

    def __init__(self) -> None:
        from torch._inductor import select_algorithm

        self.rows: list[dict[str, Any]] = []
        select_algorithm.add_feedback_saver(self)

    @staticmethod
    def _dims(xs: Any) -> list:
        out = []
        for x in xs:
            try:
                out.append(int(x))
            except (TypeError, ValueError):
                out.append(str(x))
        return out

    def __call__(self, timings: dict, name: str, input_nodes: list, choices: list, *rest: Any) -> None:
        try:
            inputs = [[self._dims(n.get_size()), self._dims(n.get_stride()), str(n.get_dtype())] for n in input_nodes]
            times = {}
            for c, t in timings.items():
                label = getattr(c, "description", "") or ""
                times[f"{getattr(c, 'name', type(c).__name__)} {label}"[:160]] = float(t)
            self.rows.append({"op": name, "inputs": inputs, "ms": times,
                              "winner": min(times, key=times.get) if times else None})
        except Exception as exc:  # noqa: BLE001 -- a record lost must not break the benchmark's compile
            self.rows.append({"op": name, "error": f"{type(exc).__name__}: {exc}"})


def _flat(out: Any) -> Any:
    return out[0] if isinstance(out, (tuple, list)) else out


def _rel_err(a: Any, b: Any) -> float:
    a, b = a.float(), b.float()
    den = b.norm().item()
    return float((a - b).norm().item() / den) if den > 0 else float((a - b).norm().item())


def _spin_cycles_per_ms() -> float:
    import torch

    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)
    s.record()
    torch.cuda._sleep(10_000_000)
    e.record()
    torch.cuda.synchronize()
    return 10_000_000 / s.elapsed_time(e)


PROFILE = os.environ.get("MODEL_BENCH_PROFILE") == "1"


def _reset() -> None:
    """Forget compiled graphs, CUDA-graph trees and dynamo's counters between variants."""
    import torch._dynamo

    torch._dynamo.reset()
    try:
        from torch._inductor.cudagraph_trees import reset_cudagraph_trees

        reset_cudagraph_trees()
    except ImportError:
        pass
    torch._dynamo.utils.counters.clear()


def _top_kernels(step: Callable, n: int = 25) -> list:
    """The GPU kernels of 3 steps by total time (torch.profiler), a diagnosis of where two variants differ."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        rows = [(e.key[:100], e.device_time_total / 3, e.count / 3) for e in prof.key_averages()
                if e.device_time_total > 0]
        rows.sort(key=lambda r: -r[1])
        return [{"kernel": k, "us_per_step": round(t, 1), "per_step": c} for k, t, c in rows[:n]]
    except Exception as exc:  # noqa: BLE001 -- a diagnosis only
        return [{"error": f"{type(exc).__name__}: {exc}"}]


def _run_variant(variant: str, wl: Workload, module: Any, inputs: tuple, fwd: Callable, ref: dict, predictor: Any,
                 flush: Any, cycles_per_ms: float, feedback: _Feedback) -> dict[str, Any]:
    import torch
    import torch._dynamo
    from torch._inductor import utils as ind_utils

    fresh = getattr(ind_utils, "fresh_cache", None) or getattr(ind_utils, "fresh_inductor_cache")
    _reset()
    row: dict[str, Any] = {"variant": variant, "run": os.environ.get("MODEL_BENCH_RUN", "?")}
    params = [p for p in module.parameters() if p.requires_grad] if wl.train else []
    grad_param = params[0] if params else None
    if variant.startswith("perfmodel"):
        from perfmodel.serve import compile as pc

        pc.reset()
    feedback.rows = []
    compiled, ctx = _compile(variant, module, predictor)
    with fresh(), ctx:

        def step() -> Any:
            torch.compiler.cudagraph_mark_step_begin()
            if wl.train:
                for p in params:
                    p.grad = None
                out = _flat(fwd(compiled, *inputs))
                loss = torch.nn.functional.cross_entropy(out.float().flatten(0, -2), inputs[0].flatten())
                loss.backward()
                return loss
            return _flat(fwd(compiled, *inputs))

        clock = CompileClock()
        with clock.pad_timing():  # times pad_mm benchmarks: stock's, and those the set-up leaves to Inductor
            clock.start()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            row["compile_s"] = time.perf_counter() - t0
            row.update(clock.stop())
            row["rest_s"] = row["compile_s"] - row["gemm_tuning_s"] - row["other_tuning_s"]
            for _ in range(4):  # CUDA-graph trees record on the second or third call
                step()
            torch.cuda.synchronize()
            # correctness against eager
            out = step()
            if wl.train:
                row["rel_err"] = abs(out.item() - ref["loss"]) / max(abs(ref["loss"]), 1e-12)
                row["grad_rel_err"] = _rel_err(grad_param.grad, ref["grad"])
                row["ok"] = row["rel_err"] < REL_TOL and row["grad_rel_err"] < REL_TOL
            else:
                row["rel_err"] = _rel_err(out.clone(), ref["out"])
                row["ok"] = row["rel_err"] < REL_TOL
            torch.cuda.synchronize()
            # host time of one step: the spin ahead of each timed step covers twice that
            t0 = time.perf_counter()
            step()
            host_ms = (time.perf_counter() - t0) * 1e3
            torch.cuda.synchronize()
            spin = int(max(1.0, min(2.0 * host_ms, 50.0)) * cycles_per_ms)
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(TIMED_RUNS)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(TIMED_RUNS)]
            for s, e in zip(starts, ends):
                flush.zero_()
                torch.cuda._sleep(spin)
                s.record()
                step()
                e.record()
            torch.cuda.synchronize()
        ms = [s.elapsed_time(e) for s, e in zip(starts, ends)]
        row.update(step_ms=statistics.median(ms), step_ms_min=min(ms), step_ms_max=max(ms), host_ms=host_ms)
        if PROFILE:
            row["kernels"] = _top_kernels(step)
    row["autotuned_ops"] = feedback.rows
    feedback.rows = []
    if variant.startswith("perfmodel"):
        from dataclasses import asdict

        from perfmodel.serve import compile as pc

        row["decisions"] = [asdict(d) for d in pc.decisions()]
        row["summary"] = pc.summary()
    counters = torch._dynamo.utils.counters
    row["graphs"] = int(counters["stats"].get("unique_graphs", 0))
    compiled = None  # frees the compiled model (its CUDA-graph pool) before the next variant
    _reset()
    if wl.train:
        for p in params:
            p.grad = None
    torch.cuda.empty_cache()
    return row


def _wait_for_compile_workers(timeout: float = 120.0) -> None:
    """Wait until Inductor's compile-worker pool is ready. Until it is, Inductor compiles Triton kernels in
    the main process, one by one (its async_compile.precompile timer): in the H100 results that timer shows
    up only in the first variant of a workload's process (1.9-5.9 s), so without this wait the first variant
    pays for the pool's start-up. Where this torch lacks the API, nothing is waited for."""
    from torch._inductor.async_compile import AsyncCompile

    if hasattr(AsyncCompile, "wait_pool_ready") and AsyncCompile.use_process_pool() is False:
        AsyncCompile.wait_pool_ready(timeout=timeout)


def _worker(name: str, variants: list[str], model: str | None, res_file: Path) -> None:
    import torch

    wl = next(w for w in WORKLOADS if w.name == name)
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = wl.tf32  # before any compile: Inductor and the hooks read it
    torch.manual_seed(0)
    module, inputs, fwd = wl.build(dev)
    result: dict[str, Any] = {"workload": name, "variants": {}}

    def save() -> None:
        res_file.write_text(json.dumps(result, indent=1))

    # eager reference
    if wl.train:
        out = _flat(fwd(module, *inputs))
        loss = torch.nn.functional.cross_entropy(out.float().flatten(0, -2), inputs[0].flatten())
        loss.backward()
        p0 = next(p for p in module.parameters() if p.requires_grad)
        ref = {"loss": loss.item(), "grad": p0.grad.detach().clone()}
        for p in module.parameters():
            p.grad = None
    else:
        with torch.no_grad():
            ref = {"out": _flat(fwd(module, *inputs)).detach().clone()}
    result["attn_implementation"] = str(getattr(getattr(module, "config", None), "_attn_implementation", None))
    # process-wide warm-up (compile workers, CUDA context, cuBLAS), untimed
    from torch._inductor import utils as ind_utils

    fresh = getattr(ind_utils, "fresh_cache", None) or getattr(ind_utils, "fresh_inductor_cache")
    with fresh():
        a = torch.randn(256, 256, device=dev, dtype=getattr(torch, wl.dtype))
        torch.compile(lambda x: (x @ x).relu() + 1)(a)
    _wait_for_compile_workers()
    torch._dynamo.reset()
    predictor = None
    if any(v.startswith(("perfmodel", "hook")) for v in variants):  # the hooks get --model's predictor too
        from perfmodel.serve.predictor import Predictor

        t0 = time.perf_counter()
        predictor = Predictor.load(model)
        result["predictor"] = {"source": str(Path(predictor.source).name), "backend": predictor.backend,
                               "device": predictor.device, "load_s": time.perf_counter() - t0}
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=dev)
    cycles_per_ms = _spin_cycles_per_ms()
    feedback = _Feedback()
    grad_ctx = torch.enable_grad if wl.train else torch.no_grad
    for v in variants:
        try:
            with grad_ctx():
                result["variants"][v] = _run_variant(v, wl, module, inputs, fwd, ref, predictor, flush,
                                                     cycles_per_ms, feedback)
        except Exception as exc:  # noqa: BLE001 -- one variant's failure must not lose the others
            result["variants"][v] = {"variant": v, "error": f"{type(exc).__name__}: {exc}",
                                     "traceback": traceback.format_exc()[-3000:]}
            _reset()
            torch.cuda.empty_cache()
        save()
    save()


# ------------------------------------------------------------------------------------------------- driver
def geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def _best(vs: dict[str, Any], base: str, key: str) -> float | None:
    """The lowest `key` among a workload's rows of variant `base`, its repeats ("default@2") included."""
    xs = [x[key] for v, x in vs.items() if _base(v) == base and key in x]
    return min(xs) if xs else None


def _tag(variant: str) -> str:
    """A variant's repeat tag ("s5" of "default@s5"; "" for none)."""
    return variant.partition("@")[2]


def _same_run_pairs(vs: dict[str, Any], ours: str, other: str) -> list[tuple[dict, dict]]:
    """(our row, the other's row) for every run that measured both in one process: rows of variant base `ours`
    and `other` (repeats such as "default@s5" included) with the same "run" label, the other's row with our
    row's repeat tag first (two processes given one MODEL_BENCH_RUN label are told apart by their tags)."""
    pairs = []
    for v, x in vs.items():
        if _base(v) != ours or "step_ms" not in x:
            continue
        same = [(w, y) for w, y in vs.items()
                if _base(w) == other and w != v and "step_ms" in y and y.get("run") == x.get("run")]
        same.sort(key=lambda wy: _tag(wy[0]) != _tag(v))  # stable: the same tag first, else the first seen
        if same:
            pairs.append((x, same[0][1]))
    return pairs


def _stock_vs_default(vs: dict[str, Any]) -> tuple[float, float] | None:
    """(default's step / stock's, stock's compile / default's), geomean over the runs that timed both; None
    where no run did."""
    stock = _same_run_pairs(vs, "max-autotune", "default")
    if not stock:
        return None
    return (geomean([d["step_ms"] / s["step_ms"] for s, d in stock]),
            geomean([s["compile_s"] / d["compile_s"] for s, d in stock]))


def ratios(results: dict[str, Any]) -> dict[str, dict[str, tuple[float, float]]]:
    """{our variant: {workload: (step ratio, compile ratio)}} from ratios measured side by side in one process:
    step = (default's step / ours, geomean over the runs that timed both) x (min(1, stock's step / default's)
    in the run that timed stock beside default mode) -- ours against the better of the two baselines, > 1:
    ours faster; compile = ours / default's, geomean over the same runs. Runs differ in which variant went
    first (the first pays more compile time): the geomean over runs in both orders is what is reported.
    Workloads without both pairs are left out."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for name, r in results.get("workloads", {}).items():
        vs = r.get("variants", {})
        stock = _stock_vs_default(vs)
        if stock is None:
            continue
        stock_vs_default = stock[0]  # > 1: stock faster
        for v in {_base(v) for v in vs if _base(v) not in BASELINES}:
            pairs = _same_run_pairs(vs, v, "default")
            if pairs:
                step = geomean([d["step_ms"] / x["step_ms"] for x, d in pairs]) / max(1.0, stock_vs_default)
                out.setdefault(v, {})[name] = (step, geomean([x["compile_s"] / d["compile_s"] for x, d in pairs]))
    return out


def ratios_any_run(results: dict[str, Any]) -> dict[str, dict[str, tuple[float, float]]]:
    """The same against absolute times of any run: the fastest default / max-autotune step of any run of the
    workload (other machines included) over ours, our compile over the fastest default-mode compile --
    the comparison least kind to us, across machines whose drift is the size of the gains."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for name, r in results.get("workloads", {}).items():
        vs = r.get("variants", {})
        base = [b for b in (_best(vs, v, "step_ms") for v in BASELINES) if b is not None]
        default_compile = _best(vs, "default", "compile_s")
        if len(base) < len(BASELINES) or not default_compile:
            continue
        for v in {_base(v) for v in vs if _base(v) not in BASELINES}:
            mine = [x for w, x in vs.items() if _base(w) == v and "step_ms" in x]
            if mine:
                out.setdefault(v, {})[name] = (min(base) / geomean([x["step_ms"] for x in mine]),
                                               geomean([x["compile_s"] for x in mine]) / default_compile)
    return out


def headline(results: dict[str, Any], variant: str = "perfmodel", any_run: bool = False
             ) -> tuple[float, float, float, float]:
    """(step ratio geomean, worst; compile ratio geomean, worst) of a variant over the workloads (ratios(), or
    ratios_any_run())."""
    return _summary((ratios_any_run if any_run else ratios)(results).get(variant, {}).values())


def _summary(rs: Any) -> tuple[float, float, float, float]:
    """(step ratio geomean, worst; compile ratio geomean, worst) of (step, compile) ratio pairs."""
    sp, cp = [a for a, _ in rs], [b for _, b in rs]
    return geomean(sp), min(sp), geomean(cp), max(cp)


def _tuned(name: str, row: dict[str, Any]) -> bool:
    """Whether a perfmodel rule was tuned on the workload: WORKLOADS says so today, a row may predate it."""
    wl = next((w for w in WORKLOADS if w.name == name), None)
    return wl.tuned if wl is not None else bool(row.get("tuned"))


def markdown(results: dict[str, Any]) -> str:
    """The results tables: ratios side by side (ratios()) per workload and variant, the figures against any run
    (ratios_any_run()), and every row with its run."""
    rows = results.get("workloads", {})
    rat, anyr = ratios(results), ratios_any_run(results)
    ours = [v for v in VARIANTS if v not in BASELINES and v in rat]
    lines = [f"Device: {results.get('device', '?')}; torch {results.get('torch', '?')}. Step = median GPU time "
             f"of {TIMED_RUNS} CUDA-graph replays, L2 flushed; compile = the first call's wall time. Ratios are "
             "measured side by side in one process: a variant against default mode of the same run (geomean "
             "over runs, both orders), times stock max-autotune against default mode of stock's run where stock "
             "is faster (> 1: ours faster than the better of the two). held out = no perfmodel rule was tuned "
             "on it.", ""]
    head = "| workload | stock vs default, same run: step / compile |"
    head += "".join(f" {v}: runs | {v}: step vs better baseline / compile vs default |" for v in ours)
    lines += [head, "|---|---|" + "---|---|" * len(ours)]
    for name, r in rows.items():
        vs = r.get("variants", {})
        stock = _stock_vs_default(vs)
        cells = [f"{stock[0]:.3f} / {stock[1]:.1f}x" if stock else "-"]
        for v in ours:
            cells.append(str(len(_same_run_pairs(vs, v, "default"))))
            sp_cp = rat.get(v, {}).get(name)
            cells.append(f"{sp_cp[0]:.3f} / {sp_cp[1]:.2f}x" if sp_cp else "-")
        tag = "" if _tuned(name, r) else " (held out)"
        lines.append(f"| {name}{tag} | " + " | ".join(cells) + " |")
    lines.append("")
    for v in ours:
        g, w, gc, wc = _summary(rat[v].values())
        lines.append(f"- {v}: step time vs the better of default and max-autotune, geomean {g:.3f} (worst {w:.3f}); "
                     f"compile vs default geomean {gc:.2f}x (worst {wc:.2f}x), over {len(rat[v])} workloads")
        if anyr.get(v):
            g, w, gc, wc = _summary(anyr[v].values())
            lines.append(f"  - against the fastest baseline of any run (other machines included): step {g:.3f} "
                         f"(worst {w:.3f}); compile {gc:.2f}x (worst {wc:.2f}x), over {len(anyr[v])} workloads")
    lines += ["", "| workload | variant | run | step, compile s | GEMM tuning s | other tuning s | rest s |",
              "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        for v, x in r.get("variants", {}).items():
            if "compile_s" in x:
                lines.append(f"| {name} | {v} | {x.get('run', '?')} | {x['step_ms']:.3f} ms, {x['compile_s']:.1f} | "
                             f"{x['gemm_tuning_s']:.1f} | {x['other_tuning_s']:.1f} | {x['rest_s']:.1f} |"
                             + ("" if x.get("ok") else " output off"))
    return "\n".join(lines)


_ATEN_NAMES = ("mm", "addmm", "bias_addmm")


def calls_report(results: dict[str, Any], stock: str = "max-autotune", ours: str = "perfmodel") -> str:
    """The model's cuBLAS-or-Triton call judged on Inductor's own in-graph benchmark: for every mm/addmm shape
    that stock max-autotune benchmarked (its feedback-saver timings), the best aten and the best Triton
    template time beside the model's predicted cuBLAS and best Triton times (from the decisions of `ours`'s
    runs, repeats such as "perfmodel@s5" included: the first run in name order that decided a shape)."""
    lines = ["| workload | op m x k x n dtype | Inductor: aten ms / best Triton ms | model: cuBLAS / Triton ms | "
             "call | time of the model's side / the faster |", "|---|---|---|---|---|---|"]
    agree, total, cost = 0, 0, []
    for name, r in results.get("workloads", {}).items():
        vs = r.get("variants", {})
        preds = {}
        for v in sorted(v for v in vs if _base(v) == ours):  # every run of `ours` ("perfmodel@s5" too)
            for d in vs[v].get("decisions", []):
                p = d["problem"]
                preds.setdefault((d["op"], p["m"], p["k"], p["n"]), d)
        seen = set()
        for o in vs.get(stock, {}).get("autotuned_ops", []):
            if o.get("op") not in RANKED_OPS_REPORT or "ms" not in o:
                continue
            a, b = o["inputs"][-2][0], o["inputs"][-1][0]
            key = (o["op"], a[0], a[1], b[1])
            if key in seen or key not in preds:
                continue
            seen.add(key)
            aten = min((t for k, t in o["ms"].items() if k.split(" ")[0] in _ATEN_NAMES), default=None)
            tri = min((t for k, t in o["ms"].items() if k.startswith("triton_mm")), default=None)
            d = preds[key]
            if aten is None or tri is None or d["cublas_ms"] is None or d["triton_ms"] is None:
                continue
            model_triton = d["triton_ms"] < d["cublas_ms"]
            right = model_triton == (tri < aten)
            agree += right
            total += 1
            cost.append((tri if model_triton else aten) / min(tri, aten))
            lines.append(f"| {name} | {o['op']} {key[1]}x{key[2]}x{key[3]} {o['inputs'][-1][2].replace('torch.', '')} | "
                         f"{aten:.4f} / {tri:.4f} | {d['cublas_ms']:.4f} / {d['triton_ms']:.4f} | "
                         f"{'Triton' if model_triton else 'cuBLAS'} ({'right' if right else 'wrong'}) | "
                         f"{cost[-1]:.3f} |")
    if total:
        lines += ["", f"The model's call agrees with Inductor's benchmark on {agree} of {total} GEMM shapes; its side "
                      f"runs {geomean(cost):.4f}x the faster one (geomean; worst {max(cost):.3f}x)."]
    return "\n".join(lines)


RANKED_OPS_REPORT = ("mm", "addmm")


def _merge(results: dict[str, Any], out: dict[str, Any], err: str | None) -> dict[str, Any]:
    """Merge one worker's result (a workload's variants) into results; the merged workload entry."""
    wl = next(w for w in WORKLOADS if w.name == out["workload"])
    prev = results["workloads"].get(wl.name, {})
    entry = {**prev, **{k: v for k, v in out.items() if k not in ("variants", "workload")},
             "variants": {**prev.get("variants", {}), **out.get("variants", {})},
             "tuned": wl.tuned, "dtype": wl.dtype, "train": wl.train, **({"tf32": True} if wl.tf32 else {})}
    if err:
        entry["error"] = err
        print(f"[model_bench]   {err[-600:]}", flush=True)
    results["workloads"][wl.name] = entry
    return entry


def select_workloads(spec: str) -> list[Workload]:
    """The WORKLOADS whose name starts with one of spec's prefixes, in WORKLOADS' order. Names hold commas
    ("Llama-3-8B widths (2 layers), bf16, decode 8x1"): a spec with a ";" in it is split on ";" only, else on
    ","."""
    sep = ";" if ";" in spec else ","
    keys = [k.strip() for k in spec.split(sep) if k.strip()]
    return [w for w in WORKLOADS if any(w.name.startswith(k) for k in keys)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default=None, help="comma-separated names or name prefixes (default: all); separate them with ';' "
                    "where a prefix holds a comma")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/model_bench_h100.json")
    ap.add_argument("--model", default=None, help="model folder for the perfmodel variants (default: shipped)")
    ap.add_argument("--time-limit", type=float, default=560.0, help="seconds; no workload starts past it")
    ap.add_argument("--min-left", type=float, default=None,
                    help="start a workload only with this many seconds left (default 200 with max-autotune, else 90)")
    ap.add_argument("--force", action="store_true", help="re-run (workload, variant) pairs already in --out")
    ap.add_argument("--render", action="store_true", help="CPU: rewrite --out's .md table from --out (after merging "
                    "results of runs on several GPUs into one file)")
    ap.add_argument("--report-calls", action="store_true",
                    help="CPU: print the model's cuBLAS-or-Triton calls against Inductor's own benchmark in --out")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--res", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if _base(v) not in VARIANTS]
    if bad:
        ap.error(f"--variants: unknown {bad}; choose from {', '.join(VARIANTS)}")
    if args.worker:
        _worker(args.worker, variants, args.model, args.res)
        return 0
    if args.report_calls:
        print(calls_report(json.loads(args.out.read_text())))
        return 0
    if args.render:
        _write_table(args.out, json.loads(args.out.read_text()))
        return 0
    wanted = select_workloads(args.workloads) if args.workloads else WORKLOADS
    if not wanted:
        ap.error(f"--workloads: none of {args.workloads!r} names a workload")
    import torch

    if not torch.cuda.is_available():
        print("model_bench.py needs a CUDA GPU", file=sys.stderr)
        return 2
    results = json.loads(args.out.read_text()) if args.out.is_file() else {"workloads": {}}
    results.update(device=torch.cuda.get_device_name(0), torch=torch.__version__)
    import triton

    results["triton"] = triton.__version__
    min_left = args.min_left if args.min_left is not None else (200.0 if "max-autotune" in variants else 90.0)
    # The worker writes its variants here as it goes: a run killed mid-workload (a device call's limit) leaves
    # them beside --out, and the next run merges them first.
    os.environ.setdefault("MODEL_BENCH_RUN", time.strftime("%Y-%m-%d %H:%M:%S"))  # labels this run's rows
    partial = args.out.with_suffix(".partial.json")
    if partial.is_file():
        _merge(results, json.loads(partial.read_text()), None)
        partial.unlink()
    t_start = time.perf_counter()
    for wl in wanted:
        prev = results["workloads"].get(wl.name, {})
        todo = [v for v in variants if args.force or "step_ms" not in prev.get("variants", {}).get(v, {})]
        if not todo:
            continue
        left = args.time_limit - (time.perf_counter() - t_start)
        if left < min_left:
            print(f"[model_bench] {left:.0f} s left: {wl.name} and later workloads are left for the next run")
            break
        args.out.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", wl.name, "--variants", ",".join(todo),
               "--res", str(partial)] + (["--model", args.model] if args.model else [])
        t0 = time.perf_counter()
        print(f"[model_bench] {wl.name}: {', '.join(todo)}", flush=True)
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=max(left, 30.0))
            err = None if r.returncode == 0 else f"worker exited {r.returncode}: {r.stderr[-3000:]}"
        except subprocess.TimeoutExpired:
            err = f"timed out after {left:.0f} s"
        out = json.loads(partial.read_text()) if partial.is_file() else {"workload": wl.name, "variants": {}}
        partial.unlink(missing_ok=True)
        entry = _merge(results, out, err)
        entry["process_s"] = time.perf_counter() - t0
        for v in todo:
            x = entry["variants"].get(v, {})
            print(f"[model_bench]   {v}: " + (f"step {x['step_ms']:.3f} ms, compile {x['compile_s']:.1f} s "
                                             f"(GEMM {x['gemm_tuning_s']:.1f}, other {x['other_tuning_s']:.1f}), "
                                             f"rel err {x['rel_err']:.2e}" if "step_ms" in x
                                             else x.get("error", "missing")[:300]), flush=True)
        args.out.write_text(json.dumps(results, separators=(",", ":")) + "\n")  # compact: the file is large
    _write_table(args.out, results)
    return 0


def _write_table(out: Path, results: dict[str, Any]) -> None:
    """The results' markdown table beside out (its .md), and on stdout."""
    text = markdown(results)
    out.with_suffix(".md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    if "--worker" not in sys.argv:
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
