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
  perfmodel-static, default-static
                   (the dynamic kind only) the set-up / default mode compiled statically at each size, one compile
                   per size: the reference for what a per-size decision could reach
  perfmodel-det    compile(model, deterministic=True): the model's call and top-1 config, no benchmark at all
  table            (the static kind) torch.compile(module, options=SETUP_OPTIONS) with the workload's table from
                   `perfmodel plan` (--tables DIR, <slug>.json: --plan-tables makes them on a CPU) as
                   config.lookup_table.table under torch's LookupTableChoices -- perfmodel NOT imported (the worker
                   loads the predictor at its first perfmodel / hook variant: list "table" before them); its row
                   counts the table's hits and misses and says whether perfmodel was imported
  perfmodel-sizes  (the dynamic kind) compile(model, dynamic=True, sizes=<the batch sizes>, specialize=True): one
                   compile of its own per listed batch size (serve/specialize.py)

What LLM servers compile (issue 46), two more kinds of workload (Workload.kind; names start "Dynamic" / "MoE"):

  dynamic          compiled ONCE with dynamic=True and called at every shape of Workload.sizes in order (decode at
                   1, 8, 32, 64, 128 sequences, then a 4 x 512 prefill): default (reduce-overhead, dynamic=True),
                   max-autotune (dynamic=True), perfmodel (compile(model, dynamic=True), plus sizes=<the M values>
                   where compile() takes that argument), and the static references above. Per size: the first
                   call's wall time (a recompile, or the new size's first run), the four calls after it (CUDA-graph
                   recording, "captures"), the step (CUDA-graph replays, one graph per size) and the output
                   against eager at that size. compile_s = the first call at every size, summed (first_compile_s +
                   further_first_calls_s); step_ms = the geomean over the sizes.
  moe              Mixtral and Qwen3-MoE widths with transformers' grouped_mm experts (torch._grouped_mm), run as
                   the static kind; grouped GEMMs that Inductor autotuned are counted (autotuned, grouped_gemm_*)
                   and their template tuning counts as GEMM tuning.

Their tables and the issue's criteria (serving_markdown(), dynamic_criteria(), moe_criteria()) are rendered after
the static kind's, which leaves them out of its ratios and headline.

Per variant: compile time = the first call's wall time, split into GEMM autotuning (Inductor's mm/addmm
template precompiling and autotuning timers, plus pad_mm's padding decision), other autotuning (bmm,
convolution and other templates' timers, coordinate-descent tuning and config benchmarking of pointwise and
reduction kernels) and the rest; step time = the median GPU time of 30 CUDA-graph replays (CUDA events, L2
flushed before each, a GPU spin ahead of each so that the host's launch work is not timed); the output
checked against eager (relative Frobenius error; a training step: the loss and one weight's gradient).
Inductor's own benchmark timings of every autotuned op are kept (select_algorithm's feedback saver), and
perfmodel's decisions for its variants.

    python -m benchmarks.model_bench [--workloads NAME,...] [--variants default,max-autotune,perfmodel]
        [--out benchmarks/results/model_bench_h100.json] [--time-limit 560] [--model models/h100]

Results merge into --out by (workload, variant): a run resumes where the last one stopped (--force re-runs).
Runs made in parallel (one GPU each, their own --out) merge with --merge A.json B.json --out ALL.json (CPU).
--list prints the workloads with their kind. The perfmodel and perfmodel-det rows keep the table the compile recorded
(lookup_table: perfmodel.serve.compile.lookup_table()).

Decisions as an artifact (issue 50; docs/integration.md), on a CPU:

    python -m benchmarks.model_bench --plan-tables benchmarks/results/plan_tables_h200 --device h200 \
        --workloads "GPT-2 124M;BERT-large;Llama-3-8B widths (2 layers), bf16, decode;Qwen2-7B widths"
    python -m benchmarks.model_bench --compare-tables RESULTS.json --tables benchmarks/results/plan_tables_h200
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

from benchmarks._shared.clock import GEMM_OPS, CompileClock


# ---------------------------------------------------------------------------------------------- workloads
@dataclass(frozen=True)
class Workload:
    name: str
    build: Callable[[Any], tuple[Any, tuple, Callable]]   # device -> (module, inputs, forward(module, *inputs))
    dtype: str
    train: bool = False
    tuned: bool = False      # a perfmodel rule was tuned on this workload (the five are "tuned")
    tf32: bool = False       # float32 matmuls on TF32 (torch.backends.cuda.matmul.allow_tf32) for every variant
    # The dynamic-batch kind: the input shapes a compile serves, called in this order after ONE compile (build's
    # inputs are those of sizes[0]); inputs_at(device, shape) -> the forward's inputs at a shape.
    sizes: tuple[tuple[int, ...], ...] = ()
    inputs_at: Callable | None = None
    moe: bool = False        # a mixture-of-experts model (its experts lowered to torch._grouped_mm)

    @property
    def kind(self) -> str:
        """"dynamic" (one compile timed at every size of `sizes`), "moe", or "static" (the rest)."""
        return "dynamic" if self.sizes else "moe" if self.moe else "static"


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
# Mixture-of-experts widths. experts_implementation="grouped_mm" selects transformers 5.x's grouped_mm experts
# forward (integrations/moe.py: tokens sorted by expert, one torch._grouped_mm per projection over the token x
# expert pairs, offsets from a histc; a requested "grouped_mm" raises where the model cannot dispatch it, an unset one
# falls back to eager silently). Under torch.compile transformers calls torch._grouped_mm for bfloat16 weights only
# (else its custom op transformers::grouped_mm_fallback, a loop over experts): these workloads are bf16. Mixtral-8x7B widths: 8 experts top-2, experts
# gate_up [8, 28672, 4096], down [8, 4096, 14336].
_MIXTRAL = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=2, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=32000, max_position_embeddings=8192, num_local_experts=8,
                num_experts_per_tok=2, use_cache=False, experts_implementation="grouped_mm")
# Qwen3-30B-A3B widths: 128 experts top-8 of moe_intermediate_size 768 (gate_up [128, 1536, 2048], down
# [128, 2048, 768]), head_dim 128; every layer sparse (decoder_sparse_step 1); plain causal attention.
_QWEN3_MOE = dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=2,
                  num_attention_heads=32, num_key_value_heads=4, head_dim=128, vocab_size=151936,
                  max_position_embeddings=8192, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                  sliding_window=None, use_cache=False, experts_implementation="grouped_mm")
_BERT_L = dict(hidden_size=1024, num_hidden_layers=4, num_attention_heads=16, intermediate_size=4096)
_OPT = dict(hidden_size=2048, ffn_dim=8192, num_hidden_layers=2, num_attention_heads=32, word_embed_proj_dim=2048,
            vocab_size=50272, max_position_embeddings=2048, use_cache=False)

