"""The network: a plain nn.Module MLP whose output is logsumexp(f(x), log overhead).

It predicts log(runtime in ms). The overhead -- the least time any launch takes -- is a learned
parameter (PR 156851 fixed it at 0.00541 ms), so a prediction never falls below it. Standardisation
is inside the module (buffers), so the artifact and the ONNX graph carry it.
"""
from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, replace

import torch
from torch import nn

from .ensemble import GroupedNet, MemberNet, diagonal_blocks  # noqa: F401 -- re-exported


@dataclass(frozen=True)
class MLPConfig:
    n_inputs: int
    hidden: tuple[int, ...] = (256, 256, 256, 256)  # widths of the hidden layers
    norm: str = "batch"          # "batch" (foldable into Linear), "layer" or "none"
    dropout: float = 0.0
    learn_overhead: bool = True  # False reproduces PR 156851's fixed overhead
    init_overhead_ms: float = 0.00541  # PR 156851's constant: the lowest H100 Triton runtime it saw
    n_outputs: int = 1
    members: int = 1             # > 1: an average of this many heads (PerfMLP.ensemble), block-diagonal
    # how an ensemble averages: "before_floor" (one output layer, the mean of the members' outputs, then
    # the floor) or "after_floor" (each member's output floored by its own overhead, then the mean)
    average: str = "before_floor"
    # The physical floor (docs/design.md, "The model"): per output, the raw input column holding its
    # log roofline ms (FLOPs at the dtype's peak, compulsory bytes at DRAM bandwidth, max clock); the
    # output is max(prediction, that column). -1: no floor for that output; (): no floor at all.
    floor_features: tuple[int, ...] = ()

    def as_dict(self) -> dict:
        d = asdict(self)
        d["hidden"] = list(self.hidden)
        d["floor_features"] = list(self.floor_features)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "MLPConfig":
        d = dict(d)
        d["hidden"] = tuple(d["hidden"])
        if "floor_features" in d:
            d["floor_features"] = tuple(int(i) for i in d["floor_features"])
        return cls(**d)


def floor_features(names: list[str], n_outputs: int) -> tuple[int, ...]:
    """The physical floor's input columns of a head on features `names`: its log roofline ms for the
    first output, the padded problem's for a second (the pad head's padded time); -1 where absent."""
    wanted = ("log_roofline_ms", "log_padded_roofline_ms")[:n_outputs]
    return tuple(names.index(w) if w in names else -1 for w in wanted) + (-1,) * (n_outputs - len(wanted))


