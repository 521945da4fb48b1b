"""The student head (train/distill.py, `perfmodel distill`) and how the Predictor serves it: only as the screen
of the fast path, rank(screened=True). predict, predict_many and rank serve the gemm head on every config, with
a student or without one (and with a model.onnx written before the predict graph), on both backends."""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from perfmodel import GemmConfig, GemmProblem, artifact, onnx_export
from perfmodel.configs import pruned_space
from perfmodel.serve import Predictor
from tests._synthetic import write_synthetic_model

PROBS = [GemmProblem(m=4096, n=4096, k=4096, dtype="float16"), GemmProblem(m=77, n=3000, k=129, dtype="float16"),
         GemmProblem(m=1, n=512, k=8192, dtype="float16", transpose_right=True)]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    from tests._synthetic import write_synthetic_dataset

    return write_synthetic_dataset(tmp_path_factory.mktemp("distill") / "data")


@pytest.fixture(scope="module")
def distilled(tmp_path_factory, data_dir: Path) -> tuple[Path, Path, dict]:
    """(a synthetic model folder, the same folder after the student step (`build --only student`), its metrics)."""
    from perfmodel.train.distill import DistillSettings
    from perfmodel.train.refit import refit_student

    tmp = tmp_path_factory.mktemp("distilled")
    before = write_synthetic_model(tmp / "before", seed=3, members=3, hidden=(32, 32), screen=None)
    after = tmp / "after"
    shutil.copytree(before, after)
    refit_student(DistillSettings(model=after, data=data_dir, hidden=(24, 24), epochs=2, random_problems=16,
                                  random_configs=32), log=lambda *a: None)
    return before, after, json.loads((after / "metadata.json").read_text())["student_metrics"]


def test_distill_adds_a_student_and_keeps_the_rest(distilled) -> None:
    before, after, metrics = distilled
    old, new = artifact.load(before), artifact.load(after)
    assert set(new.heads) == set(old.heads) | {"student"}
    assert new.heads["student"].cfg.hidden == (24, 24) and new.encoders["student"].kind == "gemm"
    assert new.heads["student"].cfg.floor_features == new.heads["gemm"].cfg.floor_features  # floored alike
    for name, head in old.heads.items():  # the other heads unchanged
        for k, v in head.state_dict().items():
            assert torch.equal(v, new.heads[name].state_dict()[k]), (name, k)
    assert 0 < metrics["student/median_abs_log_diff"] and 0 < metrics["gemm/member_spread_median"]
    assert metrics["student/test_problems"] >= 1
    # the settings (the fixture's student step) are what the fit ran with
    settings = new.metadata["student_settings"]
    assert (settings["hidden"], settings["epochs"], settings["random_problems"], settings["random_configs"]) == \
        ([24, 24], 2, 16, 32)
    assert settings["device"] == "cpu"  # the default


def test_member_spread_is_measured_around_the_ensemble(distilled) -> None:
    from perfmodel.train.distill import member_log_ms

    new = artifact.load(distilled[1])
    gemm, enc = new.heads["gemm"], new.encoders["gemm"]
    x = enc.encode_cross(torch.tensor([[300.0, 2000, 64, 2, 0, 0, 0, 0]], dtype=torch.float64),
                         torch.tensor([[64.0, 64, 32, 8, 3, 4], [128, 256, 64, 8, 4, 8]], dtype=torch.float64))
    with torch.inference_mode():
        # after-floor ensemble: the head's output is the members' mean (its physical floor aside)
        want = gemm(x)
        got = torch.maximum(member_log_ms(gemm, x).mean(1), x[:, gemm.cfg.floor_features[0]])
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_predict_and_rank_serve_the_gemm_head_beside_a_student(distilled, backend: str) -> None:
    """predict returns the gemm head's times, not the student's, and rank orders by them: its picks and their
    times are predict's."""
    _, after, _ = distilled
    p = Predictor.load(after, backend=backend)
    assert p.predict_head == "gemm"
    bundle = artifact.load(after)
    cfgs = list(pruned_space("float16", bundle.spec))[:300]
    enc = bundle.encoders["gemm"]
    from perfmodel.features import configs_tensor, problems_tensor

    x = enc.encode_cross(problems_tensor(PROBS), configs_tensor(cfgs))
    with torch.inference_mode():
        student = bundle.heads["student"](x).double().numpy().reshape(len(PROBS), -1)
        gemm = bundle.heads["gemm"](x).double().numpy().reshape(len(PROBS), -1)
    got = np.log(p.predict_many(PROBS, cfgs))
    assert np.allclose(got, gemm, atol=1e-3) and not np.allclose(got, student, atol=1e-3)
    assert np.allclose(np.log(p.predict(PROBS[1], cfgs)), gemm[1], atol=1e-3)
    floor = x[:, enc.names.index("log_roofline_ms")].double().numpy().reshape(len(PROBS), -1)
    assert np.all(got >= floor - 1e-4)
    # rank: predict's order and times
    for i, prob in enumerate(PROBS):
        best = p.rank(prob, cfgs, top_k=3)
        ms = p.predict(prob, cfgs)
        assert best[0][0] == cfgs[int(np.argmin(ms))] and [t for _, t in best] == sorted(ms)[:3]


