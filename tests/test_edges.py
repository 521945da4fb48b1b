"""The edges of issue 47, item 5: each bad path, metadata value, file or command is refused with one line naming
the field (API: ArtifactError / ValueError; CLI: exit 2, no traceback), a written folder follows the umask, a
recipe build records the data as the recipe gave it, export-onnx writes only where told, and the card's title
and figures say what the folder is. Folders are copies of the shipped models/h100 (its real weights), edited."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from perfmodel import artifact
from perfmodel.artifact import ArtifactError
from perfmodel.cli import main

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "models" / "h100"


def _run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    try:
        rc = main(list(argv))
    except SystemExit as exc:  # argparse's own errors exit
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def _one_line(err: str, command: str) -> str:
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"perfmodel {command}: error: "), err
    return err


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A copy of the shipped models/h100 to damage."""
    dst = tmp_path / "m"
    shutil.copytree(SHIPPED, dst)
    return dst


def _edit(folder: Path, edit) -> None:
    meta = json.loads((folder / artifact.METADATA).read_text())
    edit(meta)
    (folder / artifact.METADATA).write_text(json.dumps(meta))  # NaN written as JSON's NaN, which json reads back


# ------------------------------------------------------------------------------------ a path the OS refuses
def test_a_model_path_with_a_300_character_component(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from perfmodel import Predictor

    long = tmp_path / ("a" * 300)  # over every common file system's 255-byte name limit: ENAMETOOLONG
    with pytest.raises(ValueError, match=r"^path_or_uri: cannot read .*File name too long"):
        Predictor.load(long)
    with pytest.raises(ValueError, match=r"^path_or_uri: "):
        artifact.load(long)
    rc, _, err = _run(capsys, "rank", "--m", "64", "--n", "64", "--k", "64", "--model", str(long))
    assert rc == 2 and "path_or_uri" in _one_line(err, "rank")
    rc, _, err = _run(capsys, "export-onnx", "--model", str(long), "--out", str(tmp_path / "x.onnx"))
    assert rc == 2 and "path_or_uri" in _one_line(err, "export-onnx") and not (tmp_path / "x.onnx").exists()


# ------------------------------------------------------------------------------------ metadata values
def _set(path: str, value):
    """An edit setting the metadata field at a dotted path (device_spec.sm_count) to value."""
    *parents, last = path.split(".")

    def edit(meta: dict) -> None:
        d = meta
        for p in parents:
            d = d[p]
        d[last] = value

    return edit


@pytest.mark.parametrize("field, value", [
    ("pad_threshold", float("nan")),
    ("pad_threshold", -1),
    ("pad_threshold", 0),
    ("pad_threshold", "1.0"),
    ("learned_overhead_ms", -1),
    ("heads.gemm.mlp.init_overhead_ms", -1),  # the overhead floor starts at its log: was "math domain error"
    ("device_spec.sm_count", -5),             # was blamed on head 'bmm'
    ("device_spec.sm_count", 13.5),
    ("device_specs.h100-sxm.dram_bw_gbs", float("inf")),
    ("device_spec.flop_per_sm_clk.tf32", 0),
    ("heads.student.mlp.hidden", [64, -64]),
    ("screen_keep", 0),
    ("weights_sha256", "not a checksum"),
])
def test_a_bad_metadata_value_is_refused_naming_the_field(folder: Path, capsys: pytest.CaptureFixture, field: str,
                                                          value) -> None:
    from perfmodel import Predictor

    _edit(folder, _set(field, value))
    named = field.replace("heads.student.mlp.hidden", "heads.student.mlp.hidden[1]")
    with pytest.raises(ArtifactError, match=rf"metadata\.json: {re.escape(named)}: expected") as exc:
        artifact.load(folder)
    assert "head '" not in str(exc.value) and "math domain" not in str(exc.value)
    with pytest.raises(ArtifactError, match=re.escape(named)):
        Predictor.load(folder, backend="torch")
    rc, _, err = _run(capsys, "pad", "--m", "4095", "--k", "4097", "--n", "1000", "--model", str(folder))
    assert rc == 2 and named in _one_line(err, "pad")


def test_the_shipped_metadata_passes_the_checks() -> None:
    """Neither shipped folder trips a check (each field in range), so the checks refuse only what is out of it."""
    from perfmodel.validation import check_metadata

    for name in ("h100", "h200"):
        meta = json.loads((REPO / "models" / name / artifact.METADATA).read_text())
        check_metadata(meta)
        assert meta["pad_threshold"] == 1.0 and meta["device_spec"]["sm_count"] == 132


@pytest.mark.parametrize("depth", [40, 100_000])
def test_deeply_nested_metadata_is_refused_cleanly(folder: Path, capsys: pytest.CaptureFixture, depth: int) -> None:
    """40 levels parse but pass the depth limit; 100,000 exceed the JSON reader's recursion: both an ArtifactError,
    never a RecursionError."""
    meta = (folder / artifact.METADATA).read_text()
    nested = "[" * depth + "]" * depth
    (folder / artifact.METADATA).write_text(meta[:-1].rstrip() + f', "extra": {nested}}}')
    with pytest.raises(ArtifactError, match="nested|recursion") as exc:
        artifact.load(folder)
    assert not isinstance(exc.value, RecursionError)
    rc, _, err = _run(capsys, "rank", "--m", "64", "--n", "64", "--k", "64", "--model", str(folder))
    assert rc == 2 and "metadata.json" in _one_line(err, "rank")


# ------------------------------------------------------------------------------------ damaged files
def test_an_empty_onnx_file_is_called_empty(folder: Path, capsys: pytest.CaptureFixture) -> None:
    from perfmodel import Predictor

    (folder / artifact.ONNX).write_bytes(b"")
    for backend in ("onnx", None):  # None: the file is there, so the onnx backend is chosen, and refuses it
        with pytest.raises(ArtifactError, match=r"model\.onnx: the file is empty \(0 bytes") as exc:
            Predictor.load(folder, backend=backend)
        assert "head" not in str(exc.value)
    from perfmodel import GemmProblem

    # the weights themselves still serve with the torch backend
    assert Predictor.load(folder, backend="torch").predict(GemmProblem(m=64, n=64, k=64)).min() > 0
    rc, _, err = _run(capsys, "rank", "--m", "64", "--n", "64", "--k", "64", "--model", str(folder))
    assert rc == 2 and "empty" in _one_line(err, "rank")


def test_weights_without_a_checksum_are_refused(folder: Path) -> None:
    """Without weights_sha256 a flipped byte in the weights would load silently: such a folder is refused (perfmodel
    writes the checksum with every folder), the message saying how to vouch for the file."""
    _edit(folder, lambda m: m.pop("weights_sha256"))
    weights = folder / artifact.WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0xFF  # a byte of the last tensor's data: the file still parses
    weights.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"weights_sha256: missing, so the weights' integrity cannot be checked"):
        artifact.load(folder)
    # vouched for (the checksum of the flipped file added), it loads: the refusal was the missing field alone
    _edit(folder, lambda m: m.update(weights_sha256=artifact.sha256_file(weights)))
    assert artifact.load(folder).heads["gemm"]
    # and with the checksum of the good file, the flip is caught
    _edit(folder, lambda m: m.update(weights_sha256=artifact.sha256_file(SHIPPED / artifact.WEIGHTS)))
    with pytest.raises(ArtifactError, match="checksum"):
        artifact.load(folder)


