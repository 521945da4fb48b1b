"""The config network with a kernel-mode input (train/config_net.py), on synthetic rows (said so in each
test): its rows, its split and groups, and that the flag changes its ranking where the two modes' times
disagree. The measurement on data/h100 is in docs/model.md ("Merging gemm and static: measured")."""
from __future__ import annotations

import numpy as np
import pytest
import torch


def _tables(n_problems: int = 120, n_configs: int = 6, seed: int = 0):
    """synthetic: a table and its static table over the same problems (and one problem of its own), each
    row's features [problem size, c, noise], c a config column; autotune log ms = size + c, inductor
    log ms = size - c: the fastest config of one mode is the slowest of the other."""
    from perfmodel.train.data import GemmTable

    rng = np.random.default_rng(seed)
    size = rng.uniform(-1, 1, n_problems + 1)
    c = np.linspace(-0.5, 0.5, n_configs)
    configs = np.stack([np.arange(n_configs) * 16 + 16] + [np.full(n_configs, 32)] * 5, 1).astype(np.int64)

    def table(problems: np.ndarray, sign: float) -> tuple[GemmTable, torch.Tensor]:
        idx = np.repeat(np.arange(len(problems)), n_configs)
        cc = np.tile(c, len(problems))
        ms = np.exp(size[problems][idx] + sign * cc)
        t = GemmTable(np.zeros((len(problems), 8)), [f"p{i}" for i in problems], np.full(len(problems), "float16"),
                      idx, np.tile(configs, (len(problems), 1)), ms, np.full(len(problems), np.nan))
        x = np.stack([size[problems][idx], cc, rng.normal(0, 0.1, len(idx))], 1)
        return t, torch.from_numpy(x).float()

    gemm, xg = table(np.arange(n_problems), 1.0)
    static, xs = table(np.r_[np.arange(0, n_problems, 2), n_problems], -1.0)   # every other one, and one more
    return gemm, xg, static, xs


def test_with_mode_appends_the_flag_and_refuses_others():
    from perfmodel.train.config_net import AUTOTUNE, INDUCTOR, with_mode

    x = torch.randn(5, 3)
    assert torch.equal(with_mode(x, INDUCTOR)[:, :3], x)
    assert with_mode(x, INDUCTOR)[:, 3].tolist() == [1.0] * 5
    assert with_mode(x, AUTOTUNE)[:, 3].tolist() == [0.0] * 5
    with pytest.raises(ValueError, match="flag"):
        with_mode(x, 0.5)


def test_joint_rows_split_and_groups():
    # synthetic tables (_tables): static rows take their problem's split and a group of their own
    from perfmodel.train.config_net import joint_rows

    gemm, xg, static, xs = _tables(n_problems=10, n_configs=3)
    split = np.arange(10) % 3
    r = joint_rows(gemm, static, split, xg, xs)
    n, ns = len(gemm.ms), len(static.ms)
    assert r.x.shape == (n + ns, 4) and r.y.shape == (n + ns,)
    assert (r.x[:n, 3] == 0).all() and (r.x[n:, 3] == 1).all()
    assert np.allclose(r.y.numpy(), np.log(np.r_[gemm.ms, static.ms]), rtol=1e-6)   # float32 log ms
    # static problem j is problem 2j of the table for j < 5; the last one is in no table
    s_prob = static.problem_idx
    expect = np.where(s_prob < 5, split[np.minimum(2 * s_prob, 9)], -1)
    assert r.split[n:].tolist() == expect.tolist()
    assert r.split[:n].tolist() == split[gemm.problem_idx].tolist()
    assert set(r.groups[:n]) == set(range(10))
    assert set(r.groups[n:]) == {10 + 2 * j for j in range(5)} | {-1}
    with pytest.raises(ValueError, match="split"):
        joint_rows(gemm, static, split[:-1], xg, xs)
    with pytest.raises(ValueError, match="x_table"):
        joint_rows(gemm, static, split, xg[:-1], xs)


def test_the_flag_changes_the_ranking():
    # synthetic tables (_tables): the two modes order each problem's configs in reverse; the network,
    # trained on both, must pick each mode's fastest config on held-out problems through the flag alone
    from perfmodel.train.config_net import fit_config_net, joint_rows, with_mode
    from perfmodel.train.pipeline import TrainSettings

    gemm, xg, static, xs = _tables()
    every5 = np.arange(len(gemm.problems)) % 5
    split = np.where(every5 == 0, 2, np.where(every5 == 1, 1, 0))
    rows = joint_rows(gemm, static, split, xg, xs)
    torch.set_num_threads(1)
    s = TrainSettings(data=("unused",), hidden=(32, 32), epochs=30, lr=5e-3, problems_per_batch=8, progress=False,
                      baselines=False)
    net = fit_config_net(rows, ["size", "c", "noise"], s, s.epochs)
    test = np.flatnonzero(split == 2)
    right = {0.0: 0, 1.0: 0}
    with torch.inference_mode():
        for p in test:
            rows_p = torch.from_numpy(np.flatnonzero(gemm.problem_idx == p))
            for flag, fastest in ((0.0, 0), (1.0, -1)):   # autotune: lowest c; inductor: highest c
                pick = int(net.score(with_mode(xg[rows_p], flag)).argmin())
                right[flag] += pick == np.arange(len(rows_p))[fastest]
    # one held-out problem per mode may flip (the configs' times differ by 0.2 in log ms, the noise
    # column is 0.1): a network that ignored the flag would get at most half of them in one mode
    assert right[0.0] >= len(test) - 1 and right[1.0] >= len(test) - 1, (right, len(test))