def test_both_backends_agree_on_predict_beside_a_student(distilled) -> None:
    _, after, _ = distilled
    pt, ox = Predictor.load(after, backend="torch"), Predictor.load(after, backend="onnx")
    assert ox._run.predict_session is not None
    cfgs = list(pruned_space("float16", pt.spec))
    a, b = np.log(pt.predict_many(PROBS, cfgs)), np.log(ox.predict_many(PROBS, cfgs))
    assert np.abs(a - b).max() < 1e-3


def test_folder_without_student_predicts_with_the_gemm_head(distilled) -> None:
    before, _, _ = distilled
    for backend in ("torch", "onnx"):
        p = Predictor.load(before, backend=backend)
        assert p.predict_head == "gemm"
        bundle = p.bundle
        x = bundle.encoders["gemm"].encode_cross(
            torch.from_numpy(np.frombuffer(PROBS[0].packed, dtype=np.float64).reshape(1, -1).copy()),
            torch.tensor([[64.0, 64, 32, 8, 3, 4]], dtype=torch.float64))
        with torch.inference_mode():
            want = bundle.heads["gemm"](x).double().numpy()
        assert np.allclose(np.log(p.predict(PROBS[0], [GemmConfig(64, 64, 32, 8, 3, 4)])), want, atol=1e-3)


def test_onnx_written_before_the_predict_graph_still_serves(screening: Path, tmp_path: Path) -> None:
    """A model.onnx without predict_log_ms (exported before it existed), of a folder whose student screens (its
    rank graph kept): predict encodes in torch and runs the head's own graph."""
    import onnx
    from onnx.utils import Extractor

    after = screening
    folder = tmp_path / "m"
    shutil.copytree(after, folder)
    model = onnx.load(str(folder / "model.onnx"))
    outputs = [o.name for o in model.graph.output if o.name not in onnx_export.PREDICT_OUTPUTS]
    old = Extractor(model).extract_model([i.name for i in model.graph.input], outputs)
    onnx.save(old, str(folder / "model.onnx"))
    p = Predictor.load(folder, backend="onnx")
    assert p._run.predict_session is None and p._run.rank_session is not None
    q = Predictor.load(after, backend="onnx")
    cfgs = list(pruned_space("float16", p.spec))[:50]
    assert np.allclose(np.log(p.predict_many(PROBS, cfgs)), np.log(q.predict_many(PROBS, cfgs)), atol=1e-4)


