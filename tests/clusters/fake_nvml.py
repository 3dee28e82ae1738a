"""An NVML stand-in for MIG, as strict as the driver where GPUPool's calls meet it.

It has the pynvml calls clusters/agent/mig.py makes, raises pynvml's own NVMLError codes
where the driver refuses, and adds what the driver adds (GPU instance ids, MIG device
UUIDs). Refused like the driver: any MIG call on a GPU not in MIG mode (NOT_SUPPORTED), a
profile the model lacks (NOT_SUPPORTED), a placement that is not one of the profile's
(INVALID_ARGUMENT), one overlapping another instance (INSUFFICIENT_RESOURCES), destroying a
GPU instance that still has compute instances, or a compute instance a process uses
(IN_USE). There is no call to change MIG mode: GPUPool must never need one.
tests/clusters/test_mig_nvml.py tests this strictness.
"""

from __future__ import annotations

import ctypes
import itertools
import uuid as uuidlib
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml

from clusters.agent.mig import GI_PROFILE
from scheduling.engine.mig import profiles_for

NVMLError = pynvml.NVMLError
c_nvmlGpuInstancePlacement_t = pynvml.c_nvmlGpuInstancePlacement_t


def _fail(code: int) -> None:
    raise pynvml.NVMLError(code)


@dataclass(eq=False)
class Ci:
    gi: Gi
    profile_id: int
    uuid: str
    in_use: bool = False  # a process runs on it


@dataclass(eq=False)
class Gi:
    gpu: FakeGpu
    id: int
    profile_id: int
    start: int
    size: int
    cis: list[Ci] = field(default_factory=list)
    alive: bool = True

    @property
    def mask(self) -> int:
        return ((1 << self.size) - 1) << self.start


@dataclass(eq=False)
class FakeGpu:
    name: str
    memory_mib: int
    mig: bool
    gis: list[Gi] = field(default_factory=list)


class FakeNvml:
    NVMLError = NVMLError
    c_nvmlGpuInstancePlacement_t = c_nvmlGpuInstancePlacement_t

    def __init__(self, gpus: list[FakeGpu]):
        self.gpus = gpus
        self._ids = itertools.count(1)
        self.calls: list[str] = []

    # -- devices ---------------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if not 0 <= index < len(self.gpus):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> str:
        return gpu.name

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(total=gpu.memory_mib * 1024 * 1024)

    def nvmlDeviceGetMigMode(self, gpu: FakeGpu) -> tuple[int, int]:
        mode = int(gpu.mig)
        return mode, mode

    def nvmlDeviceGetUUID(self, device: object) -> str:
        if isinstance(device, Ci):
            return device.uuid
        return f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_OID, device.name)}"

    # -- GPU instances ---------------------------------------------------------------
    def _mig(self, gpu: FakeGpu) -> None:
        if not gpu.mig:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _profile(self, gpu: FakeGpu, profile_id: int):
        by_id = {
            GI_PROFILE[(p.slices, p.size)]: p
            for p in profiles_for(gpu.name, gpu.memory_mib).values()
        }
        if profile_id not in by_id:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return by_id[profile_id]

    def nvmlDeviceGetGpuInstances(self, gpu: FakeGpu, profile_id: int) -> list[Gi]:
        self._mig(gpu)
        self._profile(gpu, profile_id)
        return [gi for gi in gpu.gis if gi.profile_id == profile_id]

    def nvmlGpuInstanceGetInfo(self, gi: Gi) -> SimpleNamespace:
        if not gi.alive:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return SimpleNamespace(
            id=gi.id,
            profileId=gi.profile_id,
            placement=SimpleNamespace(start=gi.start, size=gi.size),
        )

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, gpu, profile_id, placement_ref) -> Gi:
        self.calls.append("create_gi")
        self._mig(gpu)
        profile = self._profile(gpu, profile_id)
        # The C call takes a pointer to the placement: a struct passed by value is a bug.
        if not isinstance(placement_ref, type(ctypes.byref(c_nvmlGpuInstancePlacement_t()))):
            raise TypeError("placement must be passed by reference (ctypes.byref)")
        placement = placement_ref._obj
        if placement.size != profile.size or placement.start not in profile.starts:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gi = Gi(gpu, next(self._ids), profile_id, placement.start, placement.size)
        if any(other.mask & gi.mask for other in gpu.gis):
            _fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gpu.gis.append(gi)
        return gi

    def nvmlGpuInstanceDestroy(self, gi: Gi) -> None:
        self.calls.append("destroy_gi")
        if not gi.alive:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if gi.cis:
            _fail(pynvml.NVML_ERROR_IN_USE)
        gi.alive = False
        gi.gpu.gis.remove(gi)

    # -- compute instances -----------------------------------------------------------
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: Gi, profile_id: int, engine: int):
        slices = self._profile(gi.gpu, gi.profile_id).slices
        if profile_id not in range(5) or [1, 2, 3, 4, 7][profile_id] > slices:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(id=profile_id)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: Gi, profile_id: int) -> Ci:
        self.calls.append("create_ci")
        if not gi.alive:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, profile_id, 0)
        if gi.cis:  # one CI already takes the whole GI
            _fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci = Ci(gi, profile_id, f"MIG-{uuidlib.uuid4()}")
        gi.cis.append(ci)
        return ci

    def nvmlGpuInstanceGetComputeInstances(self, gi: Gi, profile_id: int) -> list[Ci]:
        return [ci for ci in gi.cis if ci.profile_id == profile_id]

    def nvmlComputeInstanceDestroy(self, ci: Ci) -> None:
        self.calls.append("destroy_ci")
        if ci.in_use:
            _fail(pynvml.NVML_ERROR_IN_USE)
        ci.gi.cis.remove(ci)

    # -- MIG devices -----------------------------------------------------------------
    def nvmlDeviceGetMaxMigDeviceCount(self, gpu: FakeGpu) -> int:
        return 7 if gpu.mig else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, gpu: FakeGpu, index: int) -> Ci:
        self._mig(gpu)
        devices = [ci for gi in sorted(gpu.gis, key=lambda g: g.id) for ci in gi.cis]
        if index >= len(devices):
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return devices[index]

    def nvmlDeviceGetGpuInstanceId(self, mig: Ci) -> int:
        return mig.gi.id
