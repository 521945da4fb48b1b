"""benchmarks/studies/bmm_sure_gain.py, benchmarks/studies/bmm_pad_rule.py and benchmarks/studies/paired_heldout.py on SYNTHETIC
folders (random-weight models, tests/_synthetic.py data): what each script computes must hold whatever the
model -- every ratio against the faster of the alternatives is >= 1, the sure share falls as the gain rises, a
folder against itself differs nowhere."""
from __future__ import annotations

import numpy as np
import pytest

from perfmodel.train.bmm_head import BmmHeadSettings
from perfmodel.train.refit import refit_bmm
from tests._scripts import benchmark_script
from tests._synthetic import write_synthetic_bmm, write_synthetic_dataset, write_synthetic_model


@pytest.fixture(scope="module")
def bmm_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("bmm-rules")
    model = write_synthetic_model(root / "m", hidden=(16, 16))
    data = write_synthetic_bmm(root / "data", n_problems=48)
    refit_bmm(BmmHeadSettings(model=model, data=data, hidden=(16, 16), members=1, epochs=5, call_members=1,
                              call_epochs=20), log=lambda *a: None)
    return model, data


def test_the_sure_gain_table(bmm_folders):
    sg = benchmark_script("studies.bmm_sure_gain")
    r = sg.figures(*bmm_folders)
    assert set(r["gains"]) == {str(g) for g in sg.GAINS}
    for split in ("train", "val", "test"):
        sure = [r["gains"][str(g)][split]["sure"] for g in sg.GAINS]
        assert sure == sorted(sure, reverse=True)  # a higher gain is sure of fewer problems
        for g in sg.GAINS:
            row = r["gains"][str(g)][split]
            assert row["sure"] <= r["problems"][split]
            if row["sure"]:
                # alone vs the faster of it and aten::bmm (a geomean's rounding may pass the worst by an ulp)
                assert 1.0 <= row["geomean"] <= row["worst"] * (1 + 1e-9)
    assert r["chosen_on_val"] is None or r["chosen_on_val"] in sg.GAINS


def test_the_pad_rule_table(bmm_folders):
    pr = benchmark_script("studies.bmm_pad_rule")
    t, pad_ms = pr.padded_rows(bmm_folders[1])
    assert np.isfinite(pad_ms).sum() == len(t.problems)  # the synthetic data times every problem padded
    r = pr.figures(*bmm_folders)
    assert r["problems"] == len(t.problems)
    for name, s in r["splits"].items():
        for rule in ("inductor_exact_benchmark", "rule", "never_pad"):
            assert 1.0 <= s[rule]["geomean"] <= s[rule]["worst"] * (1 + 1e-9)  # against the faster of the two
        assert 0.0 <= s["left_unpadded_frac"] <= 1.0
        assert s["overruled_rightly"] <= s["rule_overrules_inductor"] <= s["inductor_pads"]


def test_a_folder_against_itself_differs_nowhere(tmp_path):
    ph = benchmark_script("studies.paired_heldout")
    model = write_synthetic_model(tmp_path / "m", hidden=(16,))
    data = write_synthetic_dataset(tmp_path / "d", n_problems=96)
    r = ph.compare(model, model, data, draws=50)
    assert r["groups"]
    for g in r["groups"].values():
        assert g["a"] == g["b"] and g["diff_ci95"] == [0.0, 0.0] and g["problems_differing"] == 0
