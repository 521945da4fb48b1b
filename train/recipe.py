"""`perfmodel build --recipe recipes/h100.toml`: from the data folders to the finished model folder in one
run, as a recipe (a TOML file) says.

The steps, in the order the heads depend on each other:

1. data     -- the dataset folders (a slice of them, for a small model), the sha256 of every shard file the
               build reads (bmm shards only where a [bmm] step reads them);
2. train    -- the gemm head (with [train].config_net, the config network: both kernel modes), the problem
               network's cuBLAS output alone (not with a [problem] step, which fits the whole network) and the
               pad head, the PR 156851 baseline (train/pipeline.py fit_heads; screen_keep and lead_keep are
               set here: the inductor figures depend on them);
3. distill  -- the student head, from the gemm head ([student].screens: it screens the ranking too: one speed
               head); then, for a config network, its inductor mode's figures;
   inductor -- the inductor head (train/inductor_head.py): for a model whose gemm head is not a config network,
               its inductor mode fitted beside it on every folder with static rows;
4. problem  -- the problem network (train/problem_head.py): torch.mm's time and the cuBLAS-or-Triton calls (with
               the inductor mode, call_static too);
   bmm      -- the bmm heads (Inductor's bmm template and aten::bmm), on every data folder's bmm rows (each
               encoded for its device; the first folder's split by shape holds a shape out on every device);
               skipped, with a message, where the first folder has none;
   grouped  -- the grouped-GEMM head (train/grouped_head.py), on the first data folder with grouped rows;
5. evaluate -- the held-out evaluation with every head in place (the cuBLAS figures use the call output);
6. write    -- weights, metadata with the build record, the ONNX export, the model card; atomically: a
               failed build leaves the previous folder in place.

Steps 3 and 4 are one table (HEAD_STEPS) run in one loop. `perfmodel build --recipe R --only HEAD` runs one
registered head's step (perfmodel/heads/: HeadSpec.step; ONLY_STEPS) on the built folder (run_only).

The recipe's sections: [build] (data, out, seed, threads, slice_problems, mlflow), [train] (TrainSettings),
[student] (DistillSettings), [problem] (ProblemHeadSettings), [bmm] (BmmHeadSettings), [grouped]
(GroupedSettings), [inductor] (InductorSettings); a head section left out is a head the model does not have. The
older layout's [static] and [call] sections (heads of perfmodel/heads/legacy.py) are refused, naming what replaces
them. Paths are relative to the working directory. The metadata's `build` record keeps the recipe's text, the
command, the code commit, the data hashes, the threads, the seed and each step with its settings and wall time
(train/folder.py).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import tempfile
import time
import typing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from perfmodel.artifact import code_commit

from . import tracking
from .bmm_head import BmmHeadSettings
from .data import slice_dataset
from .distill import DistillSettings
from .grouped_head import GroupedSettings
from .inductor_head import InductorSettings
from .tutorial_head import TutorialSettings
from .folder import (SHARD_KINDS, data_sha256, dataset_path, setting_value, settings_record, step_record,
                     write_model_folder)
from .pipeline import (TrainData, TrainSettings, effective_lead_keep, evaluate_devices, fit_baselines, fit_heads,
                       load_data, model_metadata)
from .problem_head import ProblemHeadSettings
from .refit import add_student, bmm_step, inductor_figures_step, problem_step

# Recipe section -> its settings dataclass; the fields [build] sets for every step are not theirs to set.
SECTIONS = {"train": TrainSettings, "student": DistillSettings, "problem": ProblemHeadSettings, "bmm": BmmHeadSettings,
            "grouped": GroupedSettings, "inductor": InductorSettings, "tutorial": TutorialSettings}
# The sections of the older layout's heads (perfmodel/heads/legacy.py), refused with what replaces them.
OLDER_SECTIONS = {"static": "the config network serves kernel='inductor' ([train].config_net = true)",
                  "call": "the problem network's call outputs ([problem])"}
BUILD_KEYS = {"data": list, "out": str, "seed": int, "threads": int, "slice_problems": int, "mlflow": bool}
_SET_BY_BUILD = {"data", "out", "model", "seed", "threads", "command"}


@dataclass(frozen=True)
class Recipe:
    """A parsed recipe: [build]'s settings and each step's settings dataclass (None: no such head)."""
    path: Path
    text: str
    data: tuple[Path, ...]
    out: Path
    seed: int = 0
    threads: int = 0                 # torch CPU threads for the whole build (0: torch's default)
    slice_problems: int = 0          # > 0: a slice of this many GEMM problems of each folder (a small model)
    mlflow: bool = False             # track the build in MLflow (the [train] section's tracking settings)
    train: TrainSettings | None = None
    student: DistillSettings | None = None
    problem: ProblemHeadSettings | None = None
    bmm: BmmHeadSettings | None = None
    grouped: GroupedSettings | None = None
    inductor: InductorSettings | None = None
    tutorial: TutorialSettings | None = None


def _tomllib():
    try:
        import tomllib  # Python >= 3.11
    except ModuleNotFoundError:  # Python 3.10: the tomli backport, where installed
        try:
            import tomli as tomllib
        except ModuleNotFoundError as exc:
            raise RuntimeError("recipe: reading TOML needs Python >= 3.11 or the tomli package") from exc
    return tomllib


def load_recipe(path: Path) -> Recipe:
    """The recipe at path; ValueError naming the section and key of anything it does not know or cannot use."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        doc = _tomllib().loads(text)
    except ValueError as exc:  # tomllib.TOMLDecodeError
        raise ValueError(f"recipe: {path} is not valid TOML: {exc}") from exc
    older = sorted(set(doc) & set(OLDER_SECTIONS))
    if older:
        raise ValueError(f"recipe [{older[0]}]: a head of an older layout, no longer built; {OLDER_SECTIONS[older[0]]}")
    unknown = set(doc) - set(SECTIONS) - {"build"}
    if unknown:
        raise ValueError(f"recipe: unknown section [{sorted(unknown)[0]}] (known: build, {', '.join(SECTIONS)})")
    build = doc.get("build", {})
    for key, value in build.items():
        if key not in BUILD_KEYS:
            raise ValueError(f"recipe [build].{key}: no such setting (known: {', '.join(BUILD_KEYS)})")
        if not isinstance(value, BUILD_KEYS[key]) or (BUILD_KEYS[key] is int and isinstance(value, bool)):
            raise ValueError(f"recipe [build].{key}: expected {BUILD_KEYS[key].__name__}, got {value!r}")
    if not build.get("data") or not build.get("out"):
        raise ValueError("recipe [build]: data (a list of dataset folders) and out (the model folder) are required")
    seed = build.get("seed", 0)
    common = {"data": tuple(Path(p) for p in build["data"]), "out": Path(build["out"]), "seed": seed}
    steps = {name: _section(doc, name, cls, seed) for name, cls in SECTIONS.items()}
    if steps["train"] is None:
        raise ValueError("recipe [train]: required (the gemm head)")
    steps["train"] = replace(steps["train"], data=common["data"], out=common["out"])
    return Recipe(path=path, text=text, threads=build.get("threads", 0), slice_problems=build.get("slice_problems", 0),
                  mlflow=build.get("mlflow", False), **common, **steps)


