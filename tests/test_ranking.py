"""One ranking rule (perfmodel.ranking.screened_rank): the torch backend, the ONNX ranking graph and the
held-out evaluation pick the same configs in the same order."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from perfmodel import GemmProblem, Predictor
from perfmodel.features import configs_tensor, problems_tensor
from perfmodel.ranking import refines, screened_rank, screens


def test_screened_rank_rule() -> None:
    """Screen keeps its best `keep` (ties in config order), the gemm head's score sorts them, ties in
    config order; log ms come along unsorted by themselves."""
    screen = torch.tensor([[5.0, 1.0, 1.0, 0.0, 9.0, 2.0]])
    score = torch.tensor([0.5, 2.0, 0.5, 3.0, -1.0, 0.1])
    log_ms = score + 10
    calls = []

    def gemm(rows, lead):
        assert lead is None
        calls.append(rows)
        return (score, log_ms) if rows is None else (score[rows], log_ms[rows])

    idx, lm = screened_rank(gemm, 1, 6, screen, 3, 3)
    assert calls[0].tolist() == [1, 2, 3]          # the screen's best 3, in config order
    assert idx.tolist() == [[2, 1, 3]] and lm.tolist() == [[10.5, 12.0, 13.0]]
    # by_config (the ONNX graph): gemm gets the kept configs per problem, (P, keep); the same result
    calls.clear()
    assert screened_rank(gemm, 1, 6, screen, 3, 3, by_config=True)[0].tolist() == idx.tolist()
    assert [c.tolist() for c in calls] == [[[1, 2, 3]]]
    idx, _ = screened_rank(gemm, 1, 6, None, 3, 4)
    assert idx.tolist() == [[4, 5, 0, 2]]          # every config; 0 before 2 (a tie)
    assert screens(True, 7, 3) and not screens(True, 6, 3) and not screens(False, 100, 3)


def test_screened_rank_through_a_lead() -> None:
    """With a lead: the lead scores the screen's `keep` (in config order), its best lead_keep go on, in
    config order, to the whole ensemble, which gets the lead's outputs on exactly those rows; the ranking
    is the ensemble's. A ranking longer than lead_keep skips the lead."""
    screen = torch.tensor([[0.0, 9.0, 1.0, 2.0, 3.0, 9.0, 4.0, 9.0, 9.0, 9.0]])       # keeps 0, 2, 3, 4, 6
    lead_score = torch.tensor([5.0, 0.0, 1.0, 4.0, 0.5, 0.0, 2.0, 0.0, 0.0, 0.0])     # of those: 2, 4, 6 best
    score = torch.tensor([0.0, -9.0, 3.0, -1.0, 1.0, -9.0, 2.0, -9.0, -9.0, -9.0])
    seen = []

    def lead(rows):
        seen.append(("lead", rows.tolist()))
        return lead_score[rows], lead_score[rows] * 10

    def gemm(rows, carry):
        seen.append(("gemm", rows.tolist(), None if carry is None else carry.tolist()))
        return score[rows], score[rows] + 10

    idx, lm = screened_rank(gemm, 1, 10, screen, 5, 2, lead=lead, lead_keep=3)
    assert seen == [("lead", [0, 2, 3, 4, 6]), ("gemm", [2, 4, 6], [10.0, 5.0, 20.0])]
    assert idx.tolist() == [[4, 6]] and lm.tolist() == [[11.0, 12.0]]   # the ensemble's best of the 5 (3, 0) not passed on
    seen.clear()
    assert screened_rank(gemm, 1, 10, screen, 5, 4, lead=lead, lead_keep=3)[0].tolist() == [[3, 0, 4, 6]]
    assert [s[0] for s in seen] == ["gemm"]                             # k > lead_keep: no lead
    # by_config (the ONNX graph): the lead's outputs come with their places among the kept rows
    calls = []

    def gemm_cfg(cand, carry):
        calls.append((cand.tolist(), carry[0].tolist(), carry[1].tolist()))
        return score[cand].reshape(-1), (score[cand] + 10).reshape(-1)

    idx2, _ = screened_rank(gemm_cfg, 1, 10, screen, 5, 2, by_config=True,
                            lead=lambda c: (lead_score[c].reshape(-1), (lead_score[c] * 10).reshape(-1)), lead_keep=3)
    assert idx2.tolist() == idx.tolist() and calls == [([[2, 4, 6]], [[10.0, 5.0, 20.0]], [[1, 3, 4]])]
    assert refines(3, 5, 3) and not refines(3, 5, 4) and not refines(0, 5, 1) and not refines(5, 5, 1)


def _lead_model(tmp_path, lead_keep: int = 3):
    from tests._synthetic import write_synthetic_model

    return write_synthetic_model(tmp_path / "lead", seed=3, hidden=(32, 32), members=3, average="after_floor",
                                 screen="random", screen_keep=8, lead_keep=lead_keep)