# The batch shapes an LLM server's one compile serves: decode at 1-128 sequences (one token each), then a prefill of
# 4 x 512 tokens. Dynamo specialises a dimension of 1 (the first call's graph is static), recompiles with the
# batch symbolic at 8 x 1 and with both dimensions symbolic at 4 x 512.
SERVE_SIZES = ((1, 1), (8, 1), (32, 1), (64, 1), (128, 1), (4, 512))


def _dynamic_lm(name: str, cls_name: str, cfg_name: str, cfg: dict[str, Any], vocab: int, dtype: str,
                sizes: tuple[tuple[int, ...], ...] = SERVE_SIZES) -> Workload:
    """A causal LM of the dynamic-batch kind: logits of input_ids at every shape of `sizes`."""
    return Workload(name, _lm(_hf(cls_name, cfg_name, **cfg), dtype, _ids(vocab, *sizes[0])), dtype, sizes=sizes,
                    inputs_at=lambda dev, shape: (_ids(vocab, *shape)(dev),))


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
    # What LLM servers compile (issue 46). Names start "Dynamic" / "MoE" so that no earlier prefix ("Llama",
    # "Qwen2") selects them. Dynamic batch: one compile (dynamic=True) timed at every shape of SERVE_SIZES.
    _dynamic_lm("Dynamic Llama-3-8B widths (2 layers), bf16, decode 1-128 + prefill 4x512", "LlamaForCausalLM",
                "LlamaConfig", _LLAMA, 128256, "bfloat16"),
    _dynamic_lm("Dynamic Qwen2-7B widths (2 layers), bf16, decode 1-128 + prefill 4x512", "Qwen2ForCausalLM",
                "Qwen2Config", _QWEN2, 152064, "bfloat16"),
    # MoE: the experts as torch._grouped_mm (Inductor's triton_grouped_mm template against aten's _grouped_mm)
    Workload("MoE Mixtral widths (2 layers, 8 experts top-2), bf16, prefill 1x512",
             _lm(_hf("MixtralForCausalLM", "MixtralConfig", **_MIXTRAL), "bfloat16", _ids(32000, 1, 512)),
             "bfloat16", moe=True),
    Workload("MoE Mixtral widths (2 layers, 8 experts top-2), bf16, decode 8x1",
             _lm(_hf("MixtralForCausalLM", "MixtralConfig", **_MIXTRAL), "bfloat16", _ids(32000, 8, 1)),
             "bfloat16", moe=True),
    Workload("MoE Qwen3-30B-A3B widths (2 layers, 128 experts top-8), bf16, prefill 1x512",
             _lm(_hf("Qwen3MoeForCausalLM", "Qwen3MoeConfig", **_QWEN3_MOE), "bfloat16", _ids(151936, 1, 512)),
             "bfloat16", moe=True),
    Workload("MoE Qwen3-30B-A3B widths (2 layers, 128 experts top-8), bf16, decode 8x1",
             _lm(_hf("Qwen3MoeForCausalLM", "Qwen3MoeConfig", **_QWEN3_MOE), "bfloat16", _ids(151936, 8, 1)),
             "bfloat16", moe=True),
]
VARIANTS = ("default", "max-autotune", "perfmodel", "perfmodel-top1", "perfmodel-top3", "perfmodel-aten", "perfmodel-zero", "perfmodel-1x1mm", "hook",
            "hook-m0", "hook-top1", "hook-nosure", "hook-nocd", "perfmodel-nosure", "perfmodel-bmm3", "perfmodel-v2", "perfmodel-b1", "perfmodel-b2", "perfmodel-b3",
            "perfmodel-b4", "perfmodel-p0", "perfmodel-nosure-p0", "hook-p0", "hook-nosure-p0", "perfmodel-ieee",
            "perfmodel-static", "default-static", "perfmodel-det", "perfmodel-sizes", "table")
BASELINES = ("default", "max-autotune")
# The variants of the dynamic-batch kind: default, max-autotune and perfmodel compiled once with dynamic=True; the
# "-static" ones compiled statically at each size (one compile per size), the reference for per-size decisions.
DYNAMIC_VARIANTS = ("default", "max-autotune", "perfmodel", "perfmodel-static", "default-static", "perfmodel-sizes")
STATIC_REFERENCES = ("perfmodel-static", "default-static")
TIMED_RUNS = 30
# The set-up's Inductor options (perfmodel.serve.compile.OPTIONS), written out so that the "table" variant compiles
# with them without importing perfmodel (tests/test_model_bench.py checks that the two are equal).
SETUP_OPTIONS = {
    "triton.cudagraphs": True,
    "max_autotune": False,
    "max_autotune_pointwise": False,
    "coordinate_descent_tuning": False,
    "max_autotune_gemm": True,
    "max_autotune_gemm_backends": "ATEN,TRITON",
    "max_autotune_conv_backends": "ATEN",
}
TABLES = REPO / "benchmarks/results/plan_tables_h200"
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
            "perfmodel-b1": Policy(),
            "perfmodel-sizes": Policy()}[_base(variant)]


def slug(name: str) -> str:
    """A workload's name as a file name: lower case, runs of anything but letters and digits as one '-'."""
    import re

    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def load_table(tables: Path, name: str) -> dict[str, Any]:
    """The workload's lookup table, tables/<slug>.json. FileNotFoundError naming --tables and the file."""
    path = Path(tables) / f"{slug(name)}.json"
    if not path.is_file():
        raise FileNotFoundError(f"--tables: no table for {name!r} ({path}); make it on a CPU with "
                                f"python -m benchmarks.model_bench --plan-tables {tables} --workloads '{name}'")
    return json.loads(path.read_text())


def _table_context(table: dict[str, Any], counts: dict[str, Any]) -> Any:
    """For the block: table as Inductor's config.lookup_table.table and torch's LookupTableChoices (a subclass
    counting, per lookup, a hit, a miss of a key not in the table, or a skip: the key in the table but no entry
    for the call's templates -- say an addmm's subgraph-template call) as the choices handler; both restored
    after. No perfmodel import."""
    import contextlib

    from torch._inductor import config
    from torch._inductor.lookup_table import LookupTableChoices
    from torch._inductor.virtualized import V

    class CountingLookupTableChoices(LookupTableChoices):
        def lookup_template_configs(self, kernel_inputs: Any, op_name: str, *args: Any, **kwargs: Any) -> Any:
            found = super().lookup_template_configs(kernel_inputs, op_name, *args, **kwargs)
            key = self.make_lookup_key(kernel_inputs, op_name, include_device=True)
            what = "hits" if found else "skips" if key in table else "misses"
            counts[what] += 1
            if what == "misses" and len(counts["missed"]) < 50:
                counts["missed"].append(key)
            return found

    @contextlib.contextmanager
    def ctx() -> Any:
        prior_table, prior = config.lookup_table.table, V.choices
        config.lookup_table.table = table
        V.set_choices_handler(CountingLookupTableChoices())
        try:
            yield
        finally:
            V.set_choices_handler(prior)
            config.lookup_table.table = prior_table

    return ctx()


