"""The GPUs of this machine through NVML (the `pynvml` module of nvidia-ml-py)."""

from __future__ import annotations

import logging
from typing import Any

from clusters.backends import GpuInfo

log = logging.getLogger(__name__)


def local_gpus() -> list[GpuInfo]:
    """Every GPU NVML sees; an empty list when there is no driver (a CPU-only node)."""
    try:
        import pynvml  # noqa: PLC0415 - optional: absent or driverless means no GPU

        pynvml.nvmlInit()
    except Exception as exc:  # NVML raises its own errors; any of them means no GPU
        log.debug("NVML unavailable, treating this machine as CPU-only: %s", exc)
        return []
    try:
        return [_gpu(pynvml, index) for index in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()


def _gpu(pynvml: Any, index: int) -> GpuInfo:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    name = pynvml.nvmlDeviceGetName(handle)
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return GpuInfo(
        index=index,
        model=name.decode() if isinstance(name, bytes) else str(name),
        memory_mib=int(memory.total // (1024 * 1024)),
        uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
    )
