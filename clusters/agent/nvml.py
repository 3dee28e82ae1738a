"""Reading GPUs through NVML. The module is passed in, so tests can hand in a stand-in."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

MIB = 1024 * 1024
log = logging.getLogger("gpupool.agent")


class NoGpu(Exception):
    """NVML is missing, has no driver, or sees no device: nothing for the agent to do."""


@dataclass
class Process:
    pid: int
    used_mib: int


@dataclass
class Reading:
    gpu_index: int
    ts: float
    util_pct: float
    mem_used_mib: int
    mem_total_mib: int
    power_w: float | None
    temp_c: float | None
    processes: list[Process] = field(default_factory=list)


def load_nvml() -> ModuleType:
    try:
        import pynvml  # noqa: PLC0415 - optional at import time: machines without GPUs
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a requirement
        raise NoGpu(f"pynvml is not installed: {exc}") from exc
    return pynvml


class Sampler:
    """One NVML session; `read()` returns a Reading per GPU."""

    def __init__(self, nvml: ModuleType | Any):
        self.nvml = nvml
        try:
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            raise NoGpu(f"NVML is not usable here: {exc}") from exc
        if count == 0:
            raise NoGpu("NVML sees no GPU on this machine")
        self.handles: dict[int, Any] = {}  # NVML index -> handle, for the GPUs that answer
        for index in range(count):
            try:
                self.handles[index] = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError as exc:
                log.warning("GPU %d is left out: %s", index, exc)
        if not self.handles:
            nvml.nvmlShutdown()
            raise NoGpu(f"none of the {count} GPUs NVML lists can be opened")
        self.failing: dict[int, str] = {}  # GPU index -> the error it last failed with

    def close(self) -> None:
        self.nvml.nvmlShutdown()

    def _optional(self, call: Any, *args: Any) -> Any:
        """Power and temperature are unsupported on some boards: leave them out, go on."""
        try:
            return call(*args)
        except self.nvml.NVMLError:
            return None

    def processes(self, handle: Any) -> list[Process]:
        procs = self._optional(self.nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
        return [Process(p.pid, int((p.usedGpuMemory or 0) // MIB)) for p in procs]

    def read_one(self, index: int, handle: Any, now: float) -> Reading:
        nvml = self.nvml
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        power = self._optional(nvml.nvmlDeviceGetPowerUsage, handle)  # milliwatts
        temp = self._optional(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        return Reading(
            gpu_index=index,
            ts=now,
            util_pct=float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            mem_used_mib=int(memory.used // MIB),
            mem_total_mib=int(memory.total // MIB),
            power_w=power / 1000.0 if power is not None else None,
            temp_c=float(temp) if temp is not None else None,
            processes=self.processes(handle),
        )

    def read(self) -> list[Reading]:
        """A reading per GPU that answers; one that fails (lost, resetting, MIG mode without
        utilisation) is left out of this round and logged when its error changes, so one
        bad GPU neither stops the agent (and its buffer) nor silences the others."""
        now = time.time()
        readings = []
        for index, handle in self.handles.items():
            try:
                readings.append(self.read_one(index, handle, now))
            except self.nvml.NVMLError as exc:
                if self.failing.get(index) != str(exc):
                    log.warning("GPU %d cannot be read: %s", index, exc)
                self.failing[index] = str(exc)
                continue
            if self.failing.pop(index, None) is not None:
                log.info("GPU %d can be read again", index)
        return readings
