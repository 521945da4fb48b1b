"""perfmodel.model.PerfMLP and the model folder (perfmodel.artifact).

The weights in these tests are RANDOM (synthetic, seeded): the tests check the network's invariants and
the artifact round trip, not the quality of any prediction.
"""
from __future__ import annotations

import json
import math
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from perfmodel import GemmProblem, PadProblem, artifact, onnx_export
from perfmodel.artifact import ArtifactError, ModelBundle
from perfmodel.configs import exhaustive_space
from perfmodel.devices import get_spec
from perfmodel.features import FeatureEncoder, configs_tensor, pad_tensor, problems_tensor
from perfmodel.model import MLPConfig, PerfMLP

SPEC = get_spec("h100-sxm")
HIDDEN = (32, 32)


def _randomise(head: PerfMLP, gen: torch.Generator) -> PerfMLP:
    """Non-trivial BatchNorm running statistics and overhead, so that folding and the bound are exercised."""
    with torch.no_grad():
        for mod in head.modules():
            if isinstance(mod, nn.BatchNorm1d):
                mod.running_mean.copy_(torch.randn(mod.num_features, generator=gen) * 0.3)
                mod.running_var.copy_(torch.rand(mod.num_features, generator=gen) * 2 + 0.3)
                mod.weight.copy_(torch.rand(mod.num_features, generator=gen) + 0.5)
                mod.bias.copy_(torch.randn(mod.num_features, generator=gen) * 0.2)
    return head


def _features(seed: int = 0) -> dict[str, torch.Tensor]:
    """Real encoded features of a random sample: (N, F) per head."""
    rng = random.Random(seed)

    def dim() -> int:
        return max(1, int(2 ** rng.uniform(0, 14)))

    dts = ("float16", "bfloat16", "float32")
    probs = [GemmProblem(m=dim(), n=dim(), k=dim(), dtype=rng.choice(dts), allow_tf32=rng.random() < 0.5,
                         transpose_left=rng.random() < 0.5, transpose_right=rng.random() < 0.5) for _ in range(24)]
    cfgs = rng.sample(exhaustive_space(), 10)
    pads = [PadProblem(m=dim(), k=dim(), n=dim(), dtype=rng.choice(dts), transpose_left=rng.random() < 0.5,
                       transpose_right=rng.random() < 0.5, prepadded_left=rng.random() < 0.3,
                       prepadded_right=rng.random() < 0.3) for _ in range(40)]
    return {"gemm": FeatureEncoder(SPEC, "gemm").encode_cross(problems_tensor(probs), configs_tensor(cfgs)),
            "problem": FeatureEncoder(SPEC, "cublas").encode(problems_tensor(probs)),
            "pad": FeatureEncoder(SPEC, "pad").encode(pad_tensor(pads))}