def _section(doc: dict[str, Any], name: str, cls: Any, seed: int) -> Any:
    """The settings dataclass of one section (None where the recipe has no such section): its keys typed by
    the dataclass's annotations, the build's seed."""
    if name not in doc:
        return None
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)} - _SET_BY_BUILD
    given = {}
    for key, value in doc[name].items():
        if key not in known:
            raise ValueError(f"recipe [{name}].{key}: no such setting"
                             + (" ([build] sets it)" if key in _SET_BY_BUILD else ""))
        given[key] = _typed(f"[{name}].{key}", hints[key], value)
    return cls(**given, seed=seed)


def _typed(where: str, hint: Any, value: Any) -> Any:
    """A TOML value as the field's annotation wants it (widths as a tuple, a path as Path); ValueError
    naming the key where it does not fit."""
    if hint == tuple[int, ...]:
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ValueError(f"recipe {where}: expected a list of widths, got {value!r}")
        return tuple(value)
    simple = {int: int, float: (int, float), bool: bool, str: str}
    want = simple.get(hint)
    if want is not None and (not isinstance(value, want) or (hint in (int, float) and isinstance(value, bool))):
        raise ValueError(f"recipe {where}: expected {hint.__name__}, got {value!r}")
    return float(value) if hint is float else value


def build_command(recipe: Recipe) -> str:
    """The one command that rebuilds the folder (the card's "Regenerate with"): the recipe alone. `--out`
    only chooses where a build is written (a candidate beside the shipped folder, then moved in place); the
    record keeps that folder as "out", relative to the working directory when inside it."""
    return f"perfmodel build --recipe {recipe.path.as_posix()}"


