"""Device specs: datasheet figures for known GPUs, and the live device when one is present.

Peak rates are stored per SM per clock so that a timing can be checked against the
peak at the *measured* SM clock (docs/design.md, "Measuring").
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# Dense FLOP per SM per clock on Hopper / Ampere (tensor cores for fp16/bf16/tf32, CUDA cores for fp32).
# H100: 1024 fp16 FMA/clk/SM on tensor cores -> 2048 FLOP... x2 for the 4th-gen tensor core rate.
_HOPPER_FLOP_PER_SM_CLK = {"float16": 4096.0, "bfloat16": 4096.0, "tf32": 2048.0, "float32": 256.0}
_AMPERE_FLOP_PER_SM_CLK = {"float16": 2048.0, "bfloat16": 2048.0, "tf32": 1024.0, "float32": 128.0}


@dataclass(frozen=True)
class DeviceSpec:
    name: str                       # short key, e.g. "h100-sxm"
    marketing_name: str             # substring of torch.cuda.get_device_name()
    sm_count: int
    max_sm_clock_mhz: float         # max boost clock
    flop_per_sm_clk: dict[str, float]  # keys: float16, bfloat16, tf32, float32
    dram_bw_gbs: float              # datasheet DRAM bandwidth, GB/s
    shared_memory_per_block_optin: int  # bytes
    l2_bytes: int
    registers_per_thread_max: int = 255

    def peak_flops(self, dtype: str, allow_tf32: bool = False, sm_clock_mhz: float | None = None) -> float:
        """Peak dense FLOP/s for a dtype at a clock (default: max boost)."""
        key = "tf32" if (dtype == "float32" and allow_tf32) else dtype
        clock = self.max_sm_clock_mhz if sm_clock_mhz is None else sm_clock_mhz
        return self.sm_count * self.flop_per_sm_clk[key] * clock * 1e6

    def peak_bytes_per_s(self) -> float:
        return self.dram_bw_gbs * 1e9

    def roofline_ms(self, m: Any, n: Any, k: Any, dtype: Any, allow_tf32: Any = False, batch: Any = 1) -> Any:
        """The physical floor in ms, float64: FLOPs at this device's peak for the dtype (and TF32) at its max clock,
        or each operand read once and the output written once at DRAM bandwidth, whichever is longer; the whole
        batch for a bmm. Arrays broadcast (dtype: one name, or one per element)."""
        import numpy as np

        from .schema import DTYPE_BYTES

        m, n, k, batch = (np.asarray(v, dtype=np.float64) for v in (m, n, k, batch))
        dtypes = np.broadcast_to(np.asarray(dtype), np.broadcast(m, n, k).shape)
        tf32 = np.broadcast_to(np.asarray(allow_tf32, dtype=bool), dtypes.shape)
        peak = np.array([self.peak_flops(str(d), bool(t)) for d, t in zip(dtypes.ravel(), tf32.ravel())]
                        ).reshape(dtypes.shape)
        nbytes = np.array([DTYPE_BYTES[str(d)] for d in dtypes.ravel()], dtype=np.float64).reshape(dtypes.shape)
        compute = 2.0 * batch * m * n * k / peak
        memory = batch * (m * k + k * n + m * n) * nbytes / self.peak_bytes_per_s()
        return 1e3 * np.maximum(compute, memory)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# Datasheet figures (NVIDIA H100/H200/A100 datasheets; clocks are max boost). The H200 (SXM) is the H100 SXM's
# GH100 configuration (132 SMs, 1980 MHz, the same tensor-core rates and shared memory) with 141 GB of
# HBM3e at 4.8 TB/s and 60 MB of L2 (torch reports L2_cache_size=60MB for it, 50MB for the H100 SXM).
# benchmarks/device_probe.py checks a spec against what the card reports and measures.
KNOWN_DEVICES: dict[str, DeviceSpec] = {
    "h100-sxm": DeviceSpec("h100-sxm", "H100 80GB HBM3", 132, 1980.0, _HOPPER_FLOP_PER_SM_CLK, 3350.0, 232448, 50 * 2**20),
    "h100-pcie": DeviceSpec("h100-pcie", "H100 PCIe", 114, 1755.0, _HOPPER_FLOP_PER_SM_CLK, 2000.0, 232448, 50 * 2**20),
    "h200": DeviceSpec("h200", "H200", 132, 1980.0, _HOPPER_FLOP_PER_SM_CLK, 4800.0, 232448, 60 * 2**20),
    "a100-sxm": DeviceSpec("a100-sxm", "A100-SXM4", 108, 1410.0, _AMPERE_FLOP_PER_SM_CLK, 2039.0, 166912, 40 * 2**20),
}
# The device folder a model or dataset lives in (models/<folder>, data/<folder>).
DEVICE_FOLDER = {"h100-sxm": "h100", "h100-pcie": "h100-pcie", "h200": "h200", "a100-sxm": "a100"}
DEFAULT_DEVICE = "h100-sxm"


def get_spec(name: str) -> DeviceSpec:
    try:
        return KNOWN_DEVICES[name]
    except KeyError:
        raise ValueError(f"device: unknown device {name!r}; known: {', '.join(KNOWN_DEVICES)}") from None


def match_spec(device_name: str, sm_count: int | None = None) -> DeviceSpec | None:
    """The known spec for a torch.cuda.get_device_name() string, if any."""
    for spec in KNOWN_DEVICES.values():
        if spec.marketing_name.lower() in device_name.lower():
            if sm_count is None or sm_count == spec.sm_count:
                return spec
    if "h100" in device_name.lower():  # other H100 SXM SKU names
        return KNOWN_DEVICES["h100-sxm" if (sm_count or 132) == 132 else "h100-pcie"]
    return None


def live_device_info(index: int = 0) -> dict[str, Any]:
    """Properties of a visible CUDA device (needs torch with CUDA; NVML for clocks/driver if present)."""
    import torch

    props = torch.cuda.get_device_properties(index)
    info: dict[str, Any] = {
        "device_name": props.name,
        "sm_count": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}",
        "total_memory": props.total_memory,
        "shared_memory_per_block_optin": getattr(props, "shared_memory_per_block_optin", None),
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    info.update(nvml_info(index))
    return info


def nvml_info(index: int = 0) -> dict[str, Any]:
    try:
        import pynvml
    except ImportError:
        return {}
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    return {
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
        "max_mem_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
    }


class ClockReader:
    """Reads the current SM clock through NVML (None when NVML is absent)."""

    def __init__(self, index: int = 0) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._h = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:  # NVML missing or no device: clocks unknown, callers fall back
            self._nvml = None
            self.error = repr(exc)

    def sm_clock_mhz(self) -> float | None:
        if self._nvml is None:
            return None
        return float(self._nvml.nvmlDeviceGetClockInfo(self._h, self._nvml.NVML_CLOCK_SM))
