"""The ONNX export of a model folder: every head in one graph, with the ranking and predict graphs traced from
the same rules the torch path runs (perfmodel.ranking.screened_rank).

The folder format (perfmodel/artifact.py) names the file (onnx_file); this module writes it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from .artifact import onnx_file
from .bundle import MODE_HEADS, ModelBundle, predict_head
from .features import FeatureEncoder
from .model import PerfMLP
from .ranking import refines, screened_rank

RANK_INPUTS = ("rank_problems", "rank_configs", "rank_config_part", "rank_config_smem")
# Per problem, the screen's best `keep` configs (indices) and their log ms by the gemm head, fastest
# first, ties in config order (perfmodel.ranking.screened_rank); with a lead (lead_keep), the lead's
# best lead_keep of them.
RANK_OUTPUTS = ("rank_kept", "rank_log_ms")
# (P, C) log ms of every problem with every config by predict_head(); from RANK_INPUTS. A model.onnx
# written before it has none (the predictor then encodes in torch and runs the head's own graph).
PREDICT_OUTPUTS = ("predict_log_ms",)
# The same two for kernel="inductor" (a config network's inductor mode), in the graph of a model with a config
# network. A model.onnx written before them serves kernel="autotune" only.
RANK_STATIC_OUTPUTS = ("rank_static_kept", "rank_static_log_ms")
PREDICT_STATIC_OUTPUTS = ("predict_static_log_ms",)
# And for kernel="tutorial", in the graph of a model with a tutorial head.
RANK_TUTORIAL_OUTPUTS = ("rank_tutorial_kept", "rank_tutorial_log_ms")
PREDICT_TUTORIAL_OUTPUTS = ("predict_tutorial_log_ms",)
# Per kernel mode beside autotune, its ranking and predict outputs (in this order in the graph).
MODE_OUTPUTS = {"inductor": (RANK_STATIC_OUTPUTS, PREDICT_STATIC_OUTPUTS),
                "tutorial": (RANK_TUTORIAL_OUTPUTS, PREDICT_TUTORIAL_OUTPUTS)}


class _OnnxHeads(torch.nn.Module):
    """All heads in one graph: per head one input <head>_x and two outputs, <head>_log_ms and
    <head>_score (its output before the floors, which ranking sorts by: PerfMLP.score). Then, on
    `rank_problems` x `rank_configs` (RANK_INPUTS, the GEMM encoding inside the graph): with a screen
    head, the whole screened ranking (RANK_OUTPUTS), traced from perfmodel.ranking.screened_rank -- the
    screen on every config, the gemm head on its best `keep` per problem; and what predict serves
    (PREDICT_OUTPUTS): the log ms of every config by the student head (else the gemm head). With a config
    network (heads holding INDUCTOR_GEMM), the same two for kernel="inductor" (RANK_STATIC_OUTPUTS,
    PREDICT_STATIC_OUTPUTS) by its inductor mode in place of the gemm head (predict: that mode on every config). One onnxruntime call each, where the torch backend dispatches ~100 small ops."""

    def __init__(self, heads: dict[str, PerfMLP], encoder: FeatureEncoder, keep: int = 0, lead_keep: int = 0,
                 screen: str | None = None) -> None:
        super().__init__()
        self.names = list(heads)
        self.heads = torch.nn.ModuleList(heads[n].for_onnx() for n in self.names)
        self.encoder, self.keep, self.lead_keep = encoder, keep, lead_keep
        self.gemm = self.heads[self.names.index("gemm")]
        self.rank = screen in self.names  # screen: the head that screens (ModelBundle.screen_name)
        if self.rank:
            self.screen = self.heads[self.names.index(screen)]
        self.predict = self.heads[self.names.index(predict_head(self.names))]
        # the other kernel modes the model has (a config network's inductor mode, the inductor head, the tutorial
        # head): their graphs rank and predict with the mode's head in place of gemm (MODE_OUTPUTS' order)
        self.modes = [k for k in MODE_OUTPUTS if MODE_HEADS[k] in self.names]
        self.mode_heads = torch.nn.ModuleList(self.heads[self.names.index(MODE_HEADS[k])] for k in self.modes)

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = len(self.names)
        out = tuple(h(x) for h, x in zip(self.heads, xs[:n]))
        out = out + tuple(h.score(x) for h, x in zip(self.heads, xs[:n]))
        g = _Grid(self.encoder, *xs[n:])
        out = out + self._predicted(g)
        if not self.rank:
            return out
        # The ranking graph always has problems and more than 2 * keep configs (Predictor runs it only
        # then): a -1 in its shapes is safe, and saves the Shape/Gather/Concat nodes of explicit sizes.
        screen = g.score_all(self.screen, fused=True).reshape(-1, g.n_cfg)               # (P, C)
        out = out + self._ranking(g, screen, self.gemm)
        for head in self.mode_heads:
            out = out + self._ranking(g, screen, head)
        return out

    def _predicted(self, g: "_Grid") -> tuple[torch.Tensor, ...]:
        """predict's (P, C) log ms for autotune, and for each other kernel mode the model has (MODE_OUTPUTS)."""
        # predict: every row's log ms; its floors read one problem feature column (the log roofline)
        z = g.score_all(self.predict)
        if _first_linear(self.predict) is None:
            pred = self.predict.floor(z, g.x)
        else:
            pred = g.physical_floor(self.predict)(self.predict.overhead_floor(z.unsqueeze(-1)))
        # every size explicit: onnxruntime cannot infer a -1 in an empty tensor
        out = (pred.reshape(g.n_prob, g.n_cfg),)
        for head in self.mode_heads:  # the other kernel modes: the mode's head on every row
            out = out + (head.floor(head.score(g.x), g.x).reshape(g.n_prob, g.n_cfg),)
        return out

    def _ranking(self, g: "_Grid", screen: torch.Tensor, head: PerfMLP) -> tuple[torch.Tensor, torch.Tensor]:
        """screened_rank for a kernel mode: by the gemm head `head` (the gemm head, or a config network's
        inductor mode)."""
        scored: list[torch.Tensor] = []  # the features the lead scored, (P, keep, F)
        width = g.cmap.shape[1]

        def lead(cand: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            scored.append(g.rows(cand))
            xr = scored[-1].reshape(-1, width)
            return head.lead_score(xr)

        def gemm(cand: torch.Tensor | None, lead: tuple[torch.Tensor, torch.Tensor] | None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
            if lead is None:
                xr = g.rows(cand).reshape(-1, width) if cand is not None else g.x
                score = head.score(xr)
            else:  # the picked rows' features gathered from those the lead scored, not computed again
                out, pick = lead
                idx = pick.unsqueeze(-1) + torch.zeros(1, 1, width, dtype=pick.dtype)
                xr = torch.gather(scored[-1], 1, idx).reshape(-1, width)
                score = head.score_with_lead(xr, out.reshape(-1))
            return score, head.floor(score, xr)

        # traced with k = the longest ranking the rule gives in one pass: lead_keep when the lead refines
        k = self.lead_keep if refines(self.lead_keep, self.keep, self.lead_keep) else self.keep
        return screened_rank(gemm, g.n_prob, g.n_cfg, screen, self.keep, k, by_config=True,
                             lead=lead, lead_keep=self.lead_keep)


class _Grid:
    """Every problem with every config of the ranking inputs, encoded in the graph as the encoding's three
    parts: cross (P, C, 8), config part (1, C, F), problem part (P, 1, F); the features of a row are
    cross @ cross_map + config part + problem part (x: all of them, (P * C, F))."""

    def __init__(self, encoder: FeatureEncoder, problems: torch.Tensor, configs: torch.Tensor,
                 cfg_part: torch.Tensor, cfg_smem: torch.Tensor) -> None:
        self.n_prob, self.n_cfg = problems.shape[0], configs.shape[0]
        self.cross, self.cpart, self.ppart = _cross_parts_by_tile(encoder, problems, configs, cfg_part, cfg_smem)
        self.cmap = encoder.cross_map
        self.x = (self.cross @ self.cmap + self.cpart + self.ppart).reshape(self.n_prob * self.n_cfg,
                                                                          self.cmap.shape[1])  # (P * C, F)
        self._cpart2: torch.Tensor | None = None  # the config part (C, F), made where rows() first needs it

    def score_all(self, head: PerfMLP, fused: bool = False) -> torch.Tensor:
        """head.score on every (problem, config) row, (P * C,). A plain Linear/ReLU head's first Linear
        is taken through the sum: the 8 cross columns by (cross_map W^T), the config part once per
        config, the problem part once per problem -- no (P * C, F) features or product (the same
        result, to float rounding). fused (the ranking graph's screen, which has problems and configs;
        returned (P * C, 1), for the caller's one reshape):
        the config and problem parts summed first, then one Gemm of the cross columns onto that sum,
        which onnxruntime fuses with the ReLU after it (one node for the 3-D MatMul, two Adds, Reshape
        and Relu; ~5 % of a one-problem rank)."""
        first = _first_linear(head)
        if first is None:
            return head.score(self.x)
        w, cmap = first.weight.t(), self.cmap
        if fused:
            parts = (self.cpart @ w + (self.ppart @ w + first.bias)).reshape(-1, w.shape[1])  # (P * C, H)
            h = torch.addmm(parts, self.cross.reshape(-1, cmap.shape[0]), cmap @ w)
            return head.net[1:](h)                                                  # (P * C, 1)
        h = self.cross @ (cmap @ w) + self.cpart @ w + (self.ppart @ w + first.bias)
        return head.net[1:](h.reshape(self.n_prob * self.n_cfg, w.shape[1])).reshape(self.n_prob * self.n_cfg)

    def physical_floor(self, head: PerfMLP) -> Callable[[torch.Tensor], torch.Tensor]:
        """head.physical_floor on every row (its first output), from the encoding's parts: the log
        roofline is a problem column (cross and config parts are 0 there); no (P * C, F) features."""
        col = head.cfg.floor_features[0] if head.cfg.floor_features else -1
        if col < 0:
            return lambda v: v
        low = (self.cross @ self.cmap[:, col:col + 1] + self.cpart[..., col:col + 1] + self.ppart[..., col:col + 1])
        return lambda v: torch.maximum(v, low.reshape(self.n_prob * self.n_cfg))

    def rows(self, cand: torch.Tensor | None) -> torch.Tensor:
        """The kept rows' features: cand (P, n), each problem's kept configs (None: every row, x). Each
        problem's cross rows gathered in place (GatherElements; the index broadcast to the 8 cross columns by
        adding zeros), the config parts by index, the problem part by broadcasting: the same sums as the
        (P * C, F) features' rows."""
        if cand is None:
            return self.x
        if self._cpart2 is None:
            self._cpart2 = self.cpart.reshape(self.n_cfg, -1)
        idx = cand.unsqueeze(-1) + torch.zeros(1, 1, self.cmap.shape[0], dtype=cand.dtype)
        return torch.gather(self.cross, 1, idx) @ self.cmap + self._cpart2[cand] + self.ppart  # (P, n, F)


# Tile sizes and group_m below this make an exact float64 key of the four (BLOCK_M/N/K, GROUP_M): 9000**4 < 2**53.
_TILE_KEY_BASE = 9000.0


def _distinct_tiles(configs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(first, inverse) of a config set (C, 6) over its distinct (block_m, block_n, block_k, group_m): the
    index of one config of each distinct four (U,), and each config's position among them (C,), so that
    configs[first][inverse] has the configs' four columns. Every config its own group when the four are
    not small non-negative integers (no exact key). Reads only the configs: the graph's config stage."""
    four = configs[:, 0:4]
    base = four.max() + 1
    key = ((four[:, 0] * base + four[:, 1]) * base + four[:, 2]) * base + four[:, 3]
    n = configs.shape[0]
    exact = (base < _TILE_KEY_BASE) & (four >= 0).all() & (four == four.floor()).all()
    key = torch.where(exact, key, torch.arange(n, dtype=key.dtype))
    if torch.onnx.is_in_onnx_export():  # equal keys end up adjacent in any sort
        order = torch.topk(key, n, largest=False, sorted=True)[1]
    else:
        order = torch.sort(key, stable=True)[1]
    skey = key[order]
    new = torch.cat([torch.ones(1, dtype=torch.bool), skey[1:] != skey[:-1]])
    group = torch.cumsum(new.to(torch.int64), 0) - 1                                   # per sorted config
    inverse = torch.zeros_like(order).scatter(0, order, group)
    return order[new.nonzero().squeeze(1)], inverse


def _cross_parts_by_tile(encoder: FeatureEncoder, problems: torch.Tensor, configs: torch.Tensor,
                         cfg_part: torch.Tensor, cfg_smem: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """encoder.cross_parts(problems, configs, (cfg_part, cfg_smem)), bit for bit, for the ONNX graph: the
    cross columns that depend on a config only through its (block_m, block_n, block_k, group_m) -- tile
    counts, loads, waves, their logs -- computed once per distinct four (120 of 368 in serve_latency's
    sample) and gathered to the configs; the last, shared memory x dtype bytes, per config. The same
    elementwise float64 operations on the same values, then the same float32 cast."""
    first, inverse = _distinct_tiles(configs)
    cross, _, ppart = encoder.cross_parts(problems, configs[first], (cfg_part[first], cfg_smem[first]))
    db = problems[:, None, 3:4].to(torch.float64)                                       # (P, 1, 1)
    smem = (cfg_smem.unsqueeze(0) * db).to(torch.float32)                               # (P, C, 1)
    return torch.cat([cross[..., :-1].index_select(1, inverse), smem], -1), cfg_part.unsqueeze(0), ppart


def _first_linear(head: PerfMLP) -> torch.nn.Linear | None:
    """The first Linear of a served (folded) single head whose score is its net's output -- a plain
    Linear, ReLU, ... chain -- else None."""
    net = head.net
    if not getattr(head, "_norm_folded", False) or head.floors_each_member or head.cfg.n_outputs != 1 \
            or not isinstance(net, torch.nn.Sequential) or not isinstance(net[0], torch.nn.Linear):
        return None
    return net[0]


def export_onnx_all(bundle: ModelBundle, folder: Path) -> list[Path]:
    """Every device's ONNX file of a model folder (onnx_file): one for a model of one device."""
    return [export_onnx(bundle.for_device(d), Path(folder) / onnx_file(bundle, d)) for d in bundle.devices]


def export_onnx(bundle: ModelBundle, path: Path) -> Path:
    """A single-file ONNX graph (no external data) with inputs <head>_x and outputs <head>_log_ms and
    <head>_score; from RANK_INPUTS, predict's log ms (PREDICT_OUTPUTS) and, when the bundle has a screen
    head, the screened ranking (RANK_OUTPUTS) -- with a config network both again for kernel="inductor"
    (PREDICT_STATIC_OUTPUTS, RANK_STATIC_OUTPUTS) -- all for the bundle's device (its spec's constants are folded
    into the graph's encoder: export_onnx_all writes one file per device)."""
    keep = bundle.screen_keep
    enc = bundle.encoders["gemm"]
    mod = _OnnxHeads(bundle.heads, enc, keep, bundle.lead_keep, bundle.screen_name).eval()
    xs = tuple(torch.randn(4, len(bundle.encoders[n])) for n in mod.names)
    names_in = [f"{n}_x" for n in mod.names]
    names_out = [f"{n}_log_ms" for n in mod.names] + [f"{n}_score" for n in mod.names]
    # One batch dimension per head: a shared name would force every input to the same row count.
    axes = {**{f"{n}_x": {0: f"{n}_batch"} for n in mod.names}, **{f"{n}_log_ms": {0: f"{n}_batch"} for n in mod.names},
            **{f"{n}_score": {0: f"{n}_batch"} for n in mod.names}}
    # traced with 2 problems and 3 * keep configs, so that neither count is frozen at 1
    gen = torch.Generator().manual_seed(0)
    problems = torch.tensor([[4096.0, 4096, 4096, 2, 0, 0, 0, 0], [1000.0, 37, 129, 4, 0, 1, 1, 0]], dtype=torch.float64)
    configs = torch.tensor([16.0, 32, 64, 128, 256], dtype=torch.float64)[torch.randint(0, 5, (3 * keep, 3), generator=gen)]
    configs = torch.cat([configs, torch.tensor([[8.0, 3, 4]], dtype=torch.float64).expand(3 * keep, 3)], 1)
    xs = xs + (problems, configs, *enc.config_part(configs))
    names_in += list(RANK_INPUTS)
    names_out += list(PREDICT_OUTPUTS) + [n for k in mod.modes for n in MODE_OUTPUTS[k][1]]
    names_out += (list(RANK_OUTPUTS) + [n for k in mod.modes for n in MODE_OUTPUTS[k][0]]) if mod.rank else []
    axes.update({"rank_problems": {0: "rank_p"}, "rank_configs": {0: "rank_c"}, "rank_config_part": {0: "rank_c"},
                 "rank_config_smem": {0: "rank_c"}, "rank_kept": {0: "rank_p"}, "rank_log_ms": {0: "rank_p"},
                 "predict_log_ms": {0: "rank_p", 1: "rank_c"}, "rank_static_kept": {0: "rank_p"},
                 "rank_static_log_ms": {0: "rank_p"}, "predict_static_log_ms": {0: "rank_p", 1: "rank_c"},
                 "rank_tutorial_kept": {0: "rank_p"}, "rank_tutorial_log_ms": {0: "rank_p"},
                 "predict_tutorial_log_ms": {0: "rank_p", 1: "rank_c"}})
    axes = {name: a for name, a in axes.items() if name in names_in or name in names_out}
    torch.onnx.export(mod, xs, str(path), input_names=names_in, output_names=names_out,
                      dynamic_axes=axes, opset_version=17, dynamo=False)
    return Path(path)
