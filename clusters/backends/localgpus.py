"""The GPUs of this machine through NVML (the `pynvml` module of nvidia-ml-py)."""

from __future__ import annotations

import logging
from typing import Any

from clusters.backends import GpuInfo

log = logging.getLogger(__name__)


def nvml_module() -> Any:
    """The NVML binding (tests put a stand-in here: tests/clusters/fake_nvml.py)."""
    import pynvml  # noqa: PLC0415 - optional: absent or driverless means no GPU

    return pynvml


def local_mig_sync(
    wanted: dict[tuple[str, int], list[tuple[str, int]]],
) -> tuple[dict[tuple[str, int, int], str], list[str]]:
    """Make this machine's MIG-mode GPUs hold the instances wanted (clusters/agent/mig.py)."""
    from clusters.agent.mig import MigError, MigInstances  # noqa: PLC0415 - imports the engine

    try:
        pynvml = nvml_module()
        pynvml.nvmlInit()
    except Exception as exc:  # no driver: no MIG either
        return {}, [f"NVML unavailable: {exc}"]
    made, errors = {}, []
    try:
        agent = MigInstances(pynvml)
        for (node, index), instances in sorted(wanted.items()):
            try:
                result = agent.sync(index, instances)
            except (MigError, pynvml.NVMLError) as exc:
                errors.append(str(exc))
                continue
            errors += result.errors
            made.update({(node, index, start): uuid for start, uuid in result.devices.items()})
    finally:
        pynvml.nvmlShutdown()
    return made, errors


def local_gpus() -> list[GpuInfo]:
    """Every GPU NVML sees; an empty list when there is no driver (a CPU-only node)."""
    try:
        pynvml = nvml_module()
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
    try:
        mig = pynvml.nvmlDeviceGetMigMode(handle)[0] == 1
    except pynvml.NVMLError:  # NOT_SUPPORTED: a GPU without MIG
        mig = False
    return GpuInfo(
        index=index,
        model=name.decode() if isinstance(name, bytes) else str(name),
        memory_mib=int(memory.total // (1024 * 1024)),
        uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
        mig=mig,
    )