def run_build(path: Path, out: Path | None = None, log: Any = print) -> dict[str, Any]:
    """Build the model folder of the recipe at path (into out, default the recipe's). Returns the folder,
    the held-out figures and each step's wall time."""
    recipe = load_recipe(path)
    if recipe.mlflow and importlib.util.find_spec("mlflow") is None:
        raise RuntimeError("recipe [build].mlflow: tracking needs mlflow, not installed here (pip install "
                           "'perfmodel[train]'), or set mlflow = false")
    command = build_command(recipe)
    if out is not None:
        recipe = replace(recipe, out=Path(out), train=replace(recipe.train, out=Path(out)))
    if recipe.threads > 0:
        torch.set_num_threads(recipe.threads)
    with tempfile.TemporaryDirectory(prefix="perfmodel-build-") as tmp:
        folders, data_record, seconds = _prepare_data(recipe, Path(tmp))
        train = replace(recipe.train, data=folders, command=command)
        record = {"recipe": {"path": recipe.path.as_posix(), "text": recipe.text}, "command": command,
                  "out": setting_value(recipe.out),
                  "commit": code_commit(), "data": data_record, "threads": torch.get_num_threads(),
                  "seed": recipe.seed, "steps": [step_record("data", {"slice_problems": recipe.slice_problems,
                                                                       "kinds": list(SHARD_KINDS)}, seconds)]}
        if not recipe.mlflow:
            return _build(recipe, train, record, False, None, log)
        with tracking.mlflow_run(train.tracking_uri, train.experiment, "build") as (run, logger, _):
            res = _build(recipe, train, record, logger, run.info.run_id, log)
            _track(train, res, run.info.run_id)
            return res


# The build steps that `--only` runs on an existing folder (perfmodel/heads/: HeadSpec.step), each with the
# recipe's section for it: the step's fit on the folder's split, the folder rewritten atomically (train/refit.py).
# The train step is not among them: the heads fitted from the gemm head (the student, the problem network's calls)
# would no longer match it -- a new gemm or pad head is a new build.
ONLY_STEPS = ("student", "problem", "bmm", "grouped", "inductor", "tutorial")


def run_only(path: Path, heads: tuple[str, ...], out: Path | None = None, command: str = "",
             log: Any = print) -> dict[str, Any]:
    """`perfmodel build --recipe R --only HEAD ...`: fit the named registered heads into the existing folder (out,
    default the recipe's), each by its build step with the recipe's section, on the recipe's data (sliced as the
    build slices it) and the folder's split; each step appended to the folder's build record and the folder
    rewritten atomically (a failed fit leaves it in place). Returns each step's held-out figures."""
    from perfmodel.artifact import METADATA
    from perfmodel.heads import head_spec

    from . import refit
    from .inductor_head import refit_inductor
    from .tutorial_head import refit_tutorial

    recipe = load_recipe(path)
    folder = Path(out) if out is not None else recipe.out
    steps = list(dict.fromkeys(head_spec(h).step for h in heads))  # ValueError naming an unknown head
    for step in steps:
        if step not in ONLY_STEPS:
            raise ValueError(f"only: {', '.join(h for h in heads if head_spec(h).step == step)} is fitted by the "
                             f"{step} step, with the heads fitted from it; rebuild the folder (perfmodel build "
                             f"--recipe {recipe.path.as_posix()})")
        if getattr(recipe, step) is None:  # the step's defaults (recorded with the step, as every setting is)
            log(f"build --only: the recipe {recipe.path.as_posix()} has no [{step}] section: the step's defaults")
            recipe = replace(recipe, **{step: SECTIONS[step](seed=recipe.seed)})
    if not (folder / METADATA).is_file():
        raise FileNotFoundError(f"out: no model folder at {folder} to fit {', '.join(heads)} into "
                                "(build it first: perfmodel build --recipe)")
    if recipe.threads > 0:
        torch.set_num_threads(recipe.threads)
    def with_folder(fit: Any) -> Any:  # a step's refit of settings that name the folder and its data
        return lambda s, folders: fit(replace(s, model=folder, data=folders[0] if len(folders) == 1 else folders),
                                      log=log, command=command)

    fits = {"student": with_folder(refit.refit_student), "problem": with_folder(refit.refit_problem),
            "bmm": with_folder(refit.refit_bmm),
            "grouped": lambda s, folders: refit.refit_grouped(s, folder, folders, log=log, command=command),
            "inductor": lambda s, folders: refit_inductor(s, folder, folders, log=log, command=command),
            "tutorial": lambda s, folders: refit_tutorial(s, folder, folders, log=log, command=command)}
    command = command or f"{build_command(recipe)} --only {' --only '.join(heads)}"
    res = {}
    with tempfile.TemporaryDirectory(prefix="perfmodel-build-") as tmp:
        folders, data, _ = _prepare_data(recipe, Path(tmp))
        for step in steps:
            res[step] = fits[step](getattr(recipe, step), folders)
    if tuple(folders) != tuple(recipe.data):  # slices: the refits recorded their temporary folders, gone now
        _record_as_given(folder, recipe.data, folders, data)
    return {"out": str(folder), "steps": res}


