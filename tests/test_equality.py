"""The shipped folders serve what they served when tests/fixtures/shipped_outputs.json was recorded (python -m
tests._equality record, on the code before the "one house" redesign): every prediction, ranking, call and pad
decision of tests/_equality.py's fixed problems, both models, both backends, every kernel mode and device.
Portable comparison (tests/_equality.py compare(exact=False)): floats within 1e-5 relative, each pick equal
unless the values deciding it tie within that. One class of change is expected since the recording: the runnable
rule fitted to Triton's own shared-memory count (issue 49; perfmodel/configs.py runnable_for, measured by
benchmarks/studies/runnable_rule.py) admits configs the old per-config formula called unrunnable, so a recorded
`inf` may now be a time -- accepted only where the new rule admits that config for that problem and the old formula
did not (_admitted_since_recording). The four `h200/*/inductor` entries were added when models/h200 got its inductor
head (`build --only gemm_inductor`), recorded on this project's CI-class CPU; every entry recorded before was
compared unchanged then (kernel="autotune" serves as it did). Likewise the four `h200/*/tutorial` entries, added
when models/h200 got its tutorial head (`build --only gemm_tutorial`): every earlier entry compared unchanged."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests._equality import compare, snapshot

FIXTURE = Path(__file__).parent / "fixtures" / "shipped_outputs.json"
_INF_TO_TIME = re.compile(r"^/[\w-]+/([\w-]+)/\w+/\w+/mm\[(\d+)\]/predict_given\[(\d+)\]: 'inf' != '0x[0-9a-fA-Fp.+-]+'$")


def _admitted_since_recording(diff: str) -> bool:
    """diff is a recorded inf that is now a time, for a config the per-problem rule runs and the old formula did not."""
    from perfmodel.configs import fits, inductor_default_configs
    from perfmodel.devices import get_spec
    from tests._equality import _problems

    m = _INF_TO_TIME.match(diff)
    if not m:
        return False
    prob = _problems()[0][int(m.group(2))]
    cfg = list(inductor_default_configs())[int(m.group(3))]
    spec = get_spec(m.group(1))
    return fits(cfg, prob.dtype, spec, prob) and not fits(cfg, prob.dtype, spec)


@pytest.mark.slow  # 8 predictors over every recorded call: ~55 s of the default run (`-m slow`, .ci/run's own step)
def test_shipped_folders_serve_as_recorded() -> None:
    want = json.loads(FIXTURE.read_text())
    got = snapshot()
    assert sorted(got) == sorted(want)
    diffs = [d for d in compare(want, got, exact=False) if not _admitted_since_recording(d)]
    assert not diffs, "\n".join(diffs[:20])


def test_only_what_the_rule_admits_is_excused():
    """_admitted_since_recording is not a blanket pass: another path, a time turned inf, or a config the old formula
    already ran is not excused."""
    ok = "/h100/h100-sxm/torch/autotune/mm[7]/predict_given[19]: 'inf' != '0x1.a4676b664ce6bp-4'"
    assert _admitted_since_recording(ok)
    assert not _admitted_since_recording(ok.replace("predict_given", "rank_given"))
    assert not _admitted_since_recording("/h100/h100-sxm/torch/autotune/mm[7]/predict_given[19]: "
                                         "'0x1.a4676b664ce6bp-4' != 'inf'")
    assert not _admitted_since_recording(ok.replace("predict_given[19]", "predict_given[0]"))


def test_the_portable_comparison_catches_a_change() -> None:
    """The comparison is not vacuous: a time moved by 1e-4, a swapped pick and a flipped call are found."""
    want = json.loads(FIXTURE.read_text())
    key = "h100/h100-sxm/torch/autotune"
    one = want[key]["mm"][0]
    moved = json.loads(json.dumps(one))
    moved["rank"]["ms"][0] = (float.fromhex(moved["rank"]["ms"][0]) * 1.0001).hex()
    moved["candidates"]["prefer_cublas"] = not moved["candidates"]["prefer_cublas"]
    moved["rank_given"]["configs"][0], moved["rank_given"]["configs"][-1] = (moved["rank_given"]["configs"][-1],
                                                                           moved["rank_given"]["configs"][0])
    diffs = compare(one, moved, exact=False)
    assert any("rank/ms[0]" in d for d in diffs) and any("prefer_cublas" in d for d in diffs)
    assert any("rank_given/configs" in d for d in diffs)
    assert compare(one, json.loads(json.dumps(one)), exact=False) == []