def test_stale_student_export_is_refused(distilled, tmp_path: Path) -> None:
    """A folder whose student weights differ from its model.onnx is refused at load, like any head."""
    from safetensors.torch import load_file, save_file

    _, after, _ = distilled
    folder = tmp_path / "m"
    shutil.copytree(after, folder)
    t = load_file(str(folder / "model.safetensors"))
    key = next(k for k in t if k.startswith("student.net.0.weight"))
    t[key] = t[key] * 1.5
    save_file(t, str(folder / "model.safetensors"))
    meta = json.loads((folder / "metadata.json").read_text())
    meta["weights_sha256"] = artifact.sha256_file(folder / "model.safetensors")
    (folder / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(artifact.ArtifactError, match="stale"):
        Predictor.load(folder, backend="onnx")


@pytest.fixture(scope="module")
def screening(tmp_path_factory, distilled) -> Path:
    """The distilled folder refitted with `perfmodel distill --screens`: the student screens, no screen head."""
    from perfmodel.train.distill import DistillSettings
    from perfmodel.train.refit import refit_student

    _, after, _ = distilled
    folder = tmp_path_factory.mktemp("screening") / "m"
    shutil.copytree(after, folder)
    data = json.loads((after / "metadata.json").read_text())["student_settings"]["data"]
    refit_student(DistillSettings(model=folder, data=Path(data), hidden=(24, 24), epochs=2, random_problems=16,
                                  random_configs=32, screens=True), log=lambda *a: None)
    return folder


def test_distill_screens_makes_the_student_screen(distilled, screening: Path) -> None:
    # no screen head is written any more (an older layout): --screens makes the student the head that screens
    old, new = artifact.load(distilled[1]), artifact.load(screening)
    assert "screen" not in old.heads and old.screen_name is None and "screen_head" not in old.metadata
    assert set(new.heads) == set(old.heads)
    assert new.metadata["screen_head"] == "student" and new.screen_name == "student"
    assert new.lead_keep == old.lead_keep and new.screen_keep == old.screen_keep
    from perfmodel.train.folder import _screen_md

    assert "student" in _screen_md(new.metadata) and "screen (a small head" not in _screen_md(new.metadata)
    assert "screen (a small head" not in _screen_md(old.metadata) and "student" not in _screen_md(old.metadata)


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_the_student_screens_the_ranking(screening: Path, backend: str) -> None:
    """rank(screened=True) with screen_head = student: the gemm head's times, only for configs among the
    student's best screen_keep (the screen's rule, the student in its place); both backends give the same
    picks."""
    from perfmodel.features import configs_tensor, problems_tensor

    p = Predictor.load(screening, backend=backend)
    assert p.has_screen and p.predict_head == "gemm"
    bundle = artifact.load(screening)
    cfgs = list(pruned_space("float16", bundle.spec))[:300]
    keep = bundle.screen_keep
    assert len(cfgs) > 2 * keep  # the screened path
    x = bundle.encoders["gemm"].encode_cross(problems_tensor(PROBS), configs_tensor(cfgs))
    with torch.inference_mode():
        student = bundle.heads["student"].score(x).double().numpy().reshape(len(PROBS), -1)
        gemm = bundle.heads["gemm"](x).double().numpy().reshape(len(PROBS), -1)
    for i, prob in enumerate(PROBS):
        best = p.rank(prob, cfgs, top_k=3, screened=True)
        idx = [cfgs.index(c) for c, _ in best]
        allowed = set(np.argsort(student[i], kind="stable")[:keep].tolist())
        assert set(idx) <= allowed
        assert np.allclose(np.log([ms for _, ms in best]), gemm[i][idx], atol=1e-3)
    other = Predictor.load(screening, backend="onnx" if backend == "torch" else "torch")
    assert [c for c, _ in p.rank(PROBS[0], cfgs, top_k=3, screened=True)] == \
        [c for c, _ in other.rank(PROBS[0], cfgs, top_k=3, screened=True)]


def test_bad_screen_head_is_refused(screening: Path, distilled, tmp_path: Path) -> None:
    for src, value, match in ((screening, "gemm", "screen_head"), (distilled[1], "screen", "perfmodel migrate"),
                              (distilled[0], "student", "no student head")):
        folder = tmp_path / f"m-{value}-{src.name}"
        shutil.copytree(src, folder)
        meta = json.loads((folder / "metadata.json").read_text())
        meta["screen_head"] = value
        (folder / "metadata.json").write_text(json.dumps(meta))
        with pytest.raises(artifact.ArtifactError, match=match):
            artifact.load(folder)