def test_lead_keep_serves_alike_on_both_backends_and_in_the_evaluation(tmp_path) -> None:
    """A model with a lead_keep: on the fast path (rank(screened=True)) the torch backend, the ONNX ranking
    graph and the evaluation's rank_rows rank as the rule does from the heads called directly -- the screen's
    best 8, the lead member's best 3 of them, the ensemble's order -- and a top_k above lead_keep ranks the
    screen's 8 with the ensemble. The default rank is the ensemble's order of every config."""
    from perfmodel.train.evaluate import head_outputs, lead_outputs, rank_rows

    folder = _lead_model(tmp_path)
    pt, po = Predictor.load(folder, backend="torch"), Predictor.load(folder, backend="onnx")
    assert pt.lead_keep == po.lead_keep == 3 and po._run.rank_width == 3
    heads = pt.bundle.heads
    rng = random.Random(2)
    for _ in range(10):
        prob = GemmProblem(m=rng.randint(1, 9000), n=rng.randint(1, 9000), k=rng.randint(1, 9000), dtype="float16")
        configs = pt.default_configs("float16")
        x = pt.bundle.encoders["gemm"].encode_cross(problems_tensor([prob]), configs_tensor(configs))
        z, g = head_outputs(heads["gemm"], x)
        s = head_outputs(heads["student"], x)[0]
        ld = lead_outputs(heads["gemm"], x)
        kept = np.sort(np.argsort(s, kind="stable")[:8])
        led = np.sort(kept[np.argsort(ld[kept], kind="stable")[:3]])
        want = [configs[i] for i in led[np.argsort(z[led], kind="stable")]]
        assert [c for c, _ in pt.rank(prob, top_k=3, screened=True)] == want, prob
        assert [c for c, _ in po.rank(prob, top_k=3, screened=True)] == want, prob
        assert [configs[i] for i in rank_rows(z, g, s, 8, 3, ld, 3)[0]] == want
        np.testing.assert_allclose([t for _, t in po.rank(prob, top_k=3, screened=True)],
                                   [t for _, t in pt.rank(prob, top_k=3, screened=True)], rtol=1e-4)
        # longer than lead_keep: the ensemble on the screen's 8 (onnx's head sessions, torch alike)
        full = [configs[i] for i in kept[np.argsort(z[kept], kind="stable")][:5]]
        assert [c for c, _ in pt.rank(prob, top_k=5, screened=True)] == \
            [c for c, _ in po.rank(prob, top_k=5, screened=True)] == full
        every = [configs[i] for i in np.argsort(z, kind="stable")[:5]]          # the default: every config
        assert [c for c, _ in pt.rank(prob, top_k=5)] == [c for c, _ in po.rank(prob, top_k=5)] == every


def test_lead_keep_is_checked(tmp_path, capsys) -> None:
    """lead_keep below screen_keep, on an ensemble averaged after the floor, with a screen: else the
    folder is refused and export-onnx --lead-keep fails naming the flag, leaving the folder as it was."""
    import json

    from perfmodel import artifact, onnx_export
    from perfmodel.cli import main

    folder = _lead_model(tmp_path)
    meta = json.loads((folder / "metadata.json").read_text())
    for bad in (8, -1, "3"):
        (folder / "metadata.json").write_text(json.dumps({**meta, "lead_keep": bad}))
        with pytest.raises(artifact.ArtifactError, match="lead_keep"):
            artifact.load(folder)
    (folder / "metadata.json").write_text(json.dumps(meta))
    assert main(["export-onnx", "--model", str(folder), "--lead-keep", "8"]) == 2
    assert "--lead-keep" in capsys.readouterr().err and artifact.load(folder).lead_keep == 3
    assert main(["export-onnx", "--model", str(folder), "--lead-keep", "0"]) == 0
    assert artifact.load(folder).lead_keep == 0 and Predictor.load(folder, backend="onnx")._run.rank_width == 8
    from tests._synthetic import write_synthetic_model

    single = write_synthetic_model(tmp_path / "single", seed=1, hidden=(16,), screen="random", screen_keep=8)
    assert main(["export-onnx", "--model", str(single), "--lead-keep", "3"]) == 2
    assert "--lead-keep" in capsys.readouterr().err


@pytest.fixture(scope="module")
def shipped() -> tuple[Predictor, Predictor]:
    return Predictor.load(), Predictor.load(backend="onnx")


