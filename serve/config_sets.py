"""The Predictor's config sets: the default space per dtype, the cache of a caller's config lists (their
tensor, config-only encoding and runnable masks) and which configs the device can run. A base class of
perfmodel.serve.predictor.Predictor, whose __init__ builds the state these methods read (_default_configs,
_default_tensors, _config_cache, _config_lock, _last_configs, _encoder); it imports no other module of
perfmodel.serve but runners.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np
import torch

from perfmodel.configs import rule_key, runnable, runnable_for
from perfmodel.features import configs_tensor
from perfmodel.schema import DTYPE_BYTES, DTYPES, GemmConfig, GemmProblem

from .runners import _ConfigPart

# Config sets whose tensor and config-only encoding are kept (autotuners rank one list for many shapes).
_CONFIG_CACHE_SIZE = 32


class _Fits(dict):
    """{dtype size: (C,) bool, which configs of a set the device runs for every problem of that size (the operand
    tiles of every stage fit)}, the sizes for which that is all of them (checked once per config set, not per
    call), and the set's configs (C, 6), for the problem's own rule on the others (perfmodel.configs.runnable_for)."""

    def __init__(self, masks: dict[int, np.ndarray], configs: np.ndarray | None = None, spec: Any = None) -> None:
        super().__init__(masks)
        self.all_runnable = frozenset(b for b, m in masks.items() if m.all())
        self.configs, self.spec = configs, spec
        self._by_key: dict[tuple, np.ndarray] = {}

    def mask(self, p: GemmProblem) -> np.ndarray:
        """(C,) bool: the configs the device runs for p -- every config that fits for any problem, and of the
        others those that fit at p's sizes, layout and TF32 flag (kept per perfmodel.configs.rule_key: an
        autotuner's list asked about shape after shape computes each kind of shape once)."""
        m = self[p.dtype_bytes]
        if self.configs is None or p.dtype_bytes in self.all_runnable:
            return m
        key = rule_key(p)
        out = self._by_key.get(key)
        if out is None:
            rest = np.flatnonzero(~m)
            out = m.copy()
            out[rest] = runnable_for(self.configs[rest], [p], self.spec)[0]
            if len(self._by_key) >= 1024:  # bounded: a few hundred kinds of shape in practice
                self._by_key.clear()
            self._by_key[key] = out
        return out