def _compile(variant: str, module: Any, predictor: Any, table: dict[str, Any] | None = None,
             counts: dict[str, Any] | None = None) -> tuple[Any, Any]:
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
    if variant == "table":  # the plan's table, perfmodel not imported
        return torch.compile(module, options=dict(SETUP_OPTIONS)), _table_context(table, counts)
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

    if variant == "perfmodel-det":  # the deterministic mode: no benchmark at all
        return pc.compile(module, predictor=predictor, pad=True, deterministic=True), contextlib.nullcontext()
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
                 flush: Any, cycles_per_ms: float, feedback: _Feedback, tables: Path = TABLES) -> dict[str, Any]:
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
    table, counts = None, None
    if _base(variant) == "table":
        table = load_table(tables, wl.name)
        counts = {"hits": 0, "misses": 0, "skips": 0, "missed": []}
        row["table"] = {"file": f"{slug(wl.name)}.json", "keys": len(table), "lookups": counts}
    compiled, ctx = _compile(variant, module, predictor, table, counts)
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
            grouped_split(row)
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
    row.update(autotune_counts(row["autotuned_ops"]))
    feedback.rows = []
    if variant.startswith("perfmodel"):
        from dataclasses import asdict

        from perfmodel.serve import compile as pc

        row["decisions"] = [asdict(d) for d in pc.decisions()]
        row["summary"] = pc.summary()
        if _base(variant) in ("perfmodel", "perfmodel-det"):  # compared with the CPU plan's (--compare-tables)
            row["lookup_table"] = pc.lookup_table()
    if _base(variant) == "table":  # after the compile: perfmodel must not have come in by any path
        row["perfmodel_imported"] = any(m in sys.modules for m in ("perfmodel", "serve"))
    counters = torch._dynamo.utils.counters
    row["graphs"] = int(counters["stats"].get("unique_graphs", 0))
    compiled = None  # frees the compiled model (its CUDA-graph pool) before the next variant
    _reset()
    if wl.train:
        for p in params:
            p.grad = None
    torch.cuda.empty_cache()
    return row


# Inductor's algorithm names for grouped GEMMs (kernel/mm_grouped.py: aten._grouped_mm lowers as "grouped_mm",
# aten._scaled_grouped_mm as "scaled_grouped_mm"); their template timers are "<name>_template_autotuning" and
# "<name>_template_precompiling".
GROUPED_OPS = ("grouped_mm", "scaled_grouped_mm")
_TEMPLATE_TIMERS = ("_template_precompiling", "_template_autotuning")


def grouped_split(row: dict[str, Any]) -> None:
    """Count grouped-GEMM template tuning as GEMM tuning: _shared/clock.py's split counts any op outside its
    GEMM_OPS (grouped_mm included) as other tuning; the grouped ops' template timers (row["timers"], the
    clock's per-timer seconds, rounded to ms) move from other_tuning_s to gemm_tuning_s and are kept as
    grouped_gemm_tuning_s."""
    g = sum(v for k, v in row.get("timers", {}).items()
            if k.endswith(_TEMPLATE_TIMERS) and k.rsplit("_template_", 1)[0] in GROUPED_OPS)
    row["grouped_gemm_tuning_s"] = g
    row["gemm_tuning_s"] += g
    row["other_tuning_s"] -= g


def _choice_side(label: str) -> str:
    """"triton" / "aten" / the choice's own name, from a feedback timing's label ("<choice name> <description>")."""
    name = label.split(" ")[0]
    if name.startswith("triton"):
        return "triton"
    if name.lstrip("_") in GROUPED_OPS or name.startswith(("aten", "at::")) or name in ("mm", "addmm", "bias_addmm",
                                                                                          "bmm", "baddbmm"):
        return "aten"
    return name


def autotune_counts(ops: list[dict[str, Any]]) -> dict[str, Any]:
    """How many ops Inductor autotuned (feedback-saver rows), split as the compile clock splits tuning time:
    "gemm" (clock.GEMM_OPS and the grouped GEMMs), of which "grouped_gemm", and "other" (bmm, convolution, ...);
    for the grouped GEMMs, how many choices were timed and which side won each."""
    counts = {"gemm": 0, "grouped_gemm": 0, "other": 0}
    choices, winners = 0, {}
    for o in ops:
        op = o.get("op", "")
        if op in GROUPED_OPS:
            counts["gemm"] += 1
            counts["grouped_gemm"] += 1
            choices += len(o.get("ms", {}))
            if o.get("winner"):
                side = _choice_side(o["winner"])
                winners[side] = winners.get(side, 0) + 1
        elif op in GEMM_OPS:
            counts["gemm"] += 1
        else:
            counts["other"] += 1
    return {"autotuned": counts, "grouped_gemm_choices": choices, "grouped_gemm_winners": winners}


def _label(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))


def _serving_compile(variant: str, module: Any, predictor: Any, dynamic: bool, tokens: list[int],
                     batches: tuple[tuple[int, ...], ...] = ()) -> tuple[Any, Any]:
    """(compiled module, the sizes= given to perfmodel's compile or None) for a variant of the dynamic kind:
    default mode / stock max-autotune / the set-up with dynamic=True, or (the "-static" variants) dynamic=False.
    The set-up gets the workload's M values (tokens a step: batch x sequence) as sizes= where its compile() takes
    that argument."""
    import inspect

    import torch

    base = _base(variant).replace("-static", "")
    if base == "default":
        return torch.compile(module, mode="reduce-overhead", dynamic=dynamic), None
    if base == "max-autotune":
        return torch.compile(module, mode="max-autotune", dynamic=dynamic), None
    from perfmodel.serve import compile as pc

    kw = {"sizes": list(tokens)} if dynamic and "sizes" in inspect.signature(pc.compile).parameters else {}
    if base == "perfmodel-sizes":  # compile sizes: the batch sizes (the inputs' leading dimension) specialised
        kw = {"sizes": sorted({s[0] for s in batches}), "specialize": True}
    return pc.compile(module, predictor=predictor, policy=_policy("perfmodel"), pad=True, dynamic=dynamic,
                      **kw), kw.get("sizes")


def _measure_size(step: Callable, ref_out: Any, flush: Any, cycles_per_ms: float) -> dict[str, Any]:
    """One size of a dynamic-kind variant: the first call's wall time (a compile or recompile where the size needs
    one, else the CUDA-graph tree's warm-up run) and its tuning split, four more calls (warm_s: the CUDA graph's
    recording), the output against eager, and the step timed as _run_variant times it (median of TIMED_RUNS
    CUDA-graph replays, L2 flushed, a GPU spin ahead of each)."""
    import torch

    row: dict[str, Any] = {}
    clock = CompileClock()
    with clock.pad_timing():
        clock.start()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        row["first_call_s"] = time.perf_counter() - t0
        row.update(clock.stop())
        grouped_split(row)
        row["rest_s"] = row["first_call_s"] - row["gemm_tuning_s"] - row["other_tuning_s"]
        t0 = time.perf_counter()
        for _ in range(4):  # CUDA-graph trees record on the second or third call at a size
            step()
        torch.cuda.synchronize()
        row["warm_s"] = time.perf_counter() - t0
        out = step()
        row["rel_err"] = _rel_err(out.clone(), ref_out)
        row["ok"] = row["rel_err"] < REL_TOL
        torch.cuda.synchronize()
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
    return row


