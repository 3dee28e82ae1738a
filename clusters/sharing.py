"""GPU sharing that holds on the GPU: the CUDA MPS limits a sharing pod runs under.

A pod that holds part of a GPU (a portion, or an amount of GPU memory) runs as a client of
that GPU's MPS control daemon, and its environment carries NVIDIA's per-client limits:

- CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=<MiB>M": device memory the client may allocate on
  its device 0 (the only device it sees); past it, cuMemAlloc fails with
  CUDA_ERROR_OUT_OF_MEMORY in that client alone;
- CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: the share of the GPU's streaming multiprocessors its
  kernels may use;
- CUDA_MPS_PIPE_DIRECTORY: where that GPU's daemon listens (each backend knows the path
  as its pod sees it).

`mps_limits` derives the limits from what was asked, `mps_env` writes them: every backend
(local, simulated, Kubernetes) calls these two and nothing else, so the contract is one.
docs/gpu-sharing.md explains the mechanism and its limits.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

# The folder inside a Kubernetes pod (and the simulated pod) where its GPU's pipe is mounted.
POD_PIPE_DIRECTORY = "/run/nvidia-mps"
# What the CUDA runtime, the driver API and the usual frameworks print when an allocation
# fails: PyTorch ("CUDA out of memory"), cuMemAlloc (CUDA_ERROR_OUT_OF_MEMORY), the runtime
# (cudaErrorMemoryAllocation: "out of memory"), JAX/XLA (RESOURCE_EXHAUSTED ... memory).
OOM_PATTERN = re.compile(
    r"CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|CUDA out of memory|"
    r"out of memory|RESOURCE_EXHAUSTED: Out of memory",
    re.IGNORECASE,
)
OOM_REASON = "GpuOutOfMemory"
# How far back in a failed sharer's log its out-of-memory error is looked for.
OOM_LOG_LINES = 200


@dataclass(frozen=True, slots=True)
class MpsLimits:
    """What one sharing pod may use of its GPU, enforced by MPS."""

    memory_mib: int  # device memory (pinned device memory limit)
    thread_percentage: int  # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, 1..100

    def as_dict(self) -> dict[str, int | str]:
        """For the API and pages."""
        return {
            "mechanism": "mps",
            "gpu_memory_mib": self.memory_mib,
            "active_thread_percentage": self.thread_percentage,
        }


def mps_limits(
    share: float | None, gpu_memory_mib: int, device_memory_mib: int
) -> MpsLimits | None:
    """The limits of a pod holding `share` of a device of `device_memory_mib` (the share the
    cycle computed, memory requests included) and, when it asked for memory, that amount.

    Memory: what it asked, else share times the device's memory, rounded down to whole MiB
    (never more than the device). Compute: the share as a percentage, rounded up so a small
    share still gets at least 1 %. None when the pod shares nothing, or the device's
    memory is unknown and nothing was asked in MiB (no limit can be computed honestly)."""
    if share is None or share <= 0:
        return None
    if gpu_memory_mib > 0:
        memory = (
            gpu_memory_mib if device_memory_mib <= 0 else min(gpu_memory_mib, device_memory_mib)
        )
    elif device_memory_mib > 0:
        memory = math.floor(min(share, 1.0) * device_memory_mib)
    else:
        return None
    percentage = min(100, max(1, math.ceil(round(share * 100, 6))))
    return MpsLimits(memory_mib=max(1, memory), thread_percentage=percentage)


def allocation_mps(allocation: Any, device_memory_mib: int) -> MpsLimits | None:
    """The limits of a PodAllocation row (its shared GPU's memory given): None for whole
    GPUs, or no GPU."""
    if allocation.shared_gpu_index is None or allocation.gpu_share is None:
        return None
    return mps_limits(float(allocation.gpu_share), allocation.gpu_memory_mib, device_memory_mib)


def mps_env(limits: MpsLimits, pipe_directory: str) -> dict[str, str]:
    """The variables a sharing pod's process gets. Its only device is ordinal 0: the
    backends show it that one GPU (CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES)."""
    return {
        "CUDA_MPS_PIPE_DIRECTORY": pipe_directory,
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={limits.memory_mib}M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(limits.thread_percentage),
    }


def mps_enabled(cluster_config: dict | None) -> bool:
    """Whether a cluster enforces its shares through MPS: yes unless its config says
    `mps: false` (a Kubernetes cluster whose namespaces may not run hostIPC pods shares
    GPUs by bookkeeping only, and its pages say so)."""
    return not (isinstance(cluster_config, dict) and cluster_config.get("mps", True) is False)


def client_visible_devices(device: str) -> str:
    """CUDA_VISIBLE_DEVICES for a sharer whose daemon was started with
    CUDA_VISIBLE_DEVICES=`device`. The MPS server renumbers what it sees from 0, so a client
    that kept an index (say 1) would ask for a device the server lacks; NVIDIA's advice is
    a UUID, which means the same GPU on both sides."""
    return device if device.startswith(("GPU-", "MIG-")) else "0"


def died_of_gpu_oom(exit_code: int | None, log_tail: str) -> bool:
    """A failed sharer whose log says its CUDA allocation failed: it went past its own
    limit (MPS refuses that client alone). Exit code 0 is never a failure."""
    return exit_code not in (None, 0) and bool(OOM_PATTERN.search(log_tail))


def oom_message(limits: MpsLimits | None) -> str:
    limit = f" of {limits.memory_mib} MiB" if limits is not None else ""
    return (
        f"It ran out of its GPU memory{limit} (CUDA out of memory): the limit is enforced "
        "per sharer, so ask for more GPU memory or a larger portion."
    )
