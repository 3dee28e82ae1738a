"""A stand-in for the pynvml module that answers with values recorded on an A100 node.

Only the functions the agent calls exist; each returns what the real call returned on
the recorded machine (bytes for memory, milliwatts for power), so unit conversions are
exercised as they are against real hardware.
"""

from __future__ import annotations

from types import SimpleNamespace

NVML_TEMPERATURE_GPU = 0
GIB = 1024**3

# nvidia-smi on an 8x A100-SXM4-80GB node, two of its GPUs (recorded values).
RECORDED = [
    {"util": 97, "used": 61_203_283_968, "total": 85_899_345_920, "power": 312_456, "temp": 64,
     "procs": [(4242, 60_129_542_144)]},
    {"util": 0, "used": 4_194_304, "total": 85_899_345_920, "power": 61_027, "temp": 31,
     "procs": []},
]  # fmt: skip


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class FakeNvml:
    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU

    def __init__(self, gpus=None, *, init_error: str | None = None, power_supported=True):
        self.gpus = [dict(g) for g in (RECORDED if gpus is None else gpus)]
        self.init_error = init_error
        self.power_supported = power_supported
        self.initialised = False

    def nvmlInit(self):
        if self.init_error:
            raise NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self):
        self.initialised = False

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        if self.gpus[index].get("handle_error"):
            raise NVMLError(self.gpus[index]["handle_error"])
        return index

    def _check(self, handle):
        """A GPU given an "error" (e.g. "GPU is lost") fails its readings with it."""
        if self.gpus[handle].get("error"):
            raise NVMLError(self.gpus[handle]["error"])

    def nvmlDeviceGetUtilizationRates(self, handle):
        self._check(handle)
        return SimpleNamespace(gpu=self.gpus[handle]["util"], memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle):
        self._check(handle)
        gpu = self.gpus[handle]
        return SimpleNamespace(
            used=gpu["used"], total=gpu["total"], free=gpu["total"] - gpu["used"]
        )

    def nvmlDeviceGetPowerUsage(self, handle):
        if not self.power_supported:
            raise NVMLError_NotSupported("Not Supported")
        return self.gpus[handle]["power"]

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == NVML_TEMPERATURE_GPU
        return self.gpus[handle]["temp"]

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.gpus[handle]["procs"]
        ]