def aggregate_sizes(row: dict[str, Any], per_size: dict[str, dict[str, Any]], n_sizes: int) -> None:
    """A dynamic-kind row's totals over its sizes (in call order): compile_s = the first call at every size
    summed (first_compile_s, the first size's, + further_first_calls_s: recompiles and new sizes' first runs;
    for a "-static" variant every size's own compile), capture_s = the four calls after each first (CUDA-graph
    recording), the tuning split summed, rel_err the worst, ok all; step_ms = the geomean over the sizes, set
    only once all n_sizes sizes are measured (the runner re-runs a variant without step_ms)."""
    row["sizes"] = per_size
    xs = list(per_size.values())
    if not xs:
        return
    row["first_compile_s"] = xs[0]["first_call_s"]
    row["further_first_calls_s"] = sum(x["first_call_s"] for x in xs[1:])
    row["compile_s"] = sum(x["first_call_s"] for x in xs)
    row["capture_s"] = sum(x["warm_s"] for x in xs)
    for k in ("gemm_tuning_s", "other_tuning_s", "grouped_gemm_tuning_s", "rest_s"):
        row[k] = sum(x[k] for x in xs)
    row["rel_err"] = max(x["rel_err"] for x in xs)
    row["ok"] = all(x["ok"] for x in xs)
    if len(xs) == n_sizes:
        row["step_ms"] = geomean([x["step_ms"] for x in xs])


def _run_dynamic_variant(variant: str, wl: Workload, module: Any, size_inputs: dict[str, tuple], fwd: Callable,
                         refs: dict[str, Any], predictor: Any, flush: Any, cycles_per_ms: float, feedback: _Feedback,
                         progress: Callable[[dict], None]) -> dict[str, Any]:
    """A variant of the dynamic kind: compiled once (dynamic=True) and called at every size in order, or (the
    "-static" variants) compiled anew at each size (dynamic=False, fresh caches, one compile per size). The row
    is handed to progress() after every size (a run killed mid-variant keeps the sizes measured)."""
    import torch
    from torch._inductor import utils as ind_utils

    fresh = getattr(ind_utils, "fresh_cache", None) or getattr(ind_utils, "fresh_inductor_cache")
    static = _base(variant) in STATIC_REFERENCES
    ours = _base(variant).startswith("perfmodel")
    tokens = [math.prod(shape) for shape in wl.sizes]
    row: dict[str, Any] = {"variant": variant, "run": os.environ.get("MODEL_BENCH_RUN", "?"), "dynamic": not static,
                           "order": [_label(s) for s in wl.sizes]}
    per_size: dict[str, dict[str, Any]] = {}
    ops: list[dict[str, Any]] = []

    def run_sizes(compiled: Any, shapes: list[tuple[int, ...]]) -> None:
        for shape in shapes:
            lab = _label(shape)
            inputs = size_inputs[lab]

            def step() -> Any:
                torch.compiler.cudagraph_mark_step_begin()
                return _flat(fwd(compiled, *inputs))

            per_size[lab] = _measure_size(step, refs[lab], flush, cycles_per_ms)
            for o in feedback.rows:
                o["size"] = lab
            ops.extend(feedback.rows)
            feedback.rows = []
            aggregate_sizes(row, per_size, len(wl.sizes))
            progress(row)

    feedback.rows = []
    if static:
        from dataclasses import asdict

        for shape in wl.sizes:
            _reset()
            if ours:
                from perfmodel.serve import compile as pc

                pc.reset()
            compiled, _ = _serving_compile(variant, module, predictor, False, tokens)
            with fresh():
                run_sizes(compiled, [shape])
            if ours:
                per_size[_label(shape)]["decisions"] = [asdict(d) for d in pc.decisions()]
                per_size[_label(shape)]["summary"] = pc.summary()
            per_size[_label(shape)]["graphs"] = int(torch._dynamo.utils.counters["stats"].get("unique_graphs", 0))
            compiled = None  # frees the CUDA-graph pool before the next size's compile
            _reset()
            torch.cuda.empty_cache()
    else:
        _reset()
        if ours:
            from perfmodel.serve import compile as pc

            pc.reset()
        compiled, sizes_arg = _serving_compile(variant, module, predictor, True, tokens, wl.sizes)
        row["sizes_arg"] = sizes_arg
        with fresh():
            run_sizes(compiled, list(wl.sizes))
        if ours:
            from dataclasses import asdict

            row["decisions"] = [asdict(d) for d in pc.decisions()]
            row["summary"] = pc.summary()
        row["graphs"] = int(torch._dynamo.utils.counters["stats"].get("unique_graphs", 0))
        compiled = None
        _reset()
        torch.cuda.empty_cache()
    row["autotuned_ops"] = ops
    row.update(autotune_counts(ops))
    aggregate_sizes(row, per_size, len(wl.sizes))
    return row


def _count_grouped_mm(run: Callable[[], Any]) -> tuple[Any, int | None]:
    """(run()'s result, how many aten grouped-GEMM calls it made): a check that a MoE workload's eager model takes
    transformers' grouped_mm path. None where the dispatch mode fails (then run() runs without it)."""
    try:
        from torch.utils._python_dispatch import TorchDispatchMode

        class Count(TorchDispatchMode):
            n = 0

            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                if "grouped_mm" in str(func):
                    Count.n += 1
                return func(*args, **(kwargs or {}))

        with Count():
            out = run()
        return out, Count.n
    except Exception:  # noqa: BLE001 -- a check only: the reference is then taken without it
        return run(), None


def _wait_for_compile_workers(timeout: float = 120.0) -> None:
    """Wait until Inductor's compile-worker pool is ready. Until it is, Inductor compiles Triton kernels in
    the main process, one by one (its async_compile.precompile timer): in the H100 results that timer shows
    up only in the first variant of a workload's process (1.9-5.9 s), so without this wait the first variant
    pays for the pool's start-up. Where this torch lacks the API, nothing is waited for."""
    from torch._inductor.async_compile import AsyncCompile

    if hasattr(AsyncCompile, "wait_pool_ready") and AsyncCompile.use_process_pool() is False:
        AsyncCompile.wait_pool_ready(timeout=timeout)


