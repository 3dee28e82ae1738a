"""The node side of dynamic MIG against the NVML stand-in, and the stand-in's strictness."""

from __future__ import annotations

import ctypes

import pynvml
import pytest

from clusters.agent.mig import MigError, MigInstances
from tests.clusters.fake_nvml import FakeGpu, FakeNvml

H100 = ("NVIDIA H100 80GB HBM3", 81559)


def nvml(mig: bool = True) -> FakeNvml:
    return FakeNvml([FakeGpu(*H100, mig=mig), FakeGpu(*H100, mig=False)])


def placement(start: int, size: int):
    p = pynvml.c_nvmlGpuInstancePlacement_t()
    p.start, p.size = start, size
    return ctypes.byref(p)


# -- the stand-in refuses what the driver refuses ------------------------------------------


def test_the_stand_in_refuses_an_illegal_placement():
    fake = nvml()
    gpu = fake.gpus[0]
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 2, placement(2, 4))  # 3g at 2
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 2, placement(0, 2))  # wrong size


def test_the_stand_in_refuses_overlapping_instances():
    fake = nvml()
    gpu = fake.gpus[0]
    fake.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 2, placement(4, 4))
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        fake.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 0, placement(5, 1))


def test_the_stand_in_refuses_destroying_a_gpu_instance_with_compute_instances():
    fake = nvml()
    gi = fake.nvmlDeviceCreateGpuInstanceWithPlacement(fake.gpus[0], 0, placement(0, 1))
    fake.nvmlGpuInstanceCreateComputeInstance(gi, 0)
    with pytest.raises(pynvml.NVMLError_InUse):
        fake.nvmlGpuInstanceDestroy(gi)


def test_the_stand_in_refuses_mig_calls_on_a_gpu_not_in_mig_mode():
    fake = nvml()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceCreateGpuInstanceWithPlacement(fake.gpus[1], 0, placement(0, 1))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetGpuInstances(fake.gpus[1], 0)


def test_the_stand_in_refuses_a_placement_passed_by_value_and_has_no_mode_switch():
    fake = nvml()
    by_value = pynvml.c_nvmlGpuInstancePlacement_t()
    with pytest.raises(TypeError):
        fake.nvmlDeviceCreateGpuInstanceWithPlacement(fake.gpus[0], 0, by_value)
    assert not hasattr(fake, "nvmlDeviceSetMigMode")


# -- the agent's sync ----------------------------------------------------------------------


def test_sync_creates_the_wanted_instances_and_reports_their_uuids():
    fake = nvml()
    result = MigInstances(fake).sync(0, [("3g.40gb", 4), ("1g.10gb", 0)])
    assert result.errors == []
    assert sorted(result.devices) == [0, 4]
    assert all(uuid.startswith("MIG-") for uuid in result.devices.values())
    assert fake.calls == ["create_gi", "create_ci", "create_gi", "create_ci"]


def test_sync_keeps_what_is_wanted_and_destroys_only_the_rest():
    fake = nvml()
    agent = MigInstances(fake)
    first = agent.sync(0, [("3g.40gb", 4), ("1g.10gb", 0)]).devices
    fake.calls.clear()
    second = agent.sync(0, [("3g.40gb", 4), ("2g.20gb", 0)]).devices
    assert second[4] == first[4]  # the same instance: nothing happened to it
    assert second[0] != first[0]
    assert fake.calls == ["destroy_ci", "destroy_gi", "create_gi", "create_ci"]


def test_an_instance_whose_compute_instance_is_in_use_is_left_and_reported():
    fake = nvml()
    agent = MigInstances(fake)
    agent.sync(0, [("1g.10gb", 0)])
    fake.gpus[0].gis[0].cis[0].in_use = True
    result = agent.sync(0, [("7g.80gb", 0)])
    assert len(result.errors) == 2  # cannot destroy, so cannot create over it
    assert "cannot destroy 1g.10gb at 0" in result.errors[0]
    assert "7g.80gb at 0 not made" in result.errors[1]
    assert result.devices == {}  # the 1g.10gb's device is never handed out as the 7g's


def test_sync_refuses_a_gpu_not_in_mig_mode_without_touching_its_mode():
    fake = nvml()
    with pytest.raises(MigError, match="never changes the mode"):
        MigInstances(fake).sync(1, [("1g.10gb", 0)])
    assert fake.calls == []


def test_the_local_backend_makes_instances_through_nvml_and_reads_mig_mode(monkeypatch):
    from clusters.backends import localgpus

    fake = nvml()
    fake.nvmlInit = fake.nvmlShutdown = lambda: None
    fake.nvmlDeviceGetCount = lambda: len(fake.gpus)
    monkeypatch.setattr(localgpus, "nvml_module", lambda: fake)
    assert [g.mig for g in localgpus.local_gpus()] == [True, False]
    made, errors = localgpus.local_mig_sync({("here", 0): [("2g.20gb", 2)], ("here", 1): []})
    assert list(made) == [("here", 0, 2)] and made[("here", 0, 2)].startswith("MIG-")
    assert errors == ["GPU 1 is not in MIG mode; GPUPool never changes the mode"]
