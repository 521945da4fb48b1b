"""perfmodel/migrate.py (`perfmodel migrate`): a folder of the older layout converted once into the current one.

The old-layout folder is made here from the shipped models/h100 (a synthetic conversion the other way): its
problem network split into separate cublas, call and call_static heads -- each the network with its output layer
cut to one output, so each computes exactly that output -- and one head's floor_features dropped from the
metadata (a folder written before the field). Migrating it must give back one problem network that serves what
the shipped folder serves (to float rounding: the stacked layers add zeros between the same products), and leave
every other head's weights bit for bit."""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from perfmodel import GemmProblem, artifact
from perfmodel.heads.legacy import LEGACY
from perfmodel.migrate import MigrationError, migrate
from perfmodel.model import PerfMLP

REPO = Path(__file__).resolve().parents[1]
PROBS = [GemmProblem(m=m, n=n, k=k, dtype=d) for m, n, k, d in
         ((4096, 4096, 4096, "float16"), (16, 4096, 4096, "bfloat16"), (1000, 37, 129, "float32"),
          (3, 50257, 768, "float16"), (8192, 8192, 512, "bfloat16"), (128, 128, 8192, "float16"))]


def _column_head(net: PerfMLP, j: int) -> PerfMLP:
    """The problem network cut to its output j: the same hidden layers, the output layer's row j."""
    head = PerfMLP(replace(net.cfg, n_outputs=1, floor_features=net.cfg.floor_features[j:j + 1]))
    head.load_state_dict({k: v for k, v in net.state_dict().items() if not k.startswith("net.") and k != "log_overhead"},
                         strict=False)
    lins = [m for m in net.net if isinstance(m, nn.Linear)]
    mine = [m for m in head.net if isinstance(m, nn.Linear)]
    with torch.no_grad():
        for a, b in zip(lins[:-1], mine[:-1]):
            b.weight.copy_(a.weight)
            b.bias.copy_(a.bias)
        mine[-1].weight.copy_(lins[-1].weight[j:j + 1])
        mine[-1].bias.copy_(lins[-1].bias[j:j + 1])
        head.log_overhead.copy_(net.log_overhead[j:j + 1])
    return head.eval()


def _save_old(bundle: artifact.ModelBundle, dst: Path) -> None:
    """bundle written as a folder of the older layout: save() with the older heads' specs registered for the
    write (the format itself refuses them)."""
    from perfmodel.onnx_export import export_onnx_all

    mp = pytest.MonkeyPatch()
    with mp.context() as m:
        m.setattr(artifact, "REGISTRY", {**artifact.REGISTRY, **LEGACY})
        artifact.save(bundle, dst)
        export_onnx_all(bundle, dst)


def _old_layout(dst: Path) -> Path:
    bundle = artifact.load(REPO / "models" / "h100")
    net = bundle.heads.pop(artifact.PROBLEM)
    enc = bundle.encoders.pop(artifact.PROBLEM)
    for j, name in enumerate(bundle.metadata["problem_outputs"]):
        bundle.heads[name], bundle.encoders[name] = _column_head(net, j), enc
    bundle.metadata.pop("problem_outputs")
    _save_old(bundle, dst)
    meta = json.loads((dst / "metadata.json").read_text())
    del meta["heads"]["pad"]["mlp"]["floor_features"]  # written before the field: the loader gives the floor
    (dst / "metadata.json").write_text(json.dumps(meta))
    return dst


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.mark.slow
def test_an_old_layout_folder_migrates_to_what_the_shipped_one_serves(tmp_path):
    from perfmodel import Predictor

    old = _old_layout(tmp_path / "old")
    assert {"cublas", "call", "call_static"} <= set(json.loads((old / "metadata.json").read_text())["heads"])
    before = _tensors(old)
    said: list[str] = []
    changes = migrate(old, log=said.append)
    assert any("cublas, call, call_static -> problem" in c for c in changes)
    assert any(c.startswith("pad: floor_features written") for c in changes)
    meta = json.loads((old / "metadata.json").read_text())
    assert set(meta["heads"]) == set(json.loads((REPO / "models/h100/metadata.json").read_text())["heads"])
    assert meta["problem_outputs"] == ["cublas", "call", "call_static"] and meta["build"]["steps"][-1]["step"] == "migrate"
    after = _tensors(old)
    kept = [k for k in before if k.split(".")[0] not in ("cublas", "call", "call_static")]
    assert kept and all(torch.equal(before[k], after[k]) for k in kept)  # every other head bit for bit
    assert migrate(old, log=said.append) == [] and "current layout" in said[-1]
    for backend in ("torch", "onnx"):
        for kernel in ("autotune", "inductor"):
            want = Predictor.load(REPO / "models" / "h100", backend=backend, kernel=kernel)
            got = Predictor.load(old, backend=backend, kernel=kernel)
            np.testing.assert_allclose(got.predict_cublas_many(PROBS), want.predict_cublas_many(PROBS), rtol=1e-5)
            assert (got.prefers_cublas_many(PROBS) == want.prefers_cublas_many(PROBS)).all()
            for p in PROBS:
                assert got.rank(p, top_k=3) == want.rank(p, top_k=3)
                assert got.candidates(p).prefer_cublas == want.candidates(p).prefer_cublas


def test_a_screen_head_is_refused_unless_dropped(tmp_path):
    import copy

    from perfmodel import Predictor
    from tests._synthetic import make_synthetic_bundle

    bundle = make_synthetic_bundle(screen=None, with_cublas=False)
    bundle.heads["screen"], bundle.encoders["screen"] = copy.deepcopy(bundle.heads["gemm"]), bundle.encoders["gemm"]
    folder = tmp_path / "m"
    _save_old(bundle, folder)
    with pytest.raises(artifact.ArtifactError, match="head 'screen' of an older folder layout.*perfmodel migrate .*--drop"):
        artifact.load(folder)
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.raises(MigrationError, match="screen: .*--only student.*--drop screen"):
        migrate(folder, log=lambda *a: None)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == files  # refused: the folder as it was
    changes = migrate(folder, drop=("screen",), log=lambda *a: None)
    assert any(c.startswith("screen dropped: rank scores every config") for c in changes)
    p = Predictor.load(folder, backend="torch")
    assert "screen" not in p.bundle.heads and not p.has_screen and p.rank(PROBS[0], top_k=2)
    assert [x.name for x in tmp_path.iterdir()] == ["m"]  # no temporary folder left


def test_the_shipped_folders_are_current(tmp_path, capsys):
    from perfmodel.cli import main

    for name in ("h100", "h200"):
        folder = shutil.copytree(REPO / "models" / name, tmp_path / name)
        files = {p.name: p.read_bytes() for p in folder.iterdir()}
        assert main(["migrate", str(folder)]) == 0
        assert "current layout; nothing to do" in capsys.readouterr().out
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == files
    with pytest.raises(SystemExit) as exc:  # only the heads without an exact conversion may be dropped
        main(["migrate", str(tmp_path / "h100"), "--drop", "gemm"])
    assert exc.value.code == 2


def test_the_loader_refuses_an_old_layout_folder_naming_the_migration(tmp_path):
    from perfmodel import Predictor

    old = _old_layout(tmp_path / "old")
    msg = (f"{old}: heads 'call', 'call_static', 'cublas' of an older folder layout (perfmodel/heads/legacy.py), "
           f"no longer loaded; convert the folder once with: perfmodel migrate {old}")
    for load in (artifact.load, lambda f: Predictor.load(f, backend="torch")):
        with pytest.raises(artifact.ArtifactError) as exc:
            load(old)
        assert str(exc.value) == msg