def _record_as_given(folder: Path, given: tuple[Path, ...], read: tuple[Path, ...], data: list[dict[str, Any]]) -> None:
    """The folder's metadata (and its card, regenerated from it) with the paths of the slices a refit read recorded
    as the recipe's folders (as_given); each file written beside and renamed over the old one."""
    import json
    import os

    from perfmodel.artifact import METADATA

    from .folder import model_card

    meta = as_given(json.loads((folder / METADATA).read_text()), given, read, data)
    files = {METADATA: json.dumps(meta, indent=2, sort_keys=True)}
    if (folder / "MODEL_CARD.md").is_file() and ("training_command" in meta or "build" in meta) and "metrics" in meta:
        files["MODEL_CARD.md"] = model_card(meta)
    for name, text in files.items():
        tmp = folder / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, folder / name)


def reads_static(recipe: Recipe, i: int) -> bool:
    """Whether the build reads the gemm_static shards of its i-th data folder: a model with the inductor mode (the
    config network, or an [inductor] step) reads every folder's (its fit, and the problem network's call_static
    output), the bmm step's static rows the first folder's."""
    return bool(recipe.train.config_net or recipe.inductor is not None
                or (i == 0 and recipe.bmm is not None and recipe.bmm.static_rows))


def _prepare_data(recipe: Recipe, tmp: Path) -> tuple[tuple[Path, ...], list[dict[str, Any]], float]:
    """The folders the build reads (the recipe's, or slices of them in tmp) and the data record: each
    recipe folder's hash over every shard file the build reads (data_sha256: the bmm shards only with a [bmm]
    step, the grouped shards only with a [grouped] step, which alone read them, the gemm_static shards where
    reads_static), and the slice taken."""
    t0 = time.perf_counter()
    record, folders = [], []
    for i, folder in enumerate(recipe.data):
        if not folder.is_dir():
            raise FileNotFoundError(f"data: no dataset folder {folder} (recipe [build].data)")
        read = tuple(k for k in SHARD_KINDS if (k != "bmm" or recipe.bmm is not None)
                     and (k != "gemm_static" or reads_static(recipe, i))) \
            + (("grouped",) if recipe.grouped is not None else ())
        rec = data_sha256(folder, read)
        if recipe.slice_problems:
            # the slice keeps the folder's name (the device it stands for: train/data.py folder_name_device)
            folder = slice_dataset(folder, tmp / str(i) / folder.resolve().name, recipe.slice_problems,
                                   recipe.seed, SHARD_KINDS)
            rec["slice"] = {"problems": recipe.slice_problems, "seed": recipe.seed}
        record.append(rec)
        folders.append(folder)
    return tuple(folders), record, time.perf_counter() - t0


