"""perfmodel: a learned performance model for Triton GEMM configs and GEMM padding.

    from perfmodel import GemmProblem, GemmConfig, PadProblem, Predictor

This core (schema, config space, device specs, feature encoder, model and artifact format) imports none
of perfmodel.serve, perfmodel.train, perfmodel.data_gen, and needs neither Lightning nor MLflow nor
pandas. `Predictor` is the one exception: a lazy export of perfmodel.serve's, imported on first use, so
that `import perfmodel` stays light.
"""
from ._version import __version__
from .locations import install_checkout_finder
from .schema import DTYPES, SCHEMA_VERSION, GemmConfig, GemmProblem, PadDecision, PadProblem

# In a checkout, serve/, train/ and data_gen/ sit beside this folder rather than inside it: make them
# importable as perfmodel.serve, perfmodel.train and perfmodel.data_gen (see locations.CheckoutFinder).
install_checkout_finder()

# __version__ is read from perfmodel/_version.py, never from importlib.metadata: that constant is what
# the build writes into the installed metadata, and it stays right where the metadata does not (a plain
# checkout has none; an editable install's goes stale until reinstalled).
__all__ = ["DTYPES", "SCHEMA_VERSION", "GemmConfig", "GemmProblem", "PadDecision", "PadProblem", "Predictor",
           "__version__"]


def __getattr__(name: str):
    if name == "Predictor":
        from .serve.predictor import Predictor

        return Predictor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"Predictor"})