def make_bundle(seed: int = 0, norm: str = "batch") -> tuple[ModelBundle, dict[str, torch.Tensor]]:
    """A small bundle with random weights and the normalisation of a realistic feature sample."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    feats = _features(seed)
    encoders = {"gemm": FeatureEncoder(SPEC, "gemm"), "problem": FeatureEncoder(SPEC, "cublas"),
                "pad": FeatureEncoder(SPEC, "pad")}
    heads = {}
    for name, n_out in (("gemm", 1), ("problem", 1), ("pad", 2)):
        head = PerfMLP(MLPConfig(len(encoders[name]), HIDDEN, norm, n_outputs=n_out))
        head.set_normalisation(feats[name].mean(0), feats[name].std(0))
        heads[name] = _randomise(head, gen).eval()
    # the problem network with one output, torch.mm's time
    return ModelBundle(SPEC, heads, encoders, {"problem_outputs": ["cublas"]}), feats


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[ModelBundle, dict[str, torch.Tensor], Path]:
    bundle, feats = make_bundle(seed=3)
    folder = tmp_path_factory.mktemp("artifact") / "model"
    artifact.save(bundle, folder)
    onnx_export.export_onnx(bundle, folder / artifact.ONNX)
    return bundle, feats, folder


@torch.inference_mode()
def _predict(bundle: ModelBundle, feats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: bundle.heads[n].eval()(feats[n]) for n in bundle.heads}


# ---------------------------------------------------------------- the network

@pytest.mark.parametrize("n_outputs", [1, 2])
@pytest.mark.parametrize("norm", ["batch", "layer", "none"])
def test_never_below_the_overhead(norm, n_outputs):
    torch.manual_seed(0)
    head = _randomise(PerfMLP(MLPConfig(12, HIDDEN, norm, n_outputs=n_outputs)), torch.Generator().manual_seed(1))
    with torch.no_grad():
        # 1 ms per output: an untouched random net would fall below it for about half of the inputs
        head.log_overhead.copy_(torch.tensor([0.0, -1.0][:n_outputs]))
    gen = torch.Generator().manual_seed(2)
    xs = [torch.randn(256, 12, generator=gen) * scale for scale in (1.0, 1e3, 1e6, 1e12)]
    xs.append(torch.full((4, 12), -1e12))
    oh = head.log_overhead.detach()
    below_without_bound = 0
    for mode in ("train", "eval"):
        head.train(mode == "train")
        for x in xs:
            with torch.no_grad():
                out = head(x)
                z = head.net((x - head.x_mean) / head.x_std)
            assert out.shape == ((len(x),) if n_outputs == 1 else (len(x), n_outputs))
            out2 = out.reshape(len(x), n_outputs)
            assert not torch.isnan(out2).any()
            assert (out2 >= oh).all(), (mode, x.abs().max())
            below_without_bound += int((z < oh).sum())
            # it is a soft maximum: logaddexp(z, overhead), within float32 rounding where both are finite
            fin = torch.isfinite(z)
            want = torch.logaddexp(z.double(), oh.double().expand_as(z))
            torch.testing.assert_close(out2[fin].double(), want[fin], rtol=1e-5, atol=1e-5)
    assert below_without_bound > 0  # the bound was actually needed


def test_prediction_tends_to_the_overhead():
    head = PerfMLP(MLPConfig(5, (8,), "none", init_overhead_ms=0.01)).eval()
    with torch.no_grad():
        head.net[-1].bias.fill_(-100.0)
        head.net[-1].weight.zero_()
    out = head(torch.randn(3, 5))
    torch.testing.assert_close(out, torch.full((3,), math.log(0.01)))
    assert head.overhead_ms.item() == pytest.approx(0.01)


def test_learned_overhead_is_a_trained_parameter():
    torch.manual_seed(0)
    head = PerfMLP(MLPConfig(6, (16,), "none", learn_overhead=True))
    assert isinstance(head.log_overhead, nn.Parameter)
    assert "log_overhead" in dict(head.named_parameters())
    assert "log_overhead" in head.state_dict()
    before = head.log_overhead.detach().clone()
    with torch.no_grad():
        head.net[-1].bias.fill_(-20.0)  # outputs at the overhead: the gradient reaches it
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    loss = ((head(torch.randn(32, 6)) - 0.0) ** 2).mean()
    loss.backward()
    assert head.log_overhead.grad is not None and head.log_overhead.grad.abs().sum() > 0
    opt.step()
    assert not torch.equal(head.log_overhead.detach(), before)


def test_fixed_overhead_is_a_buffer():
    torch.manual_seed(0)
    head = PerfMLP(MLPConfig(6, (16,), "none", learn_overhead=False))
    assert not isinstance(head.log_overhead, nn.Parameter)
    assert "log_overhead" in dict(head.named_buffers())
    assert "log_overhead" not in dict(head.named_parameters())
    assert "log_overhead" in head.state_dict()  # still saved with the weights
    assert head.log_overhead.item() == pytest.approx(math.log(0.00541))
    before = head.log_overhead.clone()
    with torch.no_grad():
        head.net[-1].bias.fill_(-20.0)
    opt = torch.optim.AdamW(head.parameters(), lr=0.5)
    for _ in range(3):
        opt.zero_grad()
        ((head(torch.randn(32, 6)) - 0.0) ** 2).mean().backward()
        opt.step()
    assert torch.equal(head.log_overhead, before)


@pytest.mark.parametrize("norm", ["batch", "layer", "none"])
def test_folded_matches_eval_and_has_no_batchnorm_or_dropout(norm):
    torch.manual_seed(4)
    feats = _features(4)["gemm"]
    head = PerfMLP(MLPConfig(feats.shape[1], (32, 32, 32), norm, dropout=0.2))
    head.set_normalisation(feats.mean(0), feats.std(0))
    _randomise(head, torch.Generator().manual_seed(5))
    head.train()
    folded = head.folded()
    assert not folded.training
    kinds = {type(m) for m in folded.modules()}
    assert nn.BatchNorm1d not in kinds and nn.Dropout not in kinds
    if norm == "batch":  # the original is untouched (folded works on a copy)
        assert any(isinstance(m, nn.BatchNorm1d) for m in head.modules()) and head.training
        assert torch.equal(folded.x_mean, torch.zeros_like(folded.x_mean))
        assert torch.equal(folded.x_std, torch.ones_like(folded.x_std))
    with torch.no_grad():
        want = head.eval()(feats)
        got = folded(feats)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    # and it is not trivially equal: the raw features are far from standardised
    assert feats.abs().max() > 10


# ---------------------------------------------------------------- the artifact

def test_save_load_round_trip(saved):
    bundle, feats, folder = saved
    for name in ("model.safetensors", "metadata.json", "model.onnx"):
        assert (folder / name).is_file()
    loaded = artifact.load(folder)
    assert set(loaded.heads) == {"gemm", "problem", "pad"}
    assert loaded.spec == SPEC
    for name in loaded.heads:
        assert loaded.encoders[name].names == bundle.encoders[name].names
        assert loaded.heads[name].cfg == bundle.heads[name].cfg
        assert not loaded.heads[name].training
    want, got = _predict(bundle, feats), _predict(loaded, feats)
    for name in want:
        assert torch.equal(got[name], want[name]), name
    assert got["pad"].shape == (len(feats["pad"]), 2)


def test_onnx_matches_torch_per_head(saved):
    ort = pytest.importorskip("onnxruntime")
    bundle, feats, folder = saved
    sess = ort.InferenceSession(str(folder / artifact.ONNX), providers=["CPUExecutionProvider"])
    # no screen head: the heads, and predict's graph (encoding included) on RANK_INPUTS, no ranking graph
    assert {i.name for i in sess.get_inputs()} == {"gemm_x", "problem_x", "pad_x", *onnx_export.RANK_INPUTS}
    assert {o.name for o in sess.get_outputs()} == {f"{h}_{o}" for h in ("gemm", "problem", "pad")
                                                    for o in ("log_ms", "score")} | set(onnx_export.PREDICT_OUTPUTS)
    want = _predict(bundle, feats)
    enc = bundle.encoders["gemm"]
    problems = torch.tensor([[300.0, 77, 4096, 2, 1, 0, 0, 1], [8192, 8192, 64, 4, 0, 1, 1, 0]], dtype=torch.float64)
    configs = torch.tensor([[64.0, 64, 32, 8, 3, 4], [128, 256, 64, 8, 4, 8], [16, 16, 16, 8, 1, 2]], dtype=torch.float64)
    part, smem = enc.config_part(configs)
    rank_feeds = {"rank_problems": problems.numpy(), "rank_configs": configs.numpy(), "rank_config_part": part.numpy(),
                  "rank_config_smem": smem.numpy()}
    with torch.no_grad():
        want_predict = bundle.heads["gemm"](enc.encode_cross(problems, configs)).reshape(2, 3).numpy()
    # a different batch size per head, twice over
    for sizes in ({"gemm": 240, "problem": 7, "pad": 33}, {"gemm": 1, "problem": 24, "pad": 2}):
        inputs = {**{f"{n}_x": feats[n][:sizes[n]].numpy() for n in sizes}, **rank_feeds}
        outs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, inputs)))
        for n, size in sizes.items():
            got = outs[f"{n}_log_ms"]
            assert got.shape == tuple(want[n][:size].shape), n
            # 1e-3 relative in ms
            np.testing.assert_allclose(np.exp(got), np.exp(want[n][:size].numpy()), rtol=1e-3, err_msg=n)
        np.testing.assert_allclose(np.exp(outs["predict_log_ms"]), np.exp(want_predict), rtol=1e-3)


def _copy_folder(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


def _edit_meta(folder: Path, fn) -> None:
    meta = json.loads((folder / artifact.METADATA).read_text())
    fn(meta)
    (folder / artifact.METADATA).write_text(json.dumps(meta))


def _rename_feature(meta):
    meta["heads"]["gemm"]["features"][3] = "dtype_size"


def _drop_gemm(meta):
    del meta["heads"]["gemm"]


@pytest.mark.parametrize("edit, match", [
    (lambda m: m.update(schema_version=m["schema_version"] + 1), "schema_version"),
    (lambda m: m.update(schema_version=None), "schema_version"),
    (lambda m: m.update(encoder_version=m["encoder_version"] + 1), "encoder_version"),
    (_rename_feature, "features"),
    (_drop_gemm, "no gemm head"),
    (lambda m: m.update(format="something-else"), "metadata"),
], ids=["schema+1", "schema-missing", "encoder+1", "renamed-feature", "no-gemm", "format"])
def test_mismatched_metadata_is_refused(saved, tmp_path, edit, match):
    folder = _copy_folder(saved[2], tmp_path / "m")
    artifact.load(folder)  # the unedited copy loads
    _edit_meta(folder, edit)
    with pytest.raises(ArtifactError, match=match):
        artifact.load(folder)


def test_metadata_not_json_is_refused(saved, tmp_path):
    folder = _copy_folder(saved[2], tmp_path / "m")
    (folder / artifact.METADATA).write_text("{ not json")
    with pytest.raises(ArtifactError, match="JSON"):
        artifact.load(folder)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_unreadable_weights_are_refused(saved, tmp_path, damage):
    folder = _copy_folder(saved[2], tmp_path / "m")
    w = folder / artifact.WEIGHTS
    data = w.read_bytes()
    w.write_bytes({"truncated": data[: len(data) // 2], "garbage": bytes(range(256)) * 40, "empty": b""}[damage])
    # with the checksum updated, the safetensors reader itself must refuse the file ...
    _edit_meta(folder, lambda m: m.update(weights_sha256=artifact.sha256_file(w)))
    with pytest.raises(ArtifactError, match="weights"):
        artifact.load(folder)
    # ... and without a recorded checksum the folder is refused by that (the weights' integrity cannot be checked)
    _edit_meta(folder, lambda m: m.pop("weights_sha256"))
    with pytest.raises(ArtifactError, match="weights_sha256: missing"):
        artifact.load(folder)


def test_checksum_mismatch_is_refused(saved, tmp_path):
    folder = _copy_folder(saved[2], tmp_path / "m")
    w = folder / artifact.WEIGHTS
    data = bytearray(w.read_bytes())
    data[-1] ^= 0x01  # one bit of one weight: still a valid safetensors file
    w.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="checksum"):
        artifact.load(folder)


def test_wrong_shaped_weights_are_refused(saved, tmp_path):
    folder = _copy_folder(saved[2], tmp_path / "m")
    _edit_meta(folder, lambda m: m["heads"]["gemm"]["mlp"].update(hidden=[64, 64]))
    with pytest.raises(ArtifactError, match="gemm"):
        artifact.load(folder)


def test_missing_folder_or_files(saved, tmp_path):
    with pytest.raises(FileNotFoundError):
        artifact.load(tmp_path / "no-such-model")
    for name in (artifact.WEIGHTS, artifact.METADATA):
        folder = _copy_folder(saved[2], tmp_path / f"without-{name}")
        (folder / name).unlink()
        with pytest.raises(FileNotFoundError):
            artifact.load(folder)


def test_no_pickle_anywhere(saved, monkeypatch):
    bundle, feats, folder = saved
    suffixes = {p.suffix for p in folder.rglob("*")}
    assert not suffixes & {".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".bin"}, suffixes

    def refuse(*args, **kwargs):
        raise AssertionError("pickle used while loading a model folder")

    for mod, attr in ((pickle, "loads"), (pickle, "load"), (pickle, "Unpickler"), (torch, "load")):
        monkeypatch.setattr(mod, attr, refuse)
    loaded = artifact.load(folder)
    want, got = _predict(bundle, feats), _predict(loaded, feats)
    for name in want:
        assert torch.equal(got[name], want[name])


def _members(gen: torch.Generator, n_inputs: int, hidden: tuple[int, ...], seed: int,
             overheads: list[list[float]] | None = None) -> list[PerfMLP]:
    """Three random two-output heads with realistic standardisation and BatchNorm statistics."""
    members = []
    for i in range(3):
        torch.manual_seed(seed + i)
        h = PerfMLP(MLPConfig(n_inputs=n_inputs, hidden=hidden, n_outputs=2))
        h.set_normalisation(torch.randn(n_inputs, generator=gen), torch.rand(n_inputs, generator=gen) + 0.5)
        for m in h.net:
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.normal_(generator=gen)
                m.running_var.uniform_(0.5, 2.0, generator=gen)
        if overheads is not None:
            with torch.no_grad():
                h.log_overhead.copy_(torch.tensor(overheads[i]))
        members.append(h.eval())
    return members


def test_ensemble_is_the_members_average_before_the_floor():
    gen = torch.Generator().manual_seed(3)
    members = _members(gen, 7, (16, 8, 8), 0, [[-5.0 - i] * 2 for i in range(3)])
    ens = PerfMLP.ensemble(members)
    assert ens.cfg.hidden == (48, 24, 24) and ens.cfg.norm == "none" and ens.cfg.n_outputs == 2
    x = torch.randn(50, 7, generator=gen) * 3
    with torch.no_grad():
        pre = torch.stack([m.net((x - m.x_mean) / m.x_std) for m in members]).mean(0)
        np.testing.assert_allclose(ens.net(x).numpy(), pre.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ens(x).numpy(), ens.overhead_floor(pre).numpy(), rtol=1e-5, atol=1e-5)
        assert torch.allclose(ens.log_overhead, torch.tensor([-6.0, -6.0]))
        assert torch.all(ens(x) >= ens.log_overhead - 1e-6)
    with pytest.raises(ValueError, match="members"):
        PerfMLP.ensemble([members[0], PerfMLP(MLPConfig(n_inputs=7, hidden=(4,), n_outputs=2))])


def test_grouped_net_runs_an_ensemble_as_its_members():
    """GroupedNet (batched member products, served by both backends) equals the ensemble's
    block-diagonal net; a head whose hidden layers are not block-diagonal is refused."""
    from perfmodel.model import GroupedNet

    gen = torch.Generator().manual_seed(5)
    members = _members(gen, 6, (12, 12, 12), 10)
    ens = PerfMLP.ensemble(members)
    assert ens.cfg.members == 3 and MLPConfig.from_dict(ens.cfg.as_dict()) == ens.cfg
    grouped = GroupedNet(ens)
    served = ens.for_serving()
    assert isinstance(served.net, GroupedNet)
    x = torch.randn(40, 6, generator=gen) * 2
    with torch.no_grad():
        np.testing.assert_allclose(grouped(x).numpy(), ens.net(x).numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(served(x).numpy(), ens(x).numpy(), rtol=1e-5, atol=1e-5)
        ens.net[2].weight[0, -1] = 0.5  # a weight between members: no longer an ensemble
    with pytest.raises(ValueError, match="block-diagonal"):
        GroupedNet(ens)
    with pytest.raises(ValueError, match="GroupedNet"):
        GroupedNet(members[0])


def test_an_ensemble_is_stored_as_its_members_blocks_and_loads_bit_for_bit(tmp_path: Path):
    """The folder stores an ensemble's block-diagonal weights as their diagonal blocks ("<key>.blocks"), a
    weight with any entry between members as it is; loading gives back every tensor bit for bit (random
    members: synthetic weights)."""
    from safetensors.torch import load_file, save_file

    gen = torch.Generator().manual_seed(9)
    members = _members(gen, 6, (12, 12, 12), 30)
    ens = PerfMLP.ensemble(members, average="after_floor")
    sd = ens.state_dict()
    stored = artifact.compact_state(sd, ens.cfg.members)
    blocks = sorted(k for k in stored if k.endswith(artifact.BLOCKS))
    # the hidden Linears and the after-floor output are block-diagonal; the first Linear (stacked) is not
    assert blocks == ["net.2.weight.blocks", "net.4.weight.blocks", "net.6.weight.blocks"]
    assert stored["net.2.weight.blocks"].shape == (3, 12, 12) and stored["net.0.weight"].shape == (36, 6)
    back = artifact.expand_state(stored)
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)
    with torch.no_grad():
        ens.net[2].weight[0, -1] = 0.5  # a weight between members: stored dense, and still loads exactly
    kept = artifact.compact_state(ens.state_dict(), ens.cfg.members)
    assert "net.2.weight" in kept and "net.2.weight.blocks" not in kept
    assert torch.equal(artifact.expand_state(kept)["net.2.weight"], ens.net[2].weight)
    assert artifact.compact_state(members[0].state_dict(), 1).keys() == members[0].state_dict().keys()
    # a saved folder round-trips; a blocks tensor of the wrong rank is refused naming it
    bundle, feats = make_bundle(1)
    n = feats["gemm"].shape[1]
    gemm = [PerfMLP(MLPConfig(n, (12, 12), "none")) for _ in range(3)]
    for h in gemm:
        h.set_normalisation(feats["gemm"].mean(0), feats["gemm"].std(0))
    bundle.heads["gemm"] = PerfMLP.ensemble([_randomise(h, gen).eval() for h in gemm], average="after_floor")
    folder = artifact.save(bundle, tmp_path / "m")
    loaded = artifact.load(folder).heads["gemm"].state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in bundle.heads["gemm"].state_dict().items())
    t = load_file(str(folder / artifact.WEIGHTS))
    assert "gemm.net.2.weight.blocks" in t
    t["gemm.net.2.weight.blocks"] = t["gemm.net.2.weight.blocks"][0]
    save_file(t, str(folder / artifact.WEIGHTS))
    _edit_meta(folder, lambda m: m.update(weights_sha256=artifact.sha256_file(folder / artifact.WEIGHTS)))
    with pytest.raises(ArtifactError, match="net.2.weight.blocks"):
        artifact.load(folder)


def test_after_floor_ensemble_is_the_mean_of_the_members_log_ms():
    """average="after_floor": each member floored by its own overhead, then the mean; GroupedNet and
    the folded copy serve the same; never below the smallest member overhead."""
    from perfmodel.model import GroupedNet

    gen = torch.Generator().manual_seed(8)
    members = _members(gen, 5, (8, 8), 20, [[-1.0 - i, -0.5 * i] for i in range(3)])
    ens = PerfMLP.ensemble(members, average="after_floor")
    assert ens.cfg.average == "after_floor" and ens.floors_each_member and ens.log_overhead.shape == (6,)
    x = torch.randn(30, 5, generator=gen) * 3
    with torch.no_grad():
        want = torch.stack([m(x) for m in members]).mean(0)
        for got in (ens(x), ens.for_serving()(x), ens.overhead_floor(GroupedNet(ens)(x))):
            assert got.shape == (30, 2)
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
        # differs from the before-floor average, where members near or below their overheads bend it
        before = PerfMLP.ensemble(members)(x)
        assert not torch.allclose(before, want, atol=1e-3)
        assert torch.all(ens(x) >= ens.log_overhead.reshape(3, 2).min(0).values - 1e-6)
    with pytest.raises(ValueError, match="average"):
        PerfMLP(MLPConfig(n_inputs=5, hidden=(8,), average="median"))