def test_torch_onnx_and_evaluation_rank_alike(shipped) -> None:
    """The shipped model on both backends: the fast path (screened=True) as the evaluation's rank_rows ranks
    it, and, on every fourth problem, the default rank as the gemm head orders every config (rank_rows
    without a screen; the evaluation's "gemm head on every config")."""
    import warnings

    from perfmodel.domain import OutsideDomainWarning
    from perfmodel.train.evaluate import head_outputs, lead_outputs, rank_rows

    warnings.simplefilter("ignore", OutsideDomainWarning)  # dims down to 1: below the trained ones
    pt, po = shipped
    bundle = pt.bundle
    rng = random.Random(0)
    for i in range(40):
        dtype = rng.choice(["float16", "bfloat16", "float32"])
        prob = GemmProblem(m=rng.randint(1, 2 ** rng.randint(4, 15)), n=rng.randint(1, 2 ** rng.randint(4, 15)),
                           k=rng.randint(1, 2 ** rng.randint(4, 15)), dtype=dtype, allow_tf32=rng.random() < 0.5)
        configs = pt.default_configs(dtype)
        want = [c for c, _ in pt.rank(prob, top_k=5, screened=True)]
        assert [c for c, _ in po.rank(prob, top_k=5, screened=True)] == want, prob
        seen = pt.domain.raised("gemm", prob)  # what the heads see (perfmodel.domain)
        x = bundle.encoders["gemm"].encode_cross(problems_tensor([seen]), configs_tensor(configs))
        z, g = head_outputs(bundle.heads["gemm"], x)
        s = head_outputs(bundle.heads[bundle.screen_name], x)[0]
        lead = lead_outputs(bundle.heads["gemm"], x) if bundle.lead_keep else None
        idx, log_ms = rank_rows(z, g, s, bundle.screen_keep, 5, lead, bundle.lead_keep)
        assert [configs[i] for i in idx] == want, prob
        roof = pt.roofline_ms([prob])[0]
        np.testing.assert_allclose(np.maximum(np.exp(log_ms), roof), [t for _, t in pt.rank(prob, top_k=5, screened=True)],
                                   rtol=1e-4)
        if i % 4 == 0:
            idx, log_ms = rank_rows(z, g, None, bundle.screen_keep, 5)
            for p in (pt, po):
                got = p.rank(prob, top_k=5)
                assert [c for c, _ in got] == [configs[j] for j in idx], prob
                np.testing.assert_allclose([t for _, t in got], np.maximum(np.exp(log_ms), roof), rtol=1e-4)


def test_onnx_ranking_graph_problem_stage_is_lean(shipped) -> None:
    """The per-call (problem) stage of the shipped ranking graph: onnxruntime spends ~1-2 us per node on
    the small tensors of one problem, so the traced rule keeps its sizes constant where it can -- no
    sign-corrected floor division (Where), no expanded overhead (Expand), TopKs of the constant keep,
    -1 reshapes instead of Shape/Gather/Concat size arithmetic, each problem's kept rows gathered in
    place (no flat row indices), the screen's first layer one Gemm (229 nodes before, 175 after, of which
    ~20 gather the cross columns computed per distinct tile four: test_cross_parts_by_tile). The lead
    (lead_keep) adds ~20: its member's chain and floor, its pick, the picked rows' features gathered
    from those it scored (not encoded again)."""
    import collections

    import onnx

    _, po = shipped
    graph = onnx.load_from_string(po._run.rank_session.problem_graph).graph
    ops = collections.Counter(n.op_type for n in graph.node)
    assert ops["Where"] == 0 and ops["Expand"] == 0 and ops["Shape"] == 0 and ops["Range"] == 0, ops
    assert len(graph.node) <= (200 if po.lead_keep else 180), len(graph.node)


def test_cross_parts_by_tile() -> None:
    """The ONNX graph's cross columns, computed once per distinct (block_m, block_n, block_k, group_m) and
    gathered to the configs, are the encoder's bit for bit; every config its own group when the four are
    no small non-negative integers (no exact key)."""
    from perfmodel import artifact, onnx_export
    from perfmodel.configs import pruned_space, stratified_sample
    from perfmodel.devices import get_spec

    spec = get_spec("h100-sxm")
    enc = artifact.FeatureEncoder(spec, "gemm")
    rng = np.random.default_rng(0)
    dims = np.exp(rng.uniform(0, np.log(20000), size=(20, 3))).astype(int) + 1
    for dtype in ("float16", "float32"):
        probs = problems_tensor([GemmProblem(m=int(a), n=int(b), k=int(c), dtype=dtype) for a, b, c in dims])
        space = pruned_space(dtype, spec)
        odd = configs_tensor(space[:40]).clone()
        odd[::3, 0] += 0.5                                  # not integers: no dedup
        big = configs_tensor(space[:40]).clone()
        big[::5, 1] = 16384.0                               # past the exact key: no dedup
        for ct in (configs_tensor(space), configs_tensor(stratified_sample(space, 368, 0)), odd, big):
            part = enc.config_part(ct)
            want = enc.cross_parts(probs, ct, part)
            got = onnx_export._cross_parts_by_tile(enc, probs, ct, *part)
            assert all(torch.equal(w, g) for w, g in zip(want, got))
            first, inverse = onnx_export._distinct_tiles(ct)
            assert torch.equal(ct[first][inverse][:, :4], ct[:, :4])
            if ct is odd or ct is big:
                assert len(first) == len(ct)
            else:
                assert len(first) < len(ct) / 2