def _student(recipe: Recipe, train: TrainSettings, bundle: Any, d: TrainData, s: Any, log: Any) -> None:
    add_student(bundle, d.gemm, s, log, d.split, d.problem_device)
    if s.screens:  # the student screens: the lead (set by the train step, which had no screen) now fits
        bundle.metadata["lead_keep"] = effective_lead_keep(train, bundle.heads, bundle.screen_name)


def _inductor_figures(recipe: Recipe, train: TrainSettings, bundle: Any, d: TrainData, s: Any, log: Any) -> None:
    inductor_figures_step(bundle, d.datasets[0], d.split, log)  # through the screen and lead now set


def _splits(d: TrainData) -> list:
    """Each dataset's part of the run's split (by problem or by family)."""
    return [d.split[d.problem_device == ds.device] for ds in d.datasets]


def _problem(recipe: Recipe, train: TrainSettings, bundle: Any, d: TrainData, s: Any, log: Any) -> None:
    problem_step(bundle, d.datasets, s, log, _splits(d))


def _bmm(recipe: Recipe, train: TrainSettings, bundle: Any, d: TrainData, s: Any, log: Any) -> None:
    bmm_step(bundle, [ds.folder for ds in d.datasets], s, log)  # every device's folder (a slice may hold no bmm rows)


def _grouped(recipe: Recipe, train: TrainSettings, bundle: Any, d: TrainData, s: Any, log: Any) -> None:
    from .grouped_head import grouped_step
    from .refit import grouped_folder

    folder = grouped_folder([ds.folder for ds in d.datasets])
    if folder is None:
        log("grouped-head: skipped: no data folder has grouped rows (perfmodel gen grouped)")
        return
    grouped_step(bundle, folder, s, log)


def _inductor(recipe: Recipe, train: TrainSettings, bundle: Any, d: TrainData, s: Any, log: Any) -> None:
    from .inductor_head import inductor_step

    inductor_step(bundle, [ds.folder for ds in d.datasets], s, log, d.datasets)  # the folders as loaded once


def _tutorial(recipe: Recipe, train: TrainSettings, bundle: Any, d: TrainData, s: Any, log: Any) -> None:
    from .tutorial_head import tutorial_step

    tutorial_step(bundle, [ds.folder for ds in d.datasets], s, log, d.datasets)


def _wants_section(name: str) -> Any:
    """A step the recipe wants where it has the section `name`: its settings (None: no such step)."""
    return lambda recipe, bundle: getattr(recipe, name)


# The steps after the train step, in the order the heads depend on each other: (its name in the build record,
# wants(recipe, bundle) -> the step's settings, () for a step without any, None to skip it; the function that adds
# its heads to the bundle). A registered head's build step (perfmodel/heads/: HeadSpec.step) is one row here, one
# entry in SECTIONS, and, for `--only`, one in ONLY_STEPS. The config network's inductor-mode figures: a step of
# every build whose gemm head is one.
HEAD_STEPS = (("distill", _wants_section("student"), _student),
              ("inductor-figures", lambda recipe, bundle: () if bundle.config_net is not None else None, _inductor_figures),
              ("inductor-head", _wants_section("inductor"), _inductor),
              ("tutorial-head", _wants_section("tutorial"), _tutorial),
              ("problem-head", _wants_section("problem"), _problem), ("bmm-head", _wants_section("bmm"), _bmm),
              ("grouped-head", _wants_section("grouped"), _grouped))


def _build(recipe: Recipe, train: TrainSettings, record: dict[str, Any], logger: Any, run_id: str | None,
           log: Any) -> dict[str, Any]:
    """The steps after the data, in order, then the folder written with the record."""
    t_start = time.perf_counter()
    steps = record["steps"]

    def timed(name: str, settings: Any, fn: Any) -> Any:
        t0 = time.perf_counter()
        log(f"build: {name} ...")
        out = fn()
        steps.append(step_record(name, settings_record(settings) if settings is not None else {},
                                 time.perf_counter() - t0))
        return out

    torch.manual_seed(train.seed)
    d = timed("load", None, lambda: load_data(train))
    # torch.mm's time alone where no problem step fits the whole problem network
    bundle = timed("train", train, lambda: fit_heads(train, d, logger, cublas=recipe.problem is None))
    baselines = timed("baselines", None, lambda: fit_baselines(train, d, logger))
    for name, wants, fn in HEAD_STEPS:  # each step the recipe and the bundle want, with its settings
        s = wants(recipe, bundle)
        if s is not None:
            timed(name, s or None, lambda: fn(recipe, train, bundle, d, s, log))
    evaluation = timed("evaluate", None, lambda: evaluate_devices(bundle, d, train.seed, baselines))
    return _write(recipe, train, d, bundle, evaluation, record, run_id, time.perf_counter() - t_start)


