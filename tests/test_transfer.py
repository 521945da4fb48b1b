"""benchmarks/studies/transfer.py --quick on SYNTHETIC datasets of two devices (tests/_synthetic.py: formula
timings in the real shard format, written under tmp_path): the table's structure and the learning
curve's bookkeeping, not its numbers (a few batches per fit)."""
from __future__ import annotations

import json

import pytest

from tests._synthetic import write_synthetic_dataset, write_synthetic_model


@pytest.mark.slow
def test_transfer_quick(tmp_path, isolated):  # isolated (conftest): restores torch's determinism flag after Lightning
    from benchmarks.studies import transfer

    base = write_synthetic_dataset(tmp_path / "h100", device="h100-sxm", n_problems=40)
    new = write_synthetic_dataset(tmp_path / "h200", device="h200", n_problems=40)
    shipped = write_synthetic_model(tmp_path / "shipped", onnx=False)
    out = tmp_path / "transfer.json"
    assert transfer.main(["--base", str(base), "--new", str(new), "--shipped", str(shipped), "--quick",
                          "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert (res["base"]["device"], res["new"]["device"], res["quick"]) == ("h100-sxm", "h200", True)
    # the same problems on both devices: one split, the same shapes held out on both
    assert res["held_out"]["h200"] == res["held_out"]["h100-sxm"] > 0
    curve = res["learning_curve"]
    assert [c["fraction"] for c in curve] == [0.0, 0.1, 0.3, 1.0]
    n_train = [c["new_train_problems"] for c in curve]
    assert n_train[0] == 0 and n_train == sorted(n_train) and n_train[-1] > n_train[1]
    for c in curve:
        for side in ("new", "base"):
            assert 0 < c[side]["all/top1_eff"] <= 1 and c[side]["all/top1_eff"] <= c[side]["all/top5_eff"] <= 1
            assert c[side]["test_problems"] == res["held_out"][res[side]["device"]]
            assert c[side]["pad/total_vs_oracle"] >= 1
    only = res["models"]["base_only"]
    assert set(only) >= {"base", "new_as_served", "new_with_new_spec"}
    assert res["models"]["shipped"]["trained_on"] == "h100-sxm" and res["notes"]
    md = out.with_suffix(".md").read_text()
    assert "QUICK" in md and "| joint, 30% of h200 training problems" in md and "| h100-sxm-only |" in md
    assert "--quick" in res["command"] and str(tmp_path) not in res["command"]


def test_average_over_seeds():
    # made-up results of two seeds (synthetic numbers, only the averaging is tested)
    from benchmarks.studies import transfer

    def result(seed: int, top1: float, n_train: int) -> dict:
        point = {"fraction": 1.0, "new_train_problems": n_train, "new": {"all/top1_eff": top1},
                 "base": {"all/top1_eff": top1 - 0.01}}
        return {"seed": seed, "quick": False, "seconds": 10.0, "models": {"base_only": {"base": {"all/top1_eff": top1}}},
                "learning_curve": [point], "notes": ["a note"]}

    avg = transfer.average([result(0, 0.90, 700), result(1, 0.96, 710)])
    assert avg["seeds"] == [0, 1] and avg["seconds"] == 20.0 and avg["notes"] == ["a note"]
    assert avg["learning_curve"][0]["new"]["all/top1_eff"] == pytest.approx(0.93)
    assert avg["learning_curve"][0]["new_train_problems"] == pytest.approx(705)
    assert avg["models"]["base_only"]["base"]["all/top1_eff"] == pytest.approx(0.93)
    assert avg["spread"] == [pytest.approx(0.06)] and avg["quick"] is False
    assert avg["per_seed"][1]["new_all_top1"] == [0.96]