def _worker(name: str, variants: list[str], model: str | None, res_file: Path, tables: Path = TABLES) -> None:
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
    elif wl.kind == "moe":
        with torch.no_grad():
            out, n = _count_grouped_mm(lambda: _flat(fwd(module, *inputs)).detach().clone())
        ref = {"out": out}
        result["eager_grouped_mm_calls"] = n
    else:
        with torch.no_grad():
            ref = {"out": _flat(fwd(module, *inputs)).detach().clone()}
    size_inputs, refs = {}, {}
    if wl.kind == "dynamic":  # every size's inputs and eager output, before any compile
        with torch.no_grad():
            for shape in wl.sizes:
                size_inputs[_label(shape)] = wl.inputs_at(dev, shape)
                refs[_label(shape)] = _flat(fwd(module, *size_inputs[_label(shape)])).detach().clone()
    result["attn_implementation"] = str(getattr(getattr(module, "config", None), "_attn_implementation", None))
    result["experts_implementation"] = str(getattr(getattr(module, "config", None), "_experts_implementation", None))
    # process-wide warm-up (compile workers, CUDA context, cuBLAS), untimed
    from torch._inductor import utils as ind_utils

    fresh = getattr(ind_utils, "fresh_cache", None) or getattr(ind_utils, "fresh_inductor_cache")
    with fresh():
        a = torch.randn(256, 256, device=dev, dtype=getattr(torch, wl.dtype))
        torch.compile(lambda x: (x @ x).relu() + 1)(a)
    _wait_for_compile_workers()
    torch._dynamo.reset()
    predictor = None

    def load_predictor() -> Any:
        """--model's predictor (the hooks get it too), loaded at the first perfmodel / hook variant: perfmodel is
        not imported before it (the "table" variant runs without it)."""
        from perfmodel.serve.predictor import Predictor

        t0 = time.perf_counter()
        p = Predictor.load(model)
        result["predictor"] = {"source": str(Path(p.source).name), "backend": p.backend, "device": p.device,
                               "load_s": time.perf_counter() - t0}
        return p

    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=dev)
    cycles_per_ms = _spin_cycles_per_ms()
    feedback = _Feedback()
    grad_ctx = torch.enable_grad if wl.train else torch.no_grad
    for v in variants:
        try:
            if predictor is None and v.startswith(("perfmodel", "hook")):
                predictor = load_predictor()
            with grad_ctx():
                if wl.kind == "dynamic":
                    def progress(row: dict, v: str = v) -> None:
                        result["variants"][v] = row
                        save()

                    result["variants"][v] = _run_dynamic_variant(v, wl, module, size_inputs, fwd, refs, predictor,
                                                                 flush, cycles_per_ms, feedback, progress)
                else:
                    result["variants"][v] = _run_variant(v, wl, module, inputs, fwd, ref, predictor, flush,
                                                         cycles_per_ms, feedback, tables)
        except Exception as exc:  # noqa: BLE001 -- one variant's failure must not lose the others
            # a dynamic-kind variant keeps the sizes it measured (progress()), without step_ms: the runner re-runs it
            kept = {k: x for k, x in result["variants"].get(v, {}).items() if k != "step_ms"} \
                if wl.kind == "dynamic" else {}
            result["variants"][v] = {**kept, "variant": v, "error": f"{type(exc).__name__}: {exc}",
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
    Workloads without both pairs are left out, and so are the dynamic and MoE kinds (serving_markdown())."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for name, r in _static_rows(results).items():
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
    for name, r in _static_rows(results).items():
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


def workload_kind(name: str, row: dict[str, Any]) -> str:
    """A results entry's kind: WORKLOADS' where it names the workload, else the row's own ("static" for rows older
    than the kinds)."""
    wl = next((w for w in WORKLOADS if w.name == name), None)
    return wl.kind if wl is not None else row.get("kind", "static")


def _static_rows(results: dict[str, Any]) -> dict[str, Any]:
    return {n: r for n, r in results.get("workloads", {}).items() if workload_kind(n, r) == "static"}


def _partner(vs: dict[str, Any], ours: str, row: dict[str, Any], other: str) -> tuple[bool, dict[str, Any]] | None:
    """(same run?, the row of variant base `other` to set our row against): the row of our run (our repeat tag's
    first, as _same_run_pairs pairs them), else the first finished row of another run; None where none finished."""
    done = [(w, y) for w, y in vs.items() if _base(w) == other and w != ours and "step_ms" in y]
    same = [(w, y) for w, y in done if y.get("run") == row.get("run")]
    same.sort(key=lambda wy: _tag(wy[0]) != _tag(ours))
    if same:
        return True, same[0][1]
    return (False, done[0][1]) if done else None


# The criteria (issue 46, "Done when"): dynamic batch and MoE
DYN_EVERY_SIZE = 0.99       # the set-up's step >= 0.99 of default mode's dynamic step at every size
DYN_VS_STATIC = 0.99        # its geomean over the sizes >= the static set-up's per-size geomean minus 1 %
DYN_COMPILE = 1.25          # compile <= 1.25x default mode's dynamic compile
MOE_VS_STOCK = 0.98         # the set-up's step >= 0.98 of stock max-autotune's on each MoE workload
MOE_VS_DEFAULT = 1.10       # ... and >= 1.10x default mode's, geomean over the MoE workloads
MOE_COMPILE = 1.5           # ... at <= 1.5x default mode's compile time


def dynamic_criteria(results: dict[str, Any], ours: str = "perfmodel") -> dict[str, list[dict[str, Any]]]:
    """{dynamic workload: [one entry per finished row of `ours` (repeats included)]}, each with: vs_default
    {size: default mode's dynamic step / ours} and its worst (>= DYN_EVERY_SIZE wanted), default_same_run;
    vs_stock {size: stock max-autotune's dynamic step / ours}; dynamic_geomean_ms and static_geomean_ms (the
    geomeans over the sizes both measured of ours and of the static set-up's per-size steps) and vs_static =
    static / dynamic (>= DYN_VS_STATIC wanted); compile_vs_default = ours' compile_s (the first call at every
    size, summed) / default mode's (<= DYN_COMPILE wanted), with the first compile's and the further first
    calls' ratios beside; passed {criterion: bool} for those measured."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name, r in results.get("workloads", {}).items():
        if workload_kind(name, r) != "dynamic":
            continue
        vs = r.get("variants", {})
        for v, x in vs.items():
            if _base(v) != ours or "step_ms" not in x:
                continue
            sizes = x.get("sizes", {})
            c: dict[str, Any] = {"variant": v, "run": x.get("run"), "passed": {}}
            d = _partner(vs, v, x, "default")
            if d is not None:
                ds = d[1].get("sizes", {})
                c["vs_default"] = {k: ds[k]["step_ms"] / sizes[k]["step_ms"] for k in sizes if k in ds}
                c["worst_vs_default"] = min(c["vs_default"].values())
                c["default_same_run"] = d[0]
                c["compile_vs_default"] = x["compile_s"] / d[1]["compile_s"]
                c["first_compile_vs_default"] = x["first_compile_s"] / d[1]["first_compile_s"]
                c["compile_s"], c["default_compile_s"] = x["compile_s"], d[1]["compile_s"]
                c["passed"]["every size >= %.2f of default" % DYN_EVERY_SIZE] = c["worst_vs_default"] >= DYN_EVERY_SIZE
                c["passed"]["compile <= %.2fx default" % DYN_COMPILE] = c["compile_vs_default"] <= DYN_COMPILE
            m = _partner(vs, v, x, "max-autotune")
            if m is not None:
                ms = m[1].get("sizes", {})
                c["vs_stock"] = {k: ms[k]["step_ms"] / sizes[k]["step_ms"] for k in sizes if k in ms}
                c["stock_same_run"] = m[0]
            s = _partner(vs, v, x, "perfmodel-static")
            if s is not None:
                ss = s[1].get("sizes", {})
                common = [k for k in sizes if k in ss]
                c["dynamic_geomean_ms"] = geomean([sizes[k]["step_ms"] for k in common])
                c["static_geomean_ms"] = geomean([ss[k]["step_ms"] for k in common])
                c["vs_static"] = c["static_geomean_ms"] / c["dynamic_geomean_ms"]
                c["vs_static_sizes"] = {k: ss[k]["step_ms"] / sizes[k]["step_ms"] for k in common}
                c["static_same_run"] = s[0]
                c["passed"]["geomean >= static set-up's - 1%"] = c["vs_static"] >= DYN_VS_STATIC
            out.setdefault(name, []).append(c)
    return out


def moe_criteria(results: dict[str, Any], ours: str = "perfmodel") -> dict[str, Any]:
    """{"workloads": {MoE workload: {vs_stock, vs_default, compile_vs_default (geomeans over the finished rows of
    `ours`, each against its _partner()), same_run}}, and over the workloads: worst_vs_stock (>= MOE_VS_STOCK
    wanted), geomean_vs_default (>= MOE_VS_DEFAULT), compile geomean and worst (<= MOE_COMPILE), passed}."""
    per: dict[str, dict[str, Any]] = {}
    for name, r in results.get("workloads", {}).items():
        if workload_kind(name, r) != "moe":
            continue
        vs = r.get("variants", {})
        st, de, co, same = [], [], [], True
        for v, x in vs.items():
            if _base(v) != ours or "step_ms" not in x:
                continue
            d, m = _partner(vs, v, x, "default"), _partner(vs, v, x, "max-autotune")
            if d is None or m is None:
                continue
            de.append(d[1]["step_ms"] / x["step_ms"])
            st.append(m[1]["step_ms"] / x["step_ms"])
            co.append(x["compile_s"] / d[1]["compile_s"])
            same = same and d[0] and m[0]
        if de:
            per[name] = {"vs_stock": geomean(st), "vs_default": geomean(de), "compile_vs_default": geomean(co),
                         "rows": len(de), "same_run": same}
    out: dict[str, Any] = {"workloads": per}
    if per:
        xs = list(per.values())
        out.update(worst_vs_stock=min(x["vs_stock"] for x in xs),
                   geomean_vs_default=geomean([x["vs_default"] for x in xs]),
                   compile_geomean=geomean([x["compile_vs_default"] for x in xs]),
                   compile_worst=max(x["compile_vs_default"] for x in xs))
        out["passed"] = {"each >= %.2f of stock" % MOE_VS_STOCK: out["worst_vs_stock"] >= MOE_VS_STOCK,
                         "geomean >= %.2fx default" % MOE_VS_DEFAULT: out["geomean_vs_default"] >= MOE_VS_DEFAULT,
                         "compile <= %.1fx default (every workload)" % MOE_COMPILE: out["compile_worst"] <= MOE_COMPILE}
    return out


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def _variant_order(vs: dict[str, Any]) -> list[str]:
    """A workload's variants in DYNAMIC_VARIANTS' / VARIANTS' order, repeats after their base."""
    order = list(DYNAMIC_VARIANTS) + [v for v in VARIANTS if v not in DYNAMIC_VARIANTS]
    return sorted(vs, key=lambda v: (order.index(_base(v)) if _base(v) in order else len(order), v))


def serving_markdown(results: dict[str, Any]) -> str:
    """The dynamic-batch and MoE workloads (issue 46): per dynamic workload, every variant's step at every size
    and its compile parts, then dynamic_criteria(); the MoE rows with their grouped GEMMs autotuned, then
    moe_criteria(). "" where results hold neither kind."""
    wls = results.get("workloads", {})
    dyn = {n: r for n, r in wls.items() if workload_kind(n, r) == "dynamic"}
    moe = {n: r for n, r in wls.items() if workload_kind(n, r) == "moe"}
    if not dyn and not moe:
        return ""
    lines: list[str] = []
    if dyn:
        lines += ["### Dynamic batch: one compile, every size", "",
                  "default, max-autotune and perfmodel: compiled once with dynamic=True and called at every size in "
                  "the order listed; perfmodel-static / default-static: compiled statically at each size (one "
                  "compile per size). Step = median GPU time of "
                  f"{TIMED_RUNS} CUDA-graph replays at that size, L2 flushed (ms; \"off\": output off eager). "
                  "Compile = the first call at every size, summed (the first size's compile + recompiles and new "
                  "sizes' first runs); captures = the four calls after each first (CUDA-graph recording).", ""]
        crit: dict[str, list[dict[str, Any]]] = {}
        for ours in ("perfmodel", "perfmodel-sizes"):  # the range decision alone, and with compile sizes
            for name, cs in dynamic_criteria(results, ours).items():
                crit.setdefault(name, []).extend(cs)
        for name, r in dyn.items():
            vs = r.get("variants", {})
            cols = [v for v in _variant_order(vs) if vs[v].get("sizes")]
            order: list[str] = []
            for v in cols:
                order += [k for k in vs[v].get("order", vs[v]["sizes"]) if k not in order]
            lines += [f"**{name}**", "", "| size | " + " | ".join(f"{v} ({vs[v].get('run', '?')})" for v in cols)
                      + " |", "|---|" + "---|" * len(cols)]
            for k in order:
                cells = []
                for v in cols:
                    x = vs[v]["sizes"].get(k)
                    cells.append("-" if x is None else f"{x['step_ms']:.3f}" + ("" if x.get("ok") else " off"))
                lines.append(f"| {k} | " + " | ".join(cells) + " |")
            for label, key in (("compile: first size s", "first_compile_s"),
                               ("further sizes' first calls s", "further_first_calls_s"),
                               ("compile total s", "compile_s"), ("captures s", "capture_s"),
                               ("GEMM / other tuning s", None), ("graphs", "graphs")):
                cells = []
                for v in cols:
                    x = vs[v]
                    if key is None:
                        cells.append(f"{x.get('gemm_tuning_s', 0):.1f} / {x.get('other_tuning_s', 0):.1f}")
                    elif key == "graphs":  # dynamo's graphs: of the one compile, or of every size's own
                        n = sum(s.get("graphs", 0) for s in x["sizes"].values()) if _base(v) in STATIC_REFERENCES \
                            else x.get("graphs")
                        cells.append("-" if n is None else str(int(n)))
                    else:
                        cells.append(f"{x[key]:.1f}" if isinstance(x.get(key), (int, float)) else "-")
                lines.append(f"| {label} | " + " | ".join(cells) + " |")
            unfinished = [v for v in cols if "step_ms" not in vs[v]]
            if unfinished:
                lines.append(f"\nUnfinished (sizes missing): {', '.join(unfinished)}")
            lines.append("")
            for c in crit.get(name, []):
                parts = [f"- {c['variant']} ({c['run']}):"]
                if "vs_default" in c:
                    parts.append("step vs default dynamic " + ", ".join(f"{k} {x:.3f}" for k, x in c["vs_default"].items())
                                 + f"; worst {c['worst_vs_default']:.3f} (>= {DYN_EVERY_SIZE} wanted: "
                                 f"{_yes(c['worst_vs_default'] >= DYN_EVERY_SIZE)});")
                if "vs_static" in c:
                    parts.append(f"geomean {c['dynamic_geomean_ms']:.3f} ms against the static set-up's "
                                 f"{c['static_geomean_ms']:.3f}: {c['vs_static']:.3f} (>= {DYN_VS_STATIC} wanted: "
                                 f"{_yes(c['vs_static'] >= DYN_VS_STATIC)});")
                if "compile_vs_default" in c:
                    parts.append(f"compile {c['compile_s']:.1f} s, {c['compile_vs_default']:.2f}x default dynamic's "
                                 f"{c['default_compile_s']:.1f} s (<= {DYN_COMPILE} wanted: "
                                 f"{_yes(c['compile_vs_default'] <= DYN_COMPILE)});")
                if "vs_stock" in c:
                    parts.append("vs stock dynamic " + ", ".join(f"{k} {x:.3f}" for k, x in c["vs_stock"].items())
                                 + ";")
                others = [w for w, k in (("default", "default_same_run"), ("stock", "stock_same_run"),
                                         ("static", "static_same_run")) if k in c and not c[k]]
                if others:
                    parts.append(f"({', '.join(others)} of another run)")
                lines.append(" ".join(parts))
            lines.append("")
    if moe:
        lines += ["### MoE (experts as torch._grouped_mm)", "",
                  "Step = median GPU time of CUDA-graph replays, L2 flushed; compile = the first call; GEMM tuning "
                  "counts grouped-GEMM template tuning (in brackets); autotuned = ops Inductor benchmarked (GEMM "
                  "including grouped / other), grouped winners aten / Triton.", "",
                  "| workload | variant | run | step ms | compile s | GEMM tuning s (grouped) | other tuning s | "
                  "autotuned GEMM (grouped) / other | grouped choices timed | grouped winners | output |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, r in moe.items():
            vs = r.get("variants", {})
            for v in _variant_order(vs):
                x = vs[v]
                if "step_ms" not in x:
                    lines.append(f"| {name} | {v} | {x.get('run', '?')} | {x.get('error', 'unfinished')[:80]} "
                                 "| | | | | | | |")
                    continue
                a = x.get("autotuned", {})
                w = x.get("grouped_gemm_winners", {})
                lines.append(f"| {name} | {v} | {x.get('run', '?')} | {x['step_ms']:.3f} | {x['compile_s']:.1f} | "
                             f"{x['gemm_tuning_s']:.1f} ({x.get('grouped_gemm_tuning_s', 0):.1f}) | "
                             f"{x['other_tuning_s']:.1f} | {a.get('gemm', '-')} ({a.get('grouped_gemm', '-')}) / "
                             f"{a.get('other', '-')} | {x.get('grouped_gemm_choices', '-')} | "
                             f"{w.get('aten', 0)} / {w.get('triton', 0)} | "
                             + ("ok" if x.get("ok") else f"off ({x.get('rel_err', float('nan')):.3f})") + " |")
            calls = r.get("eager_grouped_mm_calls")
            if calls is not None:
                lines.append(f"| {name} | eager | | aten grouped-GEMM calls in eager: {calls} | | | | | | | |")
        mc = moe_criteria(results)
        lines.append("")
        for name, c in mc["workloads"].items():
            lines.append(f"- {name}: perfmodel's step {c['vs_stock']:.3f} of stock's (>= {MOE_VS_STOCK} wanted: "
                         f"{_yes(c['vs_stock'] >= MOE_VS_STOCK)}), {c['vs_default']:.3f}x default's; compile "
                         f"{c['compile_vs_default']:.2f}x default's ({c['rows']} rows"
                         + ("" if c["same_run"] else "; baselines of another run") + ")")
        if mc.get("passed"):
            lines.append(f"- over {len(mc['workloads'])} MoE workloads: worst vs stock {mc['worst_vs_stock']:.3f}; "
                         f"geomean vs default {mc['geomean_vs_default']:.3f}x; compile geomean "
                         f"{mc['compile_geomean']:.2f}x (worst {mc['compile_worst']:.2f}x); "
                         + "; ".join(f"{k}: {_yes(ok)}" for k, ok in mc["passed"].items()))
    return "\n".join(lines).rstrip() + "\n"


def _tuned(name: str, row: dict[str, Any]) -> bool:
    """Whether a perfmodel rule was tuned on the workload: WORKLOADS says so today, a row may predate it."""
    wl = next((w for w in WORKLOADS if w.name == name), None)
    return wl.tuned if wl is not None else bool(row.get("tuned"))


def markdown(results: dict[str, Any]) -> str:
    """The results tables: ratios side by side (ratios()) per workload and variant, the figures against any run
    (ratios_any_run()), and every row with its run; then the dynamic and MoE kinds' section (serving_markdown())."""
    rows = _static_rows(results)
    if not rows:
        return serving_markdown(results)
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
    serving = serving_markdown(results)
    return "\n".join(lines) + ("\n\n" + serving if serving else "")


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
             "tuned": wl.tuned, "dtype": wl.dtype, "train": wl.train, **({"tf32": True} if wl.tf32 else {}),
             **({"kind": wl.kind} if wl.kind != "static" else {})}
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


def variants_for(wl: Workload, variants: list[str]) -> list[str]:
    """The variants of `variants` that a workload's kind runs: the dynamic kind DYNAMIC_VARIANTS' (repeats
    included), any other kind all but the static references (which exist for the dynamic kind only); "table" the
    static kind only."""
    if wl.kind == "dynamic":
        return [v for v in variants if _base(v) in DYNAMIC_VARIANTS]
    return [v for v in variants if _base(v) not in STATIC_REFERENCES and (wl.kind == "static" or _base(v) != "table")]


def merge_files(results: dict[str, Any], others: list[dict[str, Any]]) -> dict[str, Any]:
    """results with the workloads of other results files merged in, variant by variant (a later file's row of
    a (workload, variant) replaces an earlier one): the files of runs made in parallel on several GPUs."""
    for o in others:
        for k in ("device", "torch", "triton"):
            if k in o and k not in results:
                results[k] = o[k]
        for name, r in o.get("workloads", {}).items():
            prev = results.setdefault("workloads", {}).get(name, {})
            results["workloads"][name] = {**prev, **{k: v for k, v in r.items() if k != "variants"},
                                          "variants": {**prev.get("variants", {}), **r.get("variants", {})}}
    return results


# ------------------------------------------------------------------------------------- decisions as an artifact
def _Forward(module: Any, fwd: Callable) -> Any:
    """module and the workload's forward (fwd(module, *inputs)) as one torch.nn.Module: the plan then traces it with
    the module's parameters as fake tensors on the GPU device (serve/plan_trace.py)."""
    import torch

    class Forward(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = module

        def forward(self, *a: Any) -> Any:
            return fwd(self.module, *a)

    return Forward()


def plan_tables(out_dir: Path, workloads: list[Workload], device: str = "h200", model: str | None = None
                ) -> dict[str, Any]:
    """CPU: each static workload's `perfmodel plan` (serve.plan.plan on its forward, built on the meta device --
    no weights allocated, no GPU) written as out_dir/<slug>.json (the lookup table the "table" variant compiles
    with) and <slug>.txt (plan.text()). template_hash=False: the Triton templates' source hash differs between
    torch versions (the plan is made with the CPU's torch, the compile runs on the GPU's), and an entry without
    one is accepted by torch's check. Limits (serve/plan_trace.py, docs/integration.md): the forward as built on the
    meta device, traced as a CUDA compile sees it (serve/plan_trace.py), with the installed torch. {workload: its table's key count}."""
    import torch

    from perfmodel.serve.plan import plan

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    done = {}
    for wl in workloads:
        if wl.kind != "static" or wl.train:
            raise ValueError(f"--plan-tables: {wl.name!r} is not a static inference workload")
        t0 = time.perf_counter()
        meta = torch.device("meta")
        with meta:
            module, inputs, fwd = wl.build(meta)
        p = plan(model=_Forward(module, fwd), inputs=inputs, device=device, model_dir=model, template_hash=False)
        p.model = f"models/{Path(p.model).name}" if p.model else p.model  # the folder, not this machine's path
        p.write(out_dir / f"{slug(wl.name)}.json")
        (out_dir / f"{slug(wl.name)}.txt").write_text(f"{wl.name}\n{p.text()}\n")
        done[wl.name] = len(p.table)
        print(f"[model_bench] {wl.name}: {len(p.rows)} GEMMs, {len(p.table)} keys "
              f"({time.perf_counter() - t0:.0f} s) -> {out_dir / slug(wl.name)}.json", flush=True)
    return done


def compare_tables(results: dict[str, Any], tables: Path, variant: str = "perfmodel-det") -> dict[str, Any]:
    """CPU: per workload with a table in `tables` and a `variant` row holding the table its GPU compile recorded
    (lookup_table), the two compared (serve.plan.compare_tables: keys in both, only in the plan's, only in the
    compile's, entries that differ ignoring template_hash), printed; {workload: the comparison}."""
    from perfmodel.serve.plan import compare_tables as compare

    out = {}
    for name, r in results.get("workloads", {}).items():
        path = Path(tables) / f"{slug(name)}.json"
        recorded = r.get("variants", {}).get(variant, {}).get("lookup_table")
        if not path.is_file() or recorded is None:
            continue
        c = compare(json.loads(path.read_text()), recorded)
        out[name] = {"both": c["both"], "only_plan": c["only_a"], "only_compile": c["only_b"], "differ": c["differ"],
                     "equal": c["equal"]}
        print(f"{name}: {'equal' if c['equal'] else 'differ'}; keys in both {c['both']}, only in the plan "
              f"{len(c['only_a'])}, only in the compile {len(c['only_b'])}, entries that differ {len(c['differ'])}")
        for what, keys in (("only in the plan", c["only_a"]), ("only in the compile", c["only_b"]),
                           ("differ", list(c["differ"]))):
            for k in keys:
                print(f"  {what}: {k}")
    if not out:
        print(f"no workload has both a table in {tables} and a {variant} row with lookup_table")
    return out


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
    ap.add_argument("--merge", type=Path, nargs="+", default=None, metavar="FILE",
                    help="CPU: merge these results files (runs made in parallel, one GPU each) into --out and render it")
    ap.add_argument("--list", action="store_true", help="print the workloads (name, kind, sizes) and exit")
    ap.add_argument("--report-calls", action="store_true",
                    help="CPU: print the model's cuBLAS-or-Triton calls against Inductor's own benchmark in --out")
    ap.add_argument("--tables", type=Path, default=TABLES,
                    help="the \"table\" variant's lookup tables, one <slug>.json per workload (default %(default)s)")
    ap.add_argument("--plan-tables", type=Path, default=None, metavar="DIR",
                    help="CPU: write each --workloads' plan (perfmodel plan of its forward) to DIR/<slug>.json and .txt")
    ap.add_argument("--device", default="h200", help="--plan-tables: the plan's device (serve.plan.DEVICES)")
    ap.add_argument("--compare-tables", type=Path, default=None, metavar="RESULTS",
                    help="CPU: compare each table in --tables with the one RESULTS' perfmodel-det row recorded")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--res", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if _base(v) not in VARIANTS]
    if bad:
        ap.error(f"--variants: unknown {bad}; choose from {', '.join(VARIANTS)}")
    if args.worker:
        _worker(args.worker, variants, args.model, args.res, args.tables)
        return 0
    if args.plan_tables:
        wanted = select_workloads(args.workloads) if args.workloads else []
        if not wanted:
            ap.error("--plan-tables: give --workloads (names or prefixes of static workloads)")
        plan_tables(args.plan_tables, wanted, args.device, args.model)
        return 0
    if args.compare_tables:
        if not args.compare_tables.is_file():
            ap.error(f"--compare-tables: no such file {args.compare_tables}")
        compare_tables(json.loads(args.compare_tables.read_text()), args.tables)
        return 0
    if args.list:
        for w in WORKLOADS:
            print(f"{w.kind:7s} {w.dtype:8s} {w.name}" + (f"  sizes {', '.join(map(_label, w.sizes))}" if w.sizes else ""))
        return 0
    if args.merge:
        missing = [str(f) for f in args.merge if not f.is_file()]
        if missing:
            ap.error(f"--merge: no such file {missing}")
        results = json.loads(args.out.read_text()) if args.out.is_file() else {"workloads": {}}
        merge_files(results, [json.loads(f.read_text()) for f in args.merge])
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, separators=(",", ":")) + "\n")
        _write_table(args.out, results)
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
        todo = [v for v in variants_for(wl, variants)
                if args.force or "step_ms" not in prev.get("variants", {}).get(v, {})]
        if not todo:
            continue
        left = args.time_limit - (time.perf_counter() - t_start)
        if left < min_left:
            print(f"[model_bench] {left:.0f} s left: {wl.name} and later workloads are left for the next run")
            break
        args.out.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", __spec__.name, "--worker", wl.name, "--variants", ",".join(todo),
               "--res", str(partial), "--tables", str(args.tables)] + (["--model", args.model] if args.model else [])
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
            for k, y in x.get("sizes", {}).items():  # the dynamic kind: every size
                print(f"[model_bench]     {k}: step {y['step_ms']:.3f} ms, first call {y['first_call_s']:.1f} s, "
                      f"captures {y['warm_s']:.1f} s, rel err {y['rel_err']:.2e}", flush=True)
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
