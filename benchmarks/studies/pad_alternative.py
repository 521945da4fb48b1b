"""Pad decisions through the cuBLAS head on both shapes plus an analytic copy cost, vs the pad head (CPU).

The issue's alternative to a dedicated pad head: orig = the shipped cuBLAS head on the unpadded GEMM,
padded = the cuBLAS head on the padded (contiguous) GEMM + the pad copies and the output slice at 70 %
of the H100's DRAM bandwidth plus a few µs per launch (prepadded operands free). Prints the same
metrics as `perfmodel eval` on the validation (1) and test (2) pad splits.
    python -m benchmarks.studies.pad_alternative
"""

import numpy as np
import torch
from perfmodel import artifact, GemmProblem, PadProblem
from perfmodel.features import problems_tensor
from perfmodel.locations import default_data_dir, default_model_dir
from perfmodel.train.data import load_pad, split_problems, PadTable
from perfmodel.train import evaluate as ev
b = artifact.load(default_model_dir())
pads = load_pad(default_data_dir())
ps = split_problems(pads.modes, 0)
cols = ["m","k","n","dtype","transpose_left","transpose_right","prepadded_left","prepadded_right","allow_tf32"]
from perfmodel.data_gen.shards import iter_rows
rows = [r for r in iter_rows(default_data_dir(), 'pad') if r['status']=='ok']
assert len(rows) == len(pads.orig_ms)
pp = [PadProblem(**{c: r[c] for c in cols}) for r in rows]
go = [GemmProblem(m=p.m, n=p.n, k=p.k, dtype=p.dtype, allow_tf32=p.allow_tf32, transpose_left=p.transpose_left, transpose_right=p.transpose_right) for p in pp]
mp = [p.padded_dims() for p in pp]
gp = [GemmProblem(m=a, n=c, k=k_, dtype=p.dtype, allow_tf32=p.allow_tf32) for p,(a,k_,c) in zip(pp, mp)]  # padded operands are contiguous row-major
cenc = b.encoders['cublas']; head = b.heads['cublas'].eval()
with torch.no_grad():
    lo = head(cenc.encode(problems_tensor(go))).double().numpy()
    lp = head(cenc.encode(problems_tensor(gp))).double().numpy()
bpe = {"float16":2,"bfloat16":2,"float32":4}
copy = []
for p,(a,k_,c) in zip(pp, mp):
    e = bpe[p.dtype]; t = 0.0
    if not p.prepadded_left and (a, k_) != (p.m, p.k): t += 0.004 + (p.m*p.k + a*k_)*e/ (0.7*3.35e12) * 1e3
    if not p.prepadded_right and (k_, c) != (p.k, p.n): t += 0.004 + (p.k*p.n + k_*c)*e/(0.7*3.35e12)*1e3
    if (a, c) != (p.m, p.n): t += 0.003 + (p.m*p.n*2)*e/(0.7*3.35e12)*1e3  # slice copy of the output
    copy.append(t)
copy = np.array(copy)
pred = np.stack([lo, np.log(np.exp(lp) + copy)], 1)
def tab(m): return PadTable(pads.pads[m], pads.orig_ms[m], pads.padded_ms[m], pads.modes[m])
for s in (1, 2):
    m = ps == s
    print(s, {k: round(v, 4) for k, v in ev.pad_metrics(tab(m), pred[m]).items() if 'total' in k or 'acc' in k})
