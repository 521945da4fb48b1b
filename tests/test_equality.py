"""The shipped folders serve what they served when tests/fixtures/shipped_outputs.json was recorded (python -m
tests._equality record, on the code before the "one house" redesign): every prediction, ranking, call and pad
decision of tests/_equality.py's fixed problems, both models, both backends, every kernel mode and device.
Portable comparison (tests/_equality.py compare(exact=False)): floats within 1e-5 relative, each pick equal
unless the values deciding it tie within that."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._equality import compare, snapshot

FIXTURE = Path(__file__).parent / "fixtures" / "shipped_outputs.json"


@pytest.mark.slow  # 8 predictors over every recorded call: ~55 s of the default run (`-m slow`, .ci/run's own step)
def test_shipped_folders_serve_as_recorded() -> None:
    want = json.loads(FIXTURE.read_text())
    got = snapshot()
    assert sorted(got) == sorted(want)
    diffs = compare(want, got, exact=False)
    assert not diffs, "\n".join(diffs[:20])


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
