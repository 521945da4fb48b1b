"""The package: one import namespace (perfmodel), importable from a plain checkout as from an install."""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# The repo's folders that install as perfmodel.<name>: no code may import them by their folder name.
SUBPACKAGES = ("serve", "train", "data_gen")

# Run before anything else in a subprocess: drop setuptools' editable-install finders, so that only the
# repo root on PYTHONPATH can provide perfmodel (the GPU machine's plain checkout, nothing installed).
PLAIN_CHECKOUT = """
import sys
import textwrap
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
sys.path[:] = [p for p in sys.path if "__editable__" not in p]
"""


def _run(code: str, cwd: Path, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONNOUSERSITE="1", **(env_extra or {}))
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=180)


def test_import_perfmodel_is_light(tmp_path: Path) -> None:
    code = PLAIN_CHECKOUT + """
import perfmodel
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"lightning", "mlflow", "triton", "pandas"})
assert not heavy, heavy
assert "perfmodel.serve" not in sys.modules  # Predictor is exported lazily
print("ok")
"""
    r = _run(code, tmp_path, {"PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_plain_checkout_imports_subpackages(tmp_path: Path) -> None:
    """With only the repo root on sys.path, and the working directory elsewhere, the public API and the
    three subpackages import from the checkout's folders; no other repo folder becomes a subpackage."""
    code = PLAIN_CHECKOUT + f"""
import importlib, json
from perfmodel import GemmProblem, GemmConfig, PadProblem, Predictor
import perfmodel.serve.inductor, perfmodel.serve.triton_hook, perfmodel.train.data, perfmodel.data_gen.shards
assert callable(perfmodel.serve.inductor.install) and callable(perfmodel.serve.triton_hook.perfmodel_prune)
for name in ("tests", "benchmarks", "models", "data"):
    try:
        importlib.import_module("perfmodel." + name)
    except ModuleNotFoundError:
        pass
    else:
        raise AssertionError("perfmodel." + name + " should not import")
top = sorted(m for m in sys.modules if m.split(".")[0] in {SUBPACKAGES!r})
print(json.dumps({{"files": {{m: sys.modules[m].__file__ for m in ("perfmodel", "perfmodel.serve", "perfmodel.train",
                                                           "perfmodel.data_gen", "perfmodel.serve.inductor")}},
                  "top": top, "predictor": Predictor.__module__}}))
"""
    r = _run(code, tmp_path, {"PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    files = {k: Path(v) for k, v in out["files"].items()}
    assert files["perfmodel"] == REPO / "perfmodel" / "__init__.py"
    assert files["perfmodel.serve"] == REPO / "serve" / "__init__.py"
    assert files["perfmodel.train"] == REPO / "train" / "__init__.py"
    assert files["perfmodel.data_gen"] == REPO / "data_gen" / "__init__.py"
    assert files["perfmodel.serve.inductor"] == REPO / "serve" / "inductor.py"
    assert out["top"] == []  # nothing imported under a top-level serve/train/data_gen name
    assert out["predictor"] == "perfmodel.serve.predictor"


def test_plain_checkout_python_m_cli(tmp_path: Path) -> None:
    """`python -m perfmodel.serve.cli rank ...` (as runpy runs it) from a plain checkout, outside it."""
    code = PLAIN_CHECKOUT + """
import runpy
sys.argv = ["perfmodel", "rank", "--m", "512", "--n", "512", "--k", "512", "--top-k", "2", "--json"]
runpy.run_module("perfmodel.serve.cli", run_name="__main__", alter_sys=True)
"""
    r = _run(code, tmp_path, {"PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["configs"]) == 2


def _top_level_imports(path: Path) -> list[str]:
    """`import serve...` / `from train... import` statements of one file (absolute imports only)."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except SyntaxError as exc:  # pragma: no cover - a broken file fails elsewhere too
        return [f"unparsable: {exc}"]
    bad = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        bad += [f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in SUBPACKAGES]
    return bad


def test_no_top_level_subpackage_imports() -> None:
    """Code, tests and benchmarks import perfmodel.serve, perfmodel.train, perfmodel.data_gen: a top-level
    `serve` would load a second copy of the module (its classes not the same) and does not install."""
    files = [p for d in ("perfmodel", *SUBPACKAGES, "tests", "benchmarks") for p in sorted((REPO / d).rglob("*.py"))]
    assert files
    bad = [line for p in files for line in _top_level_imports(p)]
    assert not bad, "\n".join(bad)



@pytest.fixture(scope="module")
def wheel_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of the checkout, unpacked: the tree pip installs into site-packages."""
    pytest.importorskip("setuptools")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")
    for name in ("perfmodel", *SUBPACKAGES, "models", "data", "tests", "benchmarks"):
        shutil.copytree(REPO / name, src / name, ignore=skip)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = (tmp / "dist").glob("perfmodel-*.whl")
    with zipfile.ZipFile(whl) as z:
        z.extractall(tmp / "site")
    return tmp / "site"


def test_wheel_installs_one_name_and_the_model(wheel_tree: Path) -> None:
    top = sorted(p.name for p in wheel_tree.iterdir())
    assert [n for n in top if not n.endswith(".dist-info")] == ["perfmodel"]
    pkg = wheel_tree / "perfmodel"
    for name in SUBPACKAGES:
        assert (pkg / name / "__init__.py").is_file(), name
    model = sorted(p.name for p in (pkg / "_models" / "h100").iterdir())
    assert model == ["MODEL_CARD.md", "metadata.json", "model.onnx", "model.safetensors"]
    files = [p.relative_to(pkg).as_posix() for p in pkg.rglob("*") if p.is_file()]
    assert not [f for f in files if f.endswith((".jsonl.gz", ".jsonl")) or f.startswith(("data/", "tests/"))]
    (entry,) = wheel_tree.glob("perfmodel-*.dist-info/entry_points.txt")
    assert "perfmodel = perfmodel.cli:main" in entry.read_text()


def test_wheel_loads_default_model(wheel_tree: Path, tmp_path: Path) -> None:
    """Predictor.load() with no path finds the model inside the installed package, not a checkout's."""
    code = PLAIN_CHECKOUT + """
import json
from perfmodel import GemmProblem, GemmConfig, PadProblem, Predictor
import perfmodel, perfmodel.locations, perfmodel.serve.triton_hook, perfmodel.train.cli, perfmodel.data_gen.cli
p = Predictor.load()
best = p.rank(GemmProblem(m=4096, n=4096, k=4096, dtype="float16"), top_k=5)
assert len(best) == 5
print(json.dumps({"pkg": perfmodel.__file__, "serve": perfmodel.serve.__file__, "source": p.source,
                  "root": str(perfmodel.locations.checkout_root())}))
"""
    r = _run(code, tmp_path, {"PYTHONPATH": str(wheel_tree)})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert Path(out["pkg"]) == wheel_tree / "perfmodel" / "__init__.py"
    assert Path(out["serve"]) == wheel_tree / "perfmodel" / "serve" / "__init__.py"
    assert Path(out["source"]) == wheel_tree / "perfmodel" / "_models" / "h100"
    assert out["root"] == "None"


def test_version_single_source() -> None:
    """perfmodel.__version__ is perfmodel/_version.py's constant, which pyproject reads at build time."""
    tomllib = pytest.importorskip("tomllib")
    import perfmodel
    from perfmodel._version import __version__

    assert perfmodel.__version__ == __version__ and __version__.count(".") == 2
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "perfmodel._version.__version__"}


def test_cli_version(tmp_path: Path) -> None:
    from perfmodel import __version__

    code = PLAIN_CHECKOUT + """
import runpy
sys.argv = ["perfmodel", "--version"]
runpy.run_module("perfmodel.serve.cli", run_name="__main__", alter_sys=True)
"""
    r = _run(code, tmp_path, {"PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"perfmodel {__version__}"


def test_cli_builds_without_triton(repo_root):
    # A plain `pip install perfmodel` has no triton (it is the `gen` extra): the CLI's parser, and the
    # serving commands, must not import it (CI's wheel check caught `perfmodel rank` doing so once).
    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "triton" or name.startswith("triton."):
                    raise ModuleNotFoundError("No module named 'triton' (blocked by the test)")
        sys.meta_path.insert(0, Block())
        from perfmodel.cli import main
        sys.exit(main(["rank", "--m", "64", "--n", "64", "--k", "64", "--top-k", "2", "--json"]))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo_root, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "triton" not in r.stderr