# The metadata entries the head steps add to the bundle (their figures and settings), kept in the written folder
# beside model_metadata's: the student, the config network's figures, the problem network, the bmm, grouped and
# inductor heads, and which head screens.
HEAD_METADATA = ("student_", "static_", "call_", "cublas_head_", "problem_", "bmm_", "grouped_", "inductor_", "tutorial_",
                 "screen_head")


def head_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    """The entries of meta a head step added (HEAD_METADATA's prefixes)."""
    return {k: v for k, v in meta.items() if k.startswith(HEAD_METADATA)}


def _write(recipe: Recipe, train: TrainSettings, d: TrainData, bundle: Any, evaluation: dict, record: dict[str, Any],
           run_id: str | None, seconds: float) -> dict[str, Any]:
    """The model folder: model_metadata, the heads' own entries (HEAD_METADATA), the build record; written
    atomically, the write itself (ONNX export, card, load check) its last step."""
    added = head_metadata(bundle.metadata)
    meta = {**model_metadata(train, d, bundle, evaluation, settings_record(train), run_id, seconds), **added,
            "build": record}
    meta = as_given(meta, recipe.data, train.data, record["data"])

    def given(ds: dict[str, Any], rec: dict[str, Any]) -> dict[str, Any]:
        # the recipe's folder and the hash over every shard file of it (and the slice taken)
        return {**ds, "path": rec["path"], "sha256": rec["sha256"], **({"slice": rec["slice"]} if "slice" in rec else {})}

    meta["dataset"] = given(meta["dataset"], record["data"][0])
    if "datasets" in meta:  # a model of several devices: each one's
        meta["datasets"] = [given(ds, rec) for ds, rec in zip(meta["datasets"], record["data"])]
    out = write_model_folder(bundle, meta, train.out, record_step="write")
    return {"out": str(out), "metrics": evaluation["results"]["perfmodel"], "cublas": evaluation["cublas"],
            "pad": evaluation["pad"], "run_id": run_id,
            "steps": {s["step"]: s["seconds"] for s in bundle.metadata["build"]["steps"]}}


def as_given(meta: Any, given: tuple[Path, ...], read: tuple[Path, ...], data: list[dict[str, Any]]) -> Any:
    """meta with every path of a folder the build read in place of a recipe folder -- a slice, written in a
    temporary folder gone once the build ends -- recorded as that recipe folder, in the same form (the
    settings' paths, the datasets' and the bmm step's records); a record of such a folder's hash (a mapping with
    "path" and "sha256": the slice's hash) gets its "slice" too. data: the build record's, one per recipe
    folder."""
    names: dict[str, tuple[str, Any]] = {}
    for g, r, rec in zip(given, read, data):
        if Path(r) != Path(g):
            for form in (dataset_path, setting_value, str):  # every form a path is recorded in
                names[form(Path(r))] = (form(Path(g)), rec.get("slice"))

    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            out = {k: walk(v) for k, v in x.items()}
            hit = names.get(x.get("path")) if isinstance(x.get("path"), str) else None
            if hit is not None and "sha256" in x and hit[1] is not None:
                out.setdefault("slice", hit[1])
            return out
        if isinstance(x, list):
            return [walk(v) for v in x]
        return names[x][0] if isinstance(x, str) and x in names else x

    return walk(meta) if names else meta


def _track(train: TrainSettings, res: dict[str, Any], run_id: str) -> None:
    """The build's settings, held-out figures and folder into its MLflow run; the folder registered."""
    import mlflow

    mlflow.log_params({k: v for k, v in settings_record(train).items() if k != "command"})
    tracking.log_metrics({**{f"perfmodel/{k}": v for k, v in res["metrics"].items()}, **res["cublas"], **res["pad"]})
    mlflow.log_artifacts(res["out"], "model")
    if train.register_name:
        res["model_version"] = tracking.register(run_id, train.register_name, train.alias)
