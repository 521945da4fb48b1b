"""The config network with a kernel-mode input (train/config_net.py), on synthetic rows (said so in each
test): its rows, its split and groups, and that the flag changes its ranking where the two modes' times
disagree; and a model folder serving it (perfmodel/artifact.py config_heads), with RANDOM weights
(tests/_synthetic.py): stored once, loaded as its two modes, served alike by both backends. The measurement on
data/h100 is in docs/model.md ("The config network")."""
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


@pytest.mark.parametrize("members", [1, 3])
def test_a_mode_held_fixed_is_the_network_fed_that_mode(members):
    # synthetic random weights: PerfMLP.with_input folds the mode column into the first Linear's bias; its
    # outputs are the network's on rows with the column appended, to float32 rounding (~1e-6 in log ms)
    from perfmodel.model import MLPConfig, PerfMLP

    torch.manual_seed(0)
    heads = []
    for _ in range(members):
        h = PerfMLP(MLPConfig(6, (32, 32), "batch", floor_features=(2,)))
        h.set_normalisation(torch.randn(6), torch.rand(6) + 0.5)
        with torch.no_grad():
            for m in h.net:
                if isinstance(m, torch.nn.BatchNorm1d):
                    m.running_mean.normal_()
                    m.running_var.uniform_(0.5, 2.0)
        heads.append(h.eval())
    net = heads[0] if members == 1 else PerfMLP.ensemble(heads, "after_floor")
    x = torch.randn(200, 5)
    for flag in (0.0, 1.0):
        fixed = net.with_input(5, flag)
        assert fixed.cfg.n_inputs == 5 and fixed.cfg.floor_features == (2,)
        with torch.inference_mode():
            want = net(torch.cat([x, torch.full((200, 1), flag)], 1))
            assert (fixed(x) - want).abs().max() < 1e-4
            assert (fixed.for_serving()(x) - want).abs().max() < 1e-4
    with pytest.raises(ValueError, match="column"):
        net.with_input(2, 0.0)                      # the physical floor's column is not a mode


@pytest.fixture(scope="module")
def config_folder(tmp_path_factory):
    """synthetic random weights: a model folder whose gemm head is a 3-member config network, a random screen."""
    from tests._synthetic import write_synthetic_model

    folder = tmp_path_factory.mktemp("config_net") / "m"
    write_synthetic_model(folder, hidden=(32, 32), members=3, config_net=True, screen="random", screen_keep=8,
                          lead_keep=4)
    return folder


def test_the_folder_stores_the_network_once(config_folder):
    import json

    from perfmodel.artifact import INDUCTOR_GEMM, load

    meta = json.loads((config_folder / "metadata.json").read_text())
    assert "gemm_inductor" not in meta["heads"] and "static" not in meta["heads"]
    assert meta["kernel_mode_input"] == {"autotune": 0.0, "inductor": 1.0}
    assert meta["heads"]["gemm"]["features"][-1] == "kernel_mode"
    b = load(config_folder)
    assert set(b.heads) >= {"gemm", INDUCTOR_GEMM} and b.config_net.cfg.n_inputs == len(b.encoders["gemm"]) + 1
    assert b.heads["gemm"].cfg.n_inputs == b.heads[INDUCTOR_GEMM].cfg.n_inputs == len(b.encoders["gemm"])


def test_both_backends_serve_both_modes(config_folder):
    # synthetic random weights: the onnx graphs rank and predict each mode as the torch path does; the inductor
    # mode's predict is the network's inductor mode on every config (the student is autotune's)
    from perfmodel import GemmProblem, Predictor
    from perfmodel.artifact import INDUCTOR_GEMM, load
    from perfmodel.configs import pruned_space
    from perfmodel.features import configs_tensor, problems_tensor

    probs = [GemmProblem(m=3000, n=1000, k=777, dtype="float16"),
             GemmProblem(m=64, n=4096, k=4096, dtype="bfloat16", transpose_right=True)]
    b = load(config_folder)
    got = {}
    for kernel in ("autotune", "inductor"):
        for backend in ("torch", "onnx"):
            p = Predictor.load(config_folder, backend=backend, kernel=kernel)
            assert p.backend == backend and p.has_static
            got[kernel, backend] = ([[c for c, _ in p.rank(q, top_k=4)] for q in probs], p.predict_many(probs[:1]))
        (rt, pt), (ro, po) = got[kernel, "torch"], got[kernel, "onnx"]
        assert rt == ro
        assert np.abs(np.log(pt) - np.log(po)).max() < 1e-4
    assert got["autotune", "torch"][0] != got["inductor", "torch"][0]      # random weights: the modes differ
    cfgs = pruned_space("float16", b.spec)             # the default configs of predict_many
    x = b.encoders["gemm"].encode_cross(problems_tensor(probs[:1]), configs_tensor(cfgs))
    with torch.inference_mode():
        want = b.heads[INDUCTOR_GEMM](x).double().exp().numpy()
    assert np.abs(np.log(got["inductor", "torch"][1][0]) - np.log(want)).max() < 1e-4


def test_a_bad_kernel_mode_record_is_refused(config_folder, tmp_path):
    import json
    import shutil

    from perfmodel.artifact import ArtifactError, load

    for bad in ({"autotune": 0.0}, {"autotune": 0.0, "inductor": "one"}, [0, 1]):
        folder = tmp_path / f"m{len(list(tmp_path.iterdir()))}"
        shutil.copytree(config_folder, folder)
        meta = json.loads((folder / "metadata.json").read_text())
        meta["kernel_mode_input"] = bad
        (folder / "metadata.json").write_text(json.dumps(meta))
        with pytest.raises(ArtifactError, match="kernel_mode_input"):
            load(folder)
    folder = tmp_path / "without"       # the record gone: the stored network's features do not match the encoder's
    shutil.copytree(config_folder, folder)
    meta = json.loads((folder / "metadata.json").read_text())
    del meta["kernel_mode_input"]
    (folder / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match="gemm"):
        load(folder)
