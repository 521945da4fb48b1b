"""An ensemble head's network run as its members (PerfMLP.ensemble, cfg.members > 1): GroupedNet, the batched
members the torch backend serves, and MemberNet, the separate chains the ONNX graph exports; the block-diagonal
weights they are cut from."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from .model import PerfMLP


class GroupedNet(nn.Module):
    """The network of a folded ensemble head (PerfMLP.ensemble, cfg.members = G > 1) run as its G members
    side by side: batched matmuls over (G, rows, width) in place of the block-diagonal hidden Linears,
    whose off-diagonal zeros make a product G times larger than the members need. Same output as the
    head's net (before the overhead floor), to float rounding; the ONNX graph and the torch backend run it."""

    def __init__(self, head: PerfMLP) -> None:
        super().__init__()
        g = head.cfg.members
        folded = head.folded()
        lins = [m for m in folded.net if isinstance(m, nn.Linear)]
        if g < 2 or len(lins) < 2 or any(type(m) not in (nn.Linear, nn.ReLU) for m in folded.net):
            raise ValueError("head: GroupedNet needs a folded ensemble of Linear/ReLU members (cfg.members > 1)")
        self.members = g
        with torch.no_grad():
            self.register_buffer("w_first", lins[0].weight.t().contiguous())          # (F, G H)
            self.register_buffer("b_first", lins[0].bias.clone())
            hidden_w, hidden_b = [], []
            for lin in lins[1:-1]:
                hidden_w.append(_member_blocks(lin.weight, g, "a hidden layer"))                # (G, in, out)
                hidden_b.append(lin.bias.reshape(g, 1, -1).clone())
            self.hidden_w, self.hidden_b = nn.ParameterList(hidden_w), nn.ParameterList(hidden_b)
            last = lins[-1]
            self.after_floor = head.floors_each_member
            if self.after_floor:  # block-diagonal too: each member's own outputs, member-major
                self.register_buffer("w_last", _member_blocks(last.weight, g, "the output layer"))
                self.register_buffer("b_last", last.bias.reshape(g, 1, -1).clone())
            else:                 # the members' mean
                self.register_buffer("w_last", last.weight.reshape(last.weight.shape[0], g, -1).permute(1, 2, 0).contiguous())
                self.register_buffer("b_last", last.bias.clone())
        self.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, n_inputs) -> the head's net output: (N, n_outputs), the members' mean before the floor,
        or for an after-floor ensemble (N, members * n_outputs), member-major."""
        h = torch.relu(x @ self.w_first + self.b_first)                                # (N, G H)
        # every size explicit: onnxruntime cannot infer a -1 in an empty (0-row) tensor
        h = h.reshape(h.shape[0], self.members, self.w_first.shape[1] // self.members).transpose(0, 1)  # (G, N, H)
        for w, b in zip(self.hidden_w, self.hidden_b):
            h = torch.relu(torch.baddbmm(b, h, w))
        if self.after_floor:
            z = torch.baddbmm(self.b_last, h, self.w_last)                               # (G, N, n_out)
            return z.transpose(0, 1).reshape(z.shape[1], self.members * self.w_last.shape[2])
        return torch.bmm(h, self.w_last).sum(0) + self.b_last

    def member_outputs(self, x: torch.Tensor, members: slice) -> torch.Tensor:
        """(N, n) the raw outputs of members[members] alone (an after-floor ensemble of one output):
        forward's columns for those members, computing no other member."""
        idx = range(self.members)[members]
        if not self.after_floor or self.w_last.shape[2] != 1 or idx.step != 1 or not len(idx):
            raise ValueError("members: needs a non-empty slice of an after-floor ensemble of one output")
        a, b, width = idx.start, idx.stop, self.w_first.shape[1] // self.members
        h = torch.relu(x @ self.w_first[:, a * width:b * width] + self.b_first[a * width:b * width])
        h = h.reshape(h.shape[0], b - a, width).transpose(0, 1)                                   # (n, N, H)
        for w, bias in zip(self.hidden_w, self.hidden_b):
            h = torch.relu(torch.baddbmm(bias[a:b], h, w[a:b]))
        z = torch.baddbmm(self.b_last[a:b], h, self.w_last[a:b])                                 # (n, N, 1)
        return z.transpose(0, 1).reshape(z.shape[1], b - a)