class ConfigSets:
    """The config-set half of the Predictor (perfmodel.serve.predictor.Predictor: its state, its __init__)."""

    def default_configs(self, dtype: str) -> tuple[GemmConfig, ...]:
        """The model device's pruned config space for a dtype (the configs used when none are given)."""
        if dtype not in self._default_configs:
            raise ValueError(f"dtype: unsupported dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
        return self._default_configs[dtype]

    def _config_entry(self, ct: torch.Tensor) -> tuple[torch.Tensor, Any, dict[int, np.ndarray]]:
        """What a config set's calls reuse: its tensor, its config-only encoding, and per dtype size which
        of its configs the device can run (perfmodel.configs.runnable)."""
        cn = ct.numpy()
        fits = _Fits({b: runnable(cn, float(b), self.spec) for b in set(DTYPE_BYTES.values())}, cn[:, :6], self.spec)
        return ct, _ConfigPart.of(self._encoder, ct), fits

    def _configs(self, configs: Any, dtype: str) -> tuple[Sequence[GemmConfig], torch.Tensor, Any, dict]:
        """(configs, their tensor, their config-only encoding, their runnable masks per dtype size); the
        last three cached per config set."""
        if configs is None:
            return (self._default_configs[dtype], *self._default_tensors[dtype])
        if isinstance(configs, (GemmConfig, str, bytes, dict)) or not isinstance(configs, Iterable):
            raise TypeError(f"configs: expected a sequence of GemmConfig, got {type(configs).__name__}")
        # An autotuner ranks one config list for shape after shape: the last list is matched by list
        # equality, which compares the same objects by identity (a few us for hundreds of configs,
        # where building the key below takes ~25 us). Only GemmConfigs equal GemmConfigs. A list
        # equal to the last one is served with the last one's own copy (no copy made per call).
        last = self._last_configs
        if last is not None and type(configs) is list and last[0] == configs:
            return (last[0], *last[1])
        configs = list(configs)
        if not configs:
            raise ValueError("configs: empty; pass at least one GemmConfig (or None for the default space)")
        if last is not None and last[0] == configs:
            return (configs, *last[1])
        try:  # GemmConfig.packed: 48 bytes per config; anything else fails here or on the length
            key = b"".join([c.packed for c in configs])
        except (AttributeError, TypeError):
            key = b""
        if len(key) != 48 * len(configs):
            for i, c in enumerate(configs):
                if not isinstance(c, GemmConfig):
                    raise TypeError(f"configs[{i}]: expected a GemmConfig, got {type(c).__name__} ({c!r})")
        with self._config_lock:
            hit = self._config_cache.get(key)
            if hit is not None:
                self._config_cache.move_to_end(key)
        if hit is None:
            hit = self._config_entry(configs_tensor(configs))
            with self._config_lock:
                self._config_cache[key] = hit
                while len(self._config_cache) > _CONFIG_CACHE_SIZE:
                    self._config_cache.popitem(last=False)
        self._last_configs = (configs, hit)  # one assignment: threads see the old pair or the new one
        return (configs, *hit)

    def _config_rows(self, configs: Any, dtype: str, problems: Sequence[GemmProblem]
                     ) -> tuple[Sequence[GemmConfig], torch.Tensor, Any, np.ndarray | None]:
        """(configs, their tensor, their config-only encoding, _runnable's (P, C) mask or None) of a config list
        for problems of dtype: _configs and _runnable in one call."""
        cfgs, ct, part, fits = self._configs(configs, dtype)
        return cfgs, ct, part, self._runnable(fits, problems)

    def config_set(self, configs: Any, problems: Sequence[GemmProblem]) -> tuple[list, torch.Tensor, np.ndarray | None]:
        """(configs, their tensor (C, ...), (P, C) bool of the configs the model's device can run for each problem,
        or None where it can run them all) of a config list for problems (configs None: the model device's pruned
        space for the problems' one dtype): the Predictor's cached config sets, for a head scored outside it
        (perfmodel.serve.bmm)."""
        cfgs, ct, _, fits = self._configs(configs, self._common_dtype(list(problems), configs))
        return list(cfgs), ct, self._runnable(fits, problems)

    @staticmethod
    def _runnable(fits: dict[int, np.ndarray], problems: Sequence[GemmProblem]) -> np.ndarray | None:
        """(P, C) bool: which configs the model's device can run for each problem (fits: _config_entry's
        masks per dtype size, the others by the problem's own rule, `_Fits.mask`); None when all can (the
        default spaces, and nearly every user list)."""
        runs_all = fits.all_runnable
        if len(problems) == 1:  # one problem (a rank call): no generator
            if problems[0].dtype_bytes in runs_all:
                return None
        elif all(p.dtype_bytes in runs_all for p in problems):
            return None
        if not isinstance(fits, _Fits):
            return np.stack([fits[p.dtype_bytes] for p in problems])
        ok = np.stack([fits.mask(p) for p in problems])
        return None if ok.all() else ok  # the problems' own rule runs them all

    def _unrunnable_inf(self, ms: np.ndarray, fits: dict[int, np.ndarray], problems: Sequence[GemmProblem]) -> np.ndarray:
        """ms (P, C) with inf where the device cannot run the config (docs/design.md: such a config
        predicts inf and ranks after every runnable one)."""
        ok = self._runnable(fits, problems)
        return ms if ok is None else np.where(ok, ms, np.inf)

    @staticmethod
    def _common_dtype(problems: list[GemmProblem], configs: Any) -> str:
        dtypes = {p.dtype for p in problems}
        if configs is None and len(dtypes) > 1:
            raise ValueError(f"configs: problems mix dtypes {sorted(dtypes)}, whose default config spaces "
                             "differ; pass configs explicitly")
        return problems[0].dtype
