"""The node side of dynamic MIG: make a GPU's MIG instances match what the scheduler wants,
through NVML (pynvml's MIG calls), and report each instance's MIG device UUID.

`MigInstances(nvml).sync(index, wanted)` is level-triggered, for one GPU already in MIG mode
(it never changes the mode: that needs an idle GPU and, on many systems, a reset, which is
the admin's call):

1. read the GPU instances (GIs) there are, per GI profile, with their placements;
2. destroy the GIs nobody wants: their compute instances (CIs) first, then the GI (NVML
   refuses to destroy a GI that still has CIs, or one whose CI a process uses: that GI stays
   and the error is reported; the scheduler never asks to destroy an instance in use);
3. create the wanted GIs that are missing, each at its placement
   (nvmlDeviceCreateGpuInstanceWithPlacement), and one CI taking the whole GI;
4. read the MIG devices back: {start: "MIG-<uuid>"}.

`nvml` is the pynvml module, or a stand-in with the same calls (tests/clusters/fake_nvml.py,
as strict as the driver). docs/mig.md.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from typing import Any

from scheduling.engine.mig import Profile, profiles_for

log = logging.getLogger(__name__)

# GI profile ids (nvml.h NVML_GPU_INSTANCE_PROFILE_*) by (compute slices, memory slices).
GI_PROFILE = {(1, 1): 0, (1, 2): 9, (2, 2): 1, (3, 4): 2, (4, 4): 3, (7, 8): 4}
# CI profile ids (NVML_COMPUTE_INSTANCE_PROFILE_*) by compute slices: one CI takes the GI.
CI_PROFILE = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}
CI_ENGINE_SHARED = 0  # NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE


class MigError(RuntimeError):
    """The GPU cannot hold what was asked (not in MIG mode, unknown model)."""


@dataclass(frozen=True, slots=True)
class SyncResult:
    devices: dict[int, str]  # start -> MIG device UUID
    errors: list[str]


class MigInstances:
    def __init__(self, nvml: Any):
        self.nvml = nvml

    def sync(
        self, index: int, wanted: list[tuple[str, int]], *, destroy: bool = True
    ) -> SyncResult:
        """Make GPU `index` hold exactly `wanted` [(profile, start)] (module docstring).
        `destroy` False (a node pool whose admin forbids repartitioning): instances nobody
        wants are kept, and a wanted one they overlap is an error, not a destruction."""
        nvml = self.nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        if current != MIG_ENABLED:
            raise MigError(f"GPU {index} is not in MIG mode; GPUPool never changes the mode")
        profiles = profiles_for(_text(nvml.nvmlDeviceGetName(handle)), _memory_mib(nvml, handle))
        if not profiles:
            raise MigError(f"GPU {index}: no MIG profile table for its model")
        want = {start: profiles[name] for name, start in wanted if name in profiles}
        errors: list[str] = []
        have = self._instances(handle, profiles)
        for start, (profile, gi) in sorted(have.items()):
            if destroy and want.get(start) is not profile:
                errors += self._destroy(gi, profile, index, start)
        have = self._instances(handle, profiles)
        for start, profile in sorted(want.items()):
            if start not in have:
                errors += self._create(handle, profile, start, index)
            elif have[start][0] is not profile:
                errors.append(f"GPU {index}: {profile.name} at {start} not made: in use")
        # Only the wanted shapes are reported: a pod must never get another shape's device.
        have = self._instances(handle, profiles)
        devices = self._devices(handle, profiles)
        ok = {s for s, (p, _) in have.items() if want.get(s) is p}
        return SyncResult({s: u for s, u in devices.items() if s in ok}, errors)

    def _instances(self, handle: Any, profiles: dict[str, Profile]) -> dict[int, tuple]:
        """start -> (profile, GI handle) of the GIs on the GPU."""
        found = {}
        for profile in profiles.values():
            for gi in self.nvml.nvmlDeviceGetGpuInstances(handle, _gi_profile(profile)):
                info = self.nvml.nvmlGpuInstanceGetInfo(gi)
                found[int(info.placement.start)] = (profile, gi)
        return found

    def _destroy(self, gi: Any, profile: Profile, index: int, start: int) -> list[str]:
        nvml = self.nvml
        try:
            for ci in nvml.nvmlGpuInstanceGetComputeInstances(gi, CI_PROFILE[profile.slices]):
                nvml.nvmlComputeInstanceDestroy(ci)
            nvml.nvmlGpuInstanceDestroy(gi)
        except nvml.NVMLError as exc:
            return [f"GPU {index}: cannot destroy {profile.name} at {start}: {exc}"]
        log.info("GPU %s: destroyed MIG %s at slice %s", index, profile.name, start)
        return []

    def _create(self, handle: Any, profile: Profile, start: int, index: int) -> list[str]:
        nvml = self.nvml
        placement = nvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, profile.size
        try:
            gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                handle, _gi_profile(profile), ctypes.byref(placement)
            )
            ci_info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, CI_PROFILE[profile.slices], CI_ENGINE_SHARED
            )
            nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
        except nvml.NVMLError as exc:
            return [f"GPU {index}: cannot create {profile.name} at {start}: {exc}"]
        log.info("GPU %s: created MIG %s at slice %s", index, profile.name, start)
        return []

    def _devices(self, handle: Any, profiles: dict[str, Profile]) -> dict[int, str]:
        """start -> UUID of each MIG device (a GI with its CI) the GPU shows."""
        nvml = self.nvml
        starts = {}
        for profile in profiles.values():
            for gi in nvml.nvmlDeviceGetGpuInstances(handle, _gi_profile(profile)):
                info = nvml.nvmlGpuInstanceGetInfo(gi)
                starts[int(info.id)] = int(info.placement.start)
        devices = {}
        for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
            except nvml.NVMLError:
                continue  # NOT_FOUND: no MIG device at this index
            gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
            if gi_id in starts:
                devices[starts[gi_id]] = _text(nvml.nvmlDeviceGetUUID(mig))
        return devices


def _gi_profile(profile: Profile) -> int:
    return GI_PROFILE[(profile.slices, profile.size)]


def _memory_mib(nvml: Any, handle: Any) -> int:
    return int(nvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