def test_data_info_of_an_empty_folder_fails(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not a shard")
    for name in ("empty", "other"):
        rc, out, err = _run(capsys, "data", "info", str(tmp_path / name))
        assert rc == 2 and out == "" and "holds no dataset shard files" in _one_line(err, "data")
    from tests._synthetic import write_synthetic_dataset

    write_synthetic_dataset(tmp_path / "data", n_problems=4, configs=2, n_pads=4)  # SYNTHETIC rows: a dataset
    rc, out, err = _run(capsys, "data", "info", str(tmp_path / "data"), "--json")
    assert rc == 0 and json.loads(out)["gemm_problems"] == 4


# ------------------------------------------------------------------------------------ modes as the umask says
@pytest.mark.parametrize("mask", [0o027, 0o002])
def test_a_written_folder_follows_the_umask(tmp_path: Path, mask: int) -> None:
    """train.folder.write_model_folder (every build, train and refit writes through it) and artifact.save: the
    folder and its files are what a plain mkdir and open give under the umask, not mkdtemp's 0o700 or the
    safetensors writer's 0o600. (A small SYNTHETIC bundle: the modes, not the weights, are under test.)"""
    from perfmodel.train.folder import write_model_folder
    from tests._synthetic import make_synthetic_bundle

    bundle = make_synthetic_bundle(hidden=(16, 16), with_pad=False, with_cublas=False, screen=None)
    old = os.umask(mask)
    try:
        out = write_model_folder(bundle, dict(bundle.metadata), tmp_path / "out")
        saved = artifact.save(bundle, tmp_path / "saved")
    finally:
        os.umask(old)
    assert (out.stat().st_mode & 0o777) == 0o777 & ~mask
    files = sorted(out.iterdir())
    assert {p.name for p in files} >= {artifact.WEIGHTS, artifact.METADATA, artifact.ONNX}
    for p in files + [saved / artifact.WEIGHTS, saved / artifact.METADATA]:
        assert (p.stat().st_mode & 0o777) == 0o666 & ~mask, (p.name, oct(p.stat().st_mode))


# ------------------------------------------------------------------------------------ export-onnx writes where told
def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_export_onnx_without_an_output_refuses(capsys: pytest.CaptureFixture) -> None:
    """No --out and no --model: refused, and the shipped folder (on a wheel install, inside site-packages) is as it
    was; --screen-keep without --model likewise (it rewrites a folder's metadata)."""
    before = _digest(SHIPPED)
    rc, _, err = _run(capsys, "export-onnx")
    assert rc == 2 and "--out" in _one_line(err, "export-onnx")
    rc, _, err = _run(capsys, "export-onnx", "--screen-keep", "8", "--out", str(SHIPPED / artifact.ONNX))
    assert rc == 2 and "--model" in _one_line(err, "export-onnx")
    assert _digest(SHIPPED) == before


@pytest.mark.slow
def test_export_onnx_of_the_shipped_model_writes_only_out(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--out alone reads the shipped folder and writes that one file; the folder and its record unchanged."""
    before = _digest(SHIPPED)
    rc, out, err = _run(capsys, "export-onnx", "--out", str(tmp_path / "x.onnx"))
    assert rc == 0, err
    assert out.strip() == f"wrote {tmp_path / 'x.onnx'}" and (tmp_path / "x.onnx").stat().st_size > 0
    assert _digest(SHIPPED) == before


# ------------------------------------------------------------------------------------ the card and the record
def test_the_card_title_names_the_folder_s_device() -> None:
    """models/h200 (the H100's and the H200's data, the H100 its default device) is the H200 model: the title comes
    from the folder its recipe writes; a model of one device is titled for it; the shipped cards say the same."""
    from perfmodel.train.folder import card_title, model_card

    for name, title in (("h100", "perfmodel H100 model"), ("h200", "perfmodel H200 model")):
        meta = json.loads((REPO / "models" / name / artifact.METADATA).read_text())
        assert card_title(meta) == title
        assert model_card(meta).splitlines()[0] == f"# {title}"
        assert (REPO / "models" / name / "MODEL_CARD.md").read_text().splitlines()[0] == f"# {title}"
    meta = json.loads((REPO / "models" / "h200" / artifact.METADATA).read_text())
    meta["build"] = {**meta["build"], "recipe": {"path": "r.toml", "text": "[build]\nout = 'elsewhere'\n"}}
    assert card_title(meta) == "perfmodel H100 + H200 model"  # a folder of no one device: both named
    meta = json.loads((REPO / "models" / "h100" / artifact.METADATA).read_text())
    meta["device_spec"] = {**meta["device_spec"], "name": "h100-pcie"}
    meta["devices"] = ["h100-pcie"]
    assert card_title(meta) == "perfmodel H100 PCIe model"


def test_the_card_never_prints_nan() -> None:
    """A small build's figures: a gemm head of one member (no spread around its members' mean), a metric of no test
    problem (NaN), one not recorded: the card writes "-" or leaves the clause out, never "nan"."""
    from perfmodel.train.folder import model_card

    meta = json.loads((REPO / "models" / "h100" / artifact.METADATA).read_text())
    meta["student_metrics"].pop("gemm/member_spread_median", None)
    meta["pad_metrics"]["pad/float32/total_vs_oracle"] = float("nan")
    meta["metrics"]["fp32_all/top1_eff"] = float("nan")
    meta["bmm_metrics"].pop("test/call/accuracy_times", None)
    meta["bmm_metrics"]["test/tf32/top1_eff"] = float("nan")
    card = model_card(meta)
    assert "nan" not in card.lower().replace("nanoseconds", "")
    assert "around their mean" not in card and "- pad/float32/total_vs_oracle: -" in card


def test_a_slice_build_records_the_recipe_s_folders() -> None:
    """train.recipe.as_given: every path of a slice the build read (a temporary folder, gone after the build) is
    recorded as the recipe's folder, in the form each field records paths in; a hash record of the slice gets its
    "slice"; other values and a folder read whole are left alone."""
    from perfmodel.train.folder import dataset_path, setting_value
    from perfmodel.train.recipe import as_given

    given = (Path("data/h100"), Path("data/h200"))
    read = (Path("/tmp/perfmodel-build-x/0/h100"), Path("data/h200"))  # the first sliced, the second whole
    data = [{"path": "data/h100", "sha256": "a" * 64, "files": 3, "slice": {"problems": 200, "seed": 0}},
            {"path": "data/h200", "sha256": "b" * 64, "files": 2}]
    tmp_rel, tmp_abs = dataset_path(read[0]), setting_value(read[0])
    meta = {"settings": {"data": [tmp_abs, "data/h200"], "epochs": 2},
            "bmm_settings": {"data": [{"path": tmp_rel, "sha256": "c" * 64}, {"path": "data/h200", "sha256": "d" * 64}]},
            "datasets": [{"path": tmp_rel, "sha256": "e" * 64}], "note": "/tmp/perfmodel-build-x/0/h100/extra",
            "build": {"steps": [{"step": "train", "settings": {"data": [tmp_abs, "data/h200"]}}]}}
    out = as_given(meta, given, read, data)
    assert out["settings"] == {"data": [setting_value(given[0]), "data/h200"], "epochs": 2}
    assert out["build"]["steps"][0]["settings"]["data"] == [setting_value(given[0]), "data/h200"]
    assert out["bmm_settings"]["data"] == [{"path": dataset_path(given[0]), "sha256": "c" * 64,
                                            "slice": {"problems": 200, "seed": 0}},
                                           {"path": "data/h200", "sha256": "d" * 64}]
    assert out["datasets"][0]["path"] == dataset_path(given[0])
    assert out["note"] == meta["note"]  # only whole values that are the path
    assert "perfmodel-build-" not in json.dumps({k: v for k, v in out.items() if k != "note"})
    assert as_given(meta, given, given, data) == meta  # nothing sliced: nothing changed