class PerfMLP(nn.Module):
    def __init__(self, cfg: MLPConfig) -> None:
        super().__init__()
        if cfg.norm not in ("batch", "layer", "none"):
            raise ValueError(f"norm: expected batch, layer or none, got {cfg.norm!r}")
        self.cfg = cfg
        self.register_buffer("x_mean", torch.zeros(cfg.n_inputs))
        self.register_buffer("x_std", torch.ones(cfg.n_inputs))
        layers: list[nn.Module] = []
        width = cfg.n_inputs
        for h in cfg.hidden:
            layers.append(nn.Linear(width, h))
            if cfg.norm == "batch":
                layers.append(nn.BatchNorm1d(h))
            elif cfg.norm == "layer":
                layers.append(nn.LayerNorm(h))
            layers.append(nn.ReLU())
            if cfg.dropout > 0:
                layers.append(nn.Dropout(cfg.dropout))
            width = h
        layers.append(nn.Linear(width, self.n_raw_outputs(cfg)))
        self.net = nn.Sequential(*layers)
        if cfg.average not in ("before_floor", "after_floor"):
            raise ValueError(f"average: expected before_floor or after_floor, got {cfg.average!r}")
        log_oh = torch.full((self.n_raw_outputs(cfg),), math.log(cfg.init_overhead_ms))
        if cfg.learn_overhead:
            self.log_overhead = nn.Parameter(log_oh)
        else:
            self.register_buffer("log_overhead", log_oh)

    def set_normalisation(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.x_mean.copy_(mean)
        # A constant feature (e.g. the SM count in a one-device dataset) gets std 1, not 0.
        self.x_std.copy_(torch.where(std > 1e-6, std, torch.ones_like(std)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, n_inputs) raw features -> (N,) log ms (or (N, n_outputs))."""
        return self.floor(self.score(x), x)

    def score(self, x: torch.Tensor) -> torch.Tensor:
        """(N, n_inputs) raw features -> the output before the floors, (N,) or (N, n_outputs): it orders
        a problem's rows as their log ms do (perfmodel/ranking.py). An after-floor ensemble has no output
        before its overhead floor that does: its score is the members' floored mean."""
        z = self.net(self._standardised(x))
        if self.floors_each_member:
            return self.overhead_floor(z)
        return z.squeeze(-1) if self.cfg.n_outputs == 1 else z

    def _standardised(self, x: torch.Tensor) -> torch.Tensor:
        # a folded copy carries its standardisation in its first Linear: no (x - 0) / 1 on every row
        return x if getattr(self, "_norm_folded", False) else (x - self.x_mean) / self.x_std

    @property
    def has_lead(self) -> bool:
        """An ensemble of one output whose members are floored before their mean: its first member
        orders rows on its own (the lead of perfmodel.ranking.screened_rank), and score_with_lead
        completes the ensemble's score from that member's outputs."""
        return self.floors_each_member and self.cfg.n_outputs == 1

    def _members_floored(self, x: torch.Tensor, members: slice) -> torch.Tensor:
        """(N, n) the overhead-floored outputs of members[members] (has_lead heads)."""
        if not self.has_lead:
            raise ValueError("lead: needs an ensemble head averaged after the floor, of one output")
        x = self._standardised(x)
        net = self.net
        z = net.member_outputs(x, members) if hasattr(net, "member_outputs") else net(x)[:, members]
        return _logaddexp(z, self.log_overhead[members])

    def lead_score(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(score, outputs) of the lead member on x, each (N,): its floored log ms (before the physical
        floor) orders the rows, and is what score_with_lead takes."""
        out = self._members_floored(x, slice(0, 1)).reshape(-1)
        return out, out

    def score_with_lead(self, x: torch.Tensor, lead: torch.Tensor) -> torch.Tensor:
        """score(x), with the lead member's outputs on x given (lead_score's): the other members run."""
        return (lead + self._members_floored(x, slice(1, None)).sum(-1)) / self.cfg.members

    def floor(self, score: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """score(x) -> log ms: the floors of the output layer (the overhead, then the physical floor)."""
        if not self.floors_each_member:
            score = self.overhead_floor(score.unsqueeze(-1) if self.cfg.n_outputs == 1 else score)
        return self.physical_floor(score, x)

    def physical_floor(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """max(out, the log roofline ms column of x) per output (cfg.floor_features): no prediction is
        faster than the device's physical limits. Exact (a maximum): outputs above it are unchanged."""
        idx = self.cfg.floor_features
        if not any(i >= 0 for i in idx):
            return out
        if self.cfg.n_outputs == 1:
            return torch.maximum(out, x[:, idx[0]])
        lows = [x[:, i] if i >= 0 else torch.full_like(x[:, 0], -math.inf) for i in idx]
        return torch.maximum(out, torch.stack(lows, -1))

    @staticmethod
    def n_raw_outputs(cfg: MLPConfig) -> int:
        """Width of the network's last layer: n_outputs, or one set per member when each member is
        floored before the average."""
        return cfg.n_outputs * (cfg.members if cfg.average == "after_floor" else 1)

    def overhead_floor(self, z: torch.Tensor) -> torch.Tensor:
        """The output layer: (N, n_raw_outputs) network outputs -> logsumexp(z, log overhead) (then the
        members' mean, for an after-floor ensemble), squeezed to (N,) when n_outputs is 1."""
        out = _logaddexp(z, self.log_overhead)
        if out.shape[-1] != self.cfg.n_outputs:  # after_floor: (N, members * n_outputs), member-major
            if self.cfg.n_outputs == 1:  # the members' mean: one ReduceMean in the ONNX graph
                return out.mean(-1)
            out = out.reshape(out.shape[0], self.cfg.members, self.cfg.n_outputs).mean(1)  # sizes explicit: 0 rows
        return out.squeeze(-1) if self.cfg.n_outputs == 1 else out

    @property
    def floors_each_member(self) -> bool:
        """An after-floor ensemble: its ranking score is the floored output (no pre-floor score
        orders its rows)."""
        return self.cfg.members > 1 and self.cfg.average == "after_floor"

    def folded(self) -> "PerfMLP":
        """An eval-mode copy with every BatchNorm folded into the Linear before it, and the input
        standardisation folded into the first Linear: plain Linear+ReLU layers for serving."""
        m = copy.deepcopy(self).eval()
        mods = list(m.net)
        out: list[nn.Module] = []
        i = 0
        while i < len(mods):
            mod = mods[i]
            if isinstance(mod, nn.Linear) and i + 1 < len(mods) and isinstance(mods[i + 1], nn.BatchNorm1d):
                bn = mods[i + 1]
                scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
                lin = nn.Linear(mod.in_features, mod.out_features)
                with torch.no_grad():
                    lin.weight.copy_(mod.weight * scale[:, None])
                    lin.bias.copy_((mod.bias - bn.running_mean) * scale + bn.bias)
                out.append(lin)
                i += 2
                continue
            if isinstance(mod, nn.Dropout):
                i += 1
                continue
            out.append(mod)
            i += 1
        first = out[0]
        with torch.no_grad():
            w = first.weight / m.x_std[None, :]
            first.bias.copy_(first.bias - (w * m.x_mean[None, :]).sum(1))
            first.weight.copy_(w)
            m.x_mean.zero_()
            m.x_std.fill_(1.0)
        m.net = nn.Sequential(*out)
        m._norm_folded = True  # score() skips the identity standardisation (not saved: a property of this copy)
        return m

    def with_input(self, column: int, value: float) -> "PerfMLP":
        """An eval-mode copy on one input fewer: input `column` held at `value` (raw, before the
        standardisation), folded into the first Linear's bias (folded(): plain Linear/ReLU layers, norm
        "none" where it was "batch"). A network with a kernel-mode input served for one mode
        (perfmodel/artifact.py): the same outputs as feeding the column `value`, to float rounding."""
        if not 0 <= column < self.cfg.n_inputs or self.cfg.n_inputs < 2:
            raise ValueError(f"column: expected 0 to {self.cfg.n_inputs - 1} of a head of {self.cfg.n_inputs} "
                             f"inputs, got {column}")
        if column in self.cfg.floor_features:
            raise ValueError(f"column: {column} is the physical floor's input, not a fixed one")
        m = self.folded()
        first = next(mod for mod in m.net if isinstance(mod, nn.Linear))
        keep = [i for i in range(self.cfg.n_inputs) if i != column]
        lin = nn.Linear(len(keep), first.out_features)
        with torch.no_grad():
            lin.weight.copy_(first.weight[:, keep])
            lin.bias.copy_(first.bias + first.weight[:, column] * float(value))
        mods = list(m.net)
        mods[mods.index(first)] = lin
        floors = tuple(i - (i > column) if i >= 0 else i for i in self.cfg.floor_features)
        norm = "none" if self.cfg.norm == "batch" else self.cfg.norm     # folded: BatchNorm in the Linears
        out = PerfMLP(replace(self.cfg, n_inputs=len(keep), norm=norm, dropout=0.0, floor_features=floors))
        out.net = nn.Sequential(*mods)
        with torch.no_grad():
            out.log_overhead.copy_(m.log_overhead)
        out._norm_folded = True
        return out.eval()

    def for_serving(self) -> "PerfMLP":
        """folded(), with an ensemble's net (cfg.members > 1) run as GroupedNet: the copy that the
        torch backend and the ONNX graph serve."""
        m = self.folded()
        if self.cfg.members > 1:
            m.net = GroupedNet(self)
        return m

    def prepare_serving(self) -> "PerfMLP":
        """On a for_serving() copy: keep its net as an addmm chain where it is a plain Linear/ReLU chain (served by
        serving_score: no per-layer activation allocation, ~1.5x faster than the module on a 36,800-row batch on
        the 2-core CPU, bit-identical output); self."""
        self.__dict__["_addmm_chain"] = _linear_relu_chain(self)
        return self

    def serving_score(self, x: torch.Tensor) -> torch.Tensor:
        """score(x), through the addmm chain prepare_serving() kept, where it kept one."""
        chain = self.__dict__.get("_addmm_chain")
        if chain is None:
            return self.score(x)
        z = x
        for i, (wt, b) in enumerate(chain):
            z = torch.addmm(b, z, wt)
            if i < len(chain) - 1:
                z.relu_()
        if self.floors_each_member:
            return self.overhead_floor(z)
        return z.squeeze(-1) if self.cfg.n_outputs == 1 else z

    def serving_score_log_ms(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(serving_score(x), its log ms: floor()) in one call."""
        z = self.serving_score(x)
        return z, self.floor(z, x)

    def for_onnx(self) -> "PerfMLP":
        """for_serving(), with an ensemble's net run as MemberNet (each member its own chain of 2-D
        products): the copy the ONNX graph exports. onnxruntime runs a chain of Gemm+Relu per member
        faster than GroupedNet's batched 3-D MatMuls (measured on the 2-core CPU, 3 x 256 wide: 24 rows
        215 -> 152 us, 2,400 rows 16.3 -> 15.0 ms)."""
        m = self.for_serving()
        if isinstance(m.net, GroupedNet):
            m.net = MemberNet(m.net)
        return m

    @staticmethod
    def ensemble(members: "list[PerfMLP]", average: str = "before_floor") -> "PerfMLP":
        """K trained heads of one shape as ONE plain MLP (norm "none", hidden widths K times wider):
        the members' folded first Linears stacked, their hidden Linears block-diagonal.
        average "before_floor": the last Linear the mean of theirs, log overhead the mean of theirs;
        the output is floor(mean_k z_k). "after_floor": the last Linear keeps each member's outputs
        and overhead; the output is mean_k floor_k(z_k), the mean of the members' log ms. The two
        differ near the overhead, where the floor (a soft maximum) bends, and below it, where a
        member's z is not fitted. Serves and exports as any head."""
        folded = [h.folded() for h in members]
        k = len(folded)
        lins = [[m for m in f.net if isinstance(m, nn.Linear)] for f in folded]
        if k < 1 or any(len(l) != len(lins[0]) for l in lins):
            raise ValueError("members: need one or more heads of the same depth")
        first = members[0].cfg
        hidden = tuple(sum(l[i].out_features for l in lins) for i in range(len(lins[0]) - 1))
        if any(h.cfg.members != 1 for h in members):
            raise ValueError("members: an ensemble of ensembles is not supported")
        after = average == "after_floor"
        out = PerfMLP(MLPConfig(first.n_inputs, hidden, "none", learn_overhead=first.learn_overhead,
                                init_overhead_ms=first.init_overhead_ms, n_outputs=first.n_outputs, members=k,
                                average=average, floor_features=first.floor_features))
        stack_linears([m for m in out.net if isinstance(m, nn.Linear)], lins, mean_last=not after)
        with torch.no_grad():
            overheads = torch.stack([h.log_overhead.detach() for h in members])
            out.log_overhead.copy_(overheads.reshape(-1) if after else overheads.mean(0))
        return out.eval()

    @property
    def overhead_ms(self) -> torch.Tensor:
        return self.log_overhead.detach().exp()


def stack_linears(big: list[nn.Linear], lins: list[list[nn.Linear]], mean_last: bool = False) -> None:
    """Fill big, one MLP's Linears, from K MLPs' Linears lins[k] of one depth: the first layers stacked (each reads
    every input), the hidden ones block-diagonal, the last block-diagonal too (each member's outputs kept) or, with
    mean_last, the mean of the members' (one set of outputs)."""
    k = len(lins)
    with torch.no_grad():
        for i, lin in enumerate(big):
            lin.weight.zero_()
            lin.bias.zero_()
            r = c = 0
            for member in lins:
                w, b = member[i].weight, member[i].bias
                if i == len(big) - 1 and mean_last:  # output: the mean of the members'
                    lin.weight[:, c:c + w.shape[1]] = w / k
                    lin.bias += b / k
                else:                                # first: stacked; hidden (and a kept output): block-diagonal
                    cols = slice(None) if i == 0 else slice(c, c + w.shape[1])
                    lin.weight[r:r + w.shape[0], cols] = w
                    lin.bias[r:r + w.shape[0]] = b
                r += w.shape[0]
                c += w.shape[1]


def _logaddexp(z: torch.Tensor, oh: torch.Tensor) -> torch.Tensor:
    """log(exp(z) + exp(oh)), oh (n_raw_outputs,) broadcast over the rows (no expanded copy in the ONNX
    graph): oh + softplus(z - oh), which the ONNX exporter writes as one Softplus node (aten::logaddexp
    has no symbolic). onnxruntime's Softplus is stable for large inputs; torch's returns its input
    above 20 (softplus(20) - 20 = 2e-9)."""
    return oh + nn.functional.softplus(z - oh)


def _linear_relu_chain(head: PerfMLP) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """[(W^T, b)] of a folded head made of Linear, ReLU, ..., Linear (standardisation folded away), else None."""
    if not isinstance(head.net, nn.Sequential):
        return None
    mods = list(head.net)
    if not (torch.all(head.x_mean == 0) and torch.all(head.x_std == 1)):
        return None
    if len(mods) % 2 != 1 or not all(isinstance(m, nn.Linear) for m in mods[::2]) \
            or not all(type(m) is nn.ReLU for m in mods[1::2]):
        return None
    return [(m.weight.detach().t().contiguous(), m.bias.detach().clone()) for m in mods[::2]]

