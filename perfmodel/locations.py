"""Where the package's parts are: its subpackages in a plain checkout, the shipped model, the dataset.

The repo keeps serve/, train/ and data_gen/ at its top level, beside perfmodel/; the build maps them to
perfmodel.serve, perfmodel.train and perfmodel.data_gen, and models/ to perfmodel/_models
(pyproject.toml, [tool.setuptools.package-dir]). So the same code runs from two layouts:

- an installed wheel: everything under site-packages/perfmodel/, the model in perfmodel/_models/<device>/;
- a checkout, plain (nothing installed, the repo root on sys.path: the GPU machine runs `python -m ...`,
  pytest and `python -m benchmarks.NAME` that way) or under an editable install: perfmodel/ is the checkout's
  folder, and `CheckoutFinder` below resolves the three subpackages to the folders beside it.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
# The repo's top-level folders that install as perfmodel.<name>.
SUBPACKAGES = ("serve", "train", "data_gen")


def checkout_root() -> Path | None:
    """The repo root when this package runs from a checkout (plain or editable install), else None.

    A checkout has pyproject.toml and the subpackage folders beside perfmodel/; an installed wheel has
    perfmodel/ in site-packages, which has neither."""
    root = PACKAGE_DIR.parent
    if (root / "pyproject.toml").is_file() and all((root / name / "__init__.py").is_file() for name in SUBPACKAGES):
        return root
    return None


def default_model_dir(device: str | None = None) -> Path:
    """The shipped model folder for a device spec name: models/<its folder> when one is shipped for it,
    else the default device's (models/h100 in the repo). device=None: the default device's.

    Inside an installed wheel it is package data, perfmodel/_models/<folder>; in a plain checkout and an
    editable install (where perfmodel/ is the checkout's folder) it is the checkout's models/<folder>. Every
    default model path (Predictor.load(), `perfmodel eval`, the training output, the benchmarks) comes
    from here. The default folder may not exist (a wheel built without it): loaders say so by name."""
    from .devices import DEFAULT_DEVICE, DEVICE_FOLDER

    if device is not None and device != DEFAULT_DEVICE and device in DEVICE_FOLDER:
        own = _shipped(DEVICE_FOLDER[device])
        if (own / "metadata.json").is_file():
            return own
    return _shipped(DEVICE_FOLDER[DEFAULT_DEVICE])


def _shipped(folder: str) -> Path:
    packaged = PACKAGE_DIR / "_models" / folder
    root = checkout_root()
    if packaged.is_dir() or root is None:
        return packaged
    return root / "models" / folder


def default_data_dir() -> Path:
    """The shipped dataset folder, data/h100 of the checkout. The dataset is not in the wheel: outside a
    checkout this is data/h100 under the working directory (where `perfmodel gen` writes by default)."""
    from .devices import DEFAULT_DEVICE, DEVICE_FOLDER

    root = checkout_root()
    return (root if root is not None else Path()) / "data" / DEVICE_FOLDER[DEFAULT_DEVICE]


class CheckoutFinder(importlib.abc.MetaPathFinder):
    """Resolves exactly perfmodel.serve, perfmodel.train and perfmodel.data_gen to the checkout's
    serve/, train/ and data_gen/ folders. Their submodules (perfmodel.serve.cli, ...) then resolve as
    usual through the subpackage's __path__, so nothing else changes.

    It is installed only when perfmodel/ itself was imported from a checkout, and then first on
    sys.meta_path: the subpackages always come from the same tree as perfmodel/ (an editable install
    of this checkout gives the same folders; one of another checkout would otherwise mix two trees).
    Inside an installed wheel it is never installed. (Appending the repo root to perfmodel.__path__
    would be shorter, but would make every top-level folder -- tests, benchmarks, data, models -- a
    perfmodel subpackage too.)"""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        parent, _, name = fullname.rpartition(".")
        if parent != __package__ or name not in SUBPACKAGES:
            return None
        init = self.root / name / "__init__.py"
        if not init.is_file():
            return None
        return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[str(init.parent)])


def install_checkout_finder() -> None:
    """Called once by perfmodel/__init__.py: adds CheckoutFinder when running from a checkout."""
    root = checkout_root()
    if root is None or any(isinstance(f, CheckoutFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, CheckoutFinder(root))
