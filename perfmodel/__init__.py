"""perfmodel core: schema, config space, device specs, feature encoder, model and artifact format.

Imports none of data_gen/, train/, serve/; needs neither Lightning nor MLflow nor pandas.
"""
from .schema import (DTYPES, SCHEMA_VERSION, GemmConfig, GemmProblem, PadDecision, PadProblem)

__all__ = ["DTYPES", "SCHEMA_VERSION", "GemmConfig", "GemmProblem", "PadDecision", "PadProblem"]