def diagonal_blocks(w: torch.Tensor, g: int) -> torch.Tensor | None:
    """w's g diagonal blocks, (g, rows / g, cols / g), where w is exactly their block-diagonal matrix (every
    other entry 0: an ensemble's hidden Linear); else None (g < 2 included)."""
    if g < 2 or w.dim() != 2 or w.shape[0] % g or w.shape[1] % g:
        return None
    r, c = w.shape[0] // g, w.shape[1] // g
    blocks = torch.stack([w[i * r:(i + 1) * r, i * c:(i + 1) * c] for i in range(g)])
    return blocks if torch.equal(torch.block_diag(*blocks), w) else None


def _member_blocks(weight: torch.Tensor, g: int, what: str) -> torch.Tensor:
    """The g diagonal blocks of a block-diagonal Linear weight (g out, g in), as (g, in, out) for
    batched products; ValueError if a weight lies off the diagonal blocks."""
    diag = diagonal_blocks(weight, g)                                                   # (G, out, in)
    if diag is None:
        raise ValueError(f"head: {what} is not block-diagonal over its members")
    return diag.transpose(1, 2).contiguous()


class MemberNet(nn.Module):
    """A GroupedNet's members as G separate chains of 2-D Linear+ReLU products (the same weights, the
    same output to float rounding): what the ONNX graph exports for an ensemble head (PerfMLP.for_onnx)."""

    def __init__(self, grouped: GroupedNet) -> None:
        super().__init__()
        g = self.members = grouped.members
        width = grouped.w_first.shape[1] // g
        self.after_floor = grouped.after_floor
        with torch.no_grad():
            for i in range(g):
                self.register_buffer(f"w0_{i}", grouped.w_first[:, i * width:(i + 1) * width].contiguous())
                self.register_buffer(f"b0_{i}", grouped.b_first[i * width:(i + 1) * width].contiguous())
                for j, (w, b) in enumerate(zip(grouped.hidden_w, grouped.hidden_b)):
                    self.register_buffer(f"w{j + 1}_{i}", w[i].contiguous())
                    self.register_buffer(f"b{j + 1}_{i}", b[i, 0].contiguous())
                self.register_buffer(f"wl_{i}", grouped.w_last[i].contiguous())
                if self.after_floor:
                    self.register_buffer(f"bl_{i}", grouped.b_last[i, 0].contiguous())
            if not self.after_floor:
                self.register_buffer("bl", grouped.b_last.clone())
        self.depth = len(grouped.hidden_w) + 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """As GroupedNet.forward: (N, n_outputs), or (N, members * n_outputs) member-major (after floor)."""
        if self.after_floor:
            return self.member_outputs(x, slice(None))
        outs = [self._hidden(x, i) @ getattr(self, f"wl_{i}") for i in range(self.members)]
        out = outs[0]
        for o in outs[1:]:
            out = out + o
        return out + self.bl

    def member_outputs(self, x: torch.Tensor, members: slice) -> torch.Tensor:
        """As GroupedNet.member_outputs: (N, n), only those members' chains run."""
        idx = range(self.members)[members]
        if not self.after_floor or not len(idx):
            raise ValueError("members: needs a non-empty slice of an after-floor ensemble")
        outs = [torch.addmm(getattr(self, f"bl_{i}"), self._hidden(x, i), getattr(self, f"wl_{i}")) for i in idx]
        return outs[0] if len(outs) == 1 else torch.cat(outs, 1)

    def _hidden(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """Member i's chain up to its output layer."""
        for j in range(self.depth):
            x = torch.relu(torch.addmm(getattr(self, f"b{j}_{i}"), x, getattr(self, f"w{j}_{i}")))
        return x
