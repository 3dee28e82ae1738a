"""Enforced GPU shares (CUDA MPS): the limits a sharer gets, the same contract on every
backend (local, simulated, Kubernetes), the agent's daemons, and the out-of-memory reason.

The daemon is the stand-in `nvidia-cuda-mps-control` of tests/clusters/fake_mps, put on
PATH; scripts/gpu/mps_check.py checks the real one on a GPU machine."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from clusters.agent.main import Agent, mps_wanted
from clusters.agent.mps import MpsDaemons
from clusters.backends import PodPhase, PodSpec, get_backend
from clusters.backends.local import LocalBackend
from clusters.metrics.api import agent_pods
from clusters.models import Backend, Gpu, Node, SimulatedPod
from clusters.pod_users import pod_uid
from clusters.podspecs import pod_specs_for
from clusters.reconcile import cluster_reconcile
from clusters.sharing import (
    OOM_REASON,
    POD_PIPE_DIRECTORY,
    MpsLimits,
    client_visible_devices,
    died_of_gpu_oom,
    mps_env,
    mps_limits,
)
from clusters.tasks import sync_inventory
from scheduling.models import PodAllocation, WorkloadState
from tests.clusters.conftest import admit, make_cluster, make_node, make_workload
from tests.clusters.fake_apiserver import ApiError, _validate_volumes
from tests.clusters.kube import k8s_name, kube  # noqa: F401 - the fixture
from tests.clusters.test_local_backend import wait_until
from tests.clusters.test_local_sandbox import needs_sandbox

FAKE = Path(__file__).with_name("fake_mps")
S = WorkloadState
PY = sys.executable
MPS_KEYS = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")  # fmt: skip
pytestmark = pytest.mark.timeout(60)


# --- the limits ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("share", "asked_mib", "device_mib", "expected"),
    [
        (0.25, 0, 81920, MpsLimits(20480, 25)),  # a portion: that part of the memory
        (0.25, 20480, 81920, MpsLimits(20480, 25)),  # memory asked: exactly that
        (0.333, 0, 40960, MpsLimits(13639, 34)),  # rounded down (memory), up (compute)
        (0.001, 0, 81920, MpsLimits(81, 1)),  # a sliver still gets 1 % of the SMs
        (0.5, 99999, 81920, MpsLimits(81920, 50)),  # never more than the device
        (0.5, 2048, 0, MpsLimits(2048, 50)),  # memory asked on a device of unknown size
    ],
)
def test_the_limits_come_from_what_the_pod_asked(share, asked_mib, device_mib, expected):
    assert mps_limits(share, asked_mib, device_mib) == expected


def test_no_limits_without_a_share_or_anything_to_compute_them_from():
    assert mps_limits(None, 0, 81920) is None
    assert mps_limits(0.0, 0, 81920) is None
    assert mps_limits(0.5, 0, 0) is None  # a portion of unknown memory: no honest number


def test_a_sharer_names_its_gpu_as_the_mps_server_numbers_it():
    assert client_visible_devices("GPU-8932f937") == "GPU-8932f937"
    assert client_visible_devices("3") == "0"  # the server sees one device: its 0


def test_the_environment_is_nvidias_syntax_for_device_zero():
    assert mps_env(MpsLimits(2048, 25), "/run/x") == {
        "CUDA_MPS_PIPE_DIRECTORY": "/run/x",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2048M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
    }


@pytest.mark.parametrize(
    ("code", "log", "expected"),
    [
        (1, "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", True),
        (1, "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY", True),
        (1, "Traceback: KeyError 'x'", False),
        (0, "CUDA out of memory (caught and retried smaller)", False),
        (None, "CUDA_ERROR_OUT_OF_MEMORY", False),
    ],
)
def test_only_a_failure_whose_log_says_out_of_memory_counts_as_one(code, log, expected):
    assert died_of_gpu_oom(code, log) is expected


# --- the podspecs: every backend gets the same limits ----------------------------------------
def test_pod_specs_carry_the_limits_of_shared_pods_only(org):
    cluster = make_cluster()
    node = make_node(cluster, "here", gpus=2)
    half = make_workload(org.project_a, org.researcher, "half")
    mem = make_workload(org.project_a, org.researcher, "mem")
    whole = make_workload(org.project_a, org.researcher, "whole")
    admit(half, node, pods=[{"shared_gpu_index": 1, "gpu_share": 0.5}])
    admit(mem, node, pods=[{"shared_gpu_index": 1, "gpu_share": 0.25}])
    PodAllocation.objects.filter(workload=mem).update(gpu_memory_mib=20000)
    admit(whole, node, pods=[{"gpu_indices": [0]}])
    allocations = list(PodAllocation.objects.select_related("workload", "node").order_by("id"))
    specs = {s.workload_name: s for s in pod_specs_for(allocations, cluster)}
    assert specs["half"].mps == MpsLimits(40960, 50)
    assert specs["mem"].mps == MpsLimits(20000, 25)
    assert specs["whole"].mps is None


# --- local backend: a real child daemon, the limits in the process's environment --------------
@pytest.fixture
def fake_mps_on_path(monkeypatch):
    monkeypatch.setenv("PATH", f"{FAKE}:{os.environ['PATH']}")


@pytest.fixture
def local(db, fake_mps_on_path):
    backend = LocalBackend(make_cluster(config={"node_name": "here", "sandbox": False}))
    yield backend
    backend.stop_all(grace_period_s=0)
    backend.mps.stop_all()


def sharer(name: str, index: int = 1, *, code: str, **fields) -> PodSpec:
    return PodSpec(
        name=name, namespace="ns", workload_id=int(name.split("-")[1]), pod_index=0,
        node_name="here", command=(PY, "-c", code), shared_gpu_index=index,
        shared_gpu_uuid=f"GPU-here-{index}", gpu_share=0.25, mps=MpsLimits(2048, 25),
        submitted_by_admin=True, **fields,
    )  # fmt: skip


PRINT_ENV = "import os, json; print(json.dumps({k: v for k, v in os.environ.items()}))"


def _env_printed(backend: LocalBackend, name: str) -> dict[str, str]:
    wait_until(lambda: backend.pod_statuses()[name].phase == PodPhase.SUCCEEDED)
    return json.loads(backend.pod_logs(name, "ns").strip().splitlines()[-1])


def test_a_local_sharer_starts_only_with_its_gpus_daemon_and_gets_its_limits(local):
    local.ensure_pod(sharer("gp-7-0", code=PRINT_ENV))
    device = "GPU-here-1"
    assert local.mps.pid(device) is not None  # started before the process
    log = (local.mps.log_dir(device) / "control.log").read_text()
    assert f"CUDA_VISIBLE_DEVICES={device}" in log
    env = _env_printed(local, "gp-7-0")
    # The UUID, as the daemon was given it: an index would be renumbered by the MPS server.
    assert env["CUDA_VISIBLE_DEVICES"] == device
    assert {k: env[k] for k in MPS_KEYS} == mps_env(
        MpsLimits(2048, 25), str(local.mps.pipe_dir(device))
    )


def test_a_whole_gpu_pod_gets_no_mps_variables_and_no_daemon(local):
    spec = PodSpec(
        name="gp-8-0", namespace="ns", workload_id=8, pod_index=0, node_name="here",
        command=(PY, "-c", PRINT_ENV), gpu_indices=(0,), submitted_by_admin=True,
    )  # fmt: skip
    local.ensure_pod(spec)
    env = _env_printed(local, "gp-8-0")
    assert not any(k.startswith("CUDA_MPS_") for k in env)
    assert local.mps.keys() == []


def test_the_local_daemon_is_restarted_if_it_dies_and_stopped_after_the_last_sharer(local):
    long = "import time; time.sleep(60)"
    first, second = sharer("gp-7-0", code=long), sharer("gp-9-0", code=long)
    local.reconcile([first, second], grace_period_s=0)
    device = "GPU-here-1"
    pid = local.mps.pid(device)
    os.kill(pid, 9)
    wait_until(lambda: local.mps.pid(device) is None)
    local.reconcile([first, second], grace_period_s=0)
    assert local.mps.pid(device) not in (None, pid)  # watched: started again
    local.reconcile([second], grace_period_s=0)  # one sharer left: still shared
    wait_until(lambda: "gp-7-0" not in local.pod_statuses())
    local.reconcile([second], grace_period_s=0)
    assert local.mps.pid(device) is not None
    wait_until(lambda: local.reconcile([], grace_period_s=0).statuses == {})
    local.reconcile([], grace_period_s=0)
    assert local.mps.keys() == []  # the last sharer is gone: the GPU leaves MPS mode


def test_mps_false_in_a_clusters_config_turns_enforcement_off(db, fake_mps_on_path):
    backend = LocalBackend(
        make_cluster(config={"node_name": "here", "sandbox": False, "mps": False})
    )
    try:
        backend.ensure_pod(sharer("gp-7-0", code=PRINT_ENV))
        env = _env_printed(backend, "gp-7-0")
        assert not any(k.startswith("CUDA_MPS_") for k in env)
        assert backend.mps.keys() == []
    finally:
        backend.stop_all(grace_period_s=0)


def test_without_the_mps_executable_a_local_sharer_fails_saying_why(db, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    backend = LocalBackend(make_cluster(config={"node_name": "here", "sandbox": False}))
    report = backend.reconcile([sharer("gp-7-0", code=PRINT_ENV)], grace_period_s=0)
    status = report.statuses["gp-7-0"]
    assert status.phase == PodPhase.FAILED
    assert "cannot be enforced" in status.message and "nvidia-cuda-mps-control" in status.message


def test_a_sharer_that_ran_out_of_its_memory_fails_with_that_reason(org, fake_mps_on_path):
    cluster = make_cluster(config={"node_name": "here", "sandbox": False})
    node = make_node(cluster, "here", gpus=2)
    oom = make_workload(
        org.project_a, org.platform_admin, "oom",
        command=[PY, "-c", "print('cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY'); raise SystemExit(1)"],
    )  # fmt: skip
    crash = make_workload(
        org.project_a, org.platform_admin, "crash", command=[PY, "-c", "raise SystemExit(3)"]
    )
    admit(oom, node, pods=[{"shared_gpu_index": 1, "gpu_share": 0.25}])
    admit(crash, node, pods=[{"shared_gpu_index": 1, "gpu_share": 0.25}])
    try:
        wait_until(lambda: cluster_reconcile(cluster) and _refreshed(oom).state == S.FAILED)
        wait_until(lambda: cluster_reconcile(cluster) and _refreshed(crash).state == S.FAILED)
    finally:
        LocalBackend(cluster).stop_all(grace_period_s=0)
        LocalBackend(cluster).mps.stop_all()
    reasons = dict(oom.events.values_list("reason", "message"))
    assert "20480 MiB" in reasons[OOM_REASON] and "out of memory" in reasons[OOM_REASON]
    assert "PodFailed" not in reasons
    assert set(crash.events.values_list("reason", flat=True)) >= {"PodFailed"}
    assert OOM_REASON not in set(crash.events.values_list("reason", flat=True))


def _refreshed(workload):
    workload.refresh_from_db()
    return workload


# --- simulated: the same contract, kept with the simulated pod ------------------------------
def test_a_simulated_sharer_is_given_the_same_limits_as_a_kubernetes_one(org):
    cluster = make_cluster(
        "sim", backend=Backend.SIMULATED,
        config={"nodes": [{"name": "s0", "gpus": 2, "gpu_memory_mib": 40960}]},
    )  # fmt: skip
    sync_inventory(cluster.pk)
    node = Node.objects.get(cluster=cluster, name="s0")
    half = make_workload(org.project_a, org.researcher, "half")
    admit(half, node, pods=[{"shared_gpu_index": 0, "gpu_share": 0.5}])
    cluster_reconcile(cluster)
    pod = SimulatedPod.objects.get(cluster=cluster)
    assert {k: pod.env[k] for k in MPS_KEYS} == mps_env(MpsLimits(20480, 50), POD_PIPE_DIRECTORY)
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M" in get_backend(cluster).pod_logs(
        pod.name, pod.namespace
    )
    assert Gpu.objects.get(node=node, index=0).mps_device  # the agent would run it


# --- Kubernetes: env, the pipe folder from the host, hostIPC; the agent's daemons -------------
def test_a_kubernetes_sharer_mounts_its_gpus_pipe_and_shares_the_host_ipc(kube, org):  # noqa: F811
    fake = kube.require_fake()
    cluster = kube.cluster()
    kube.nodes(cluster)
    node = Node.objects.get(name="gpu-a")
    half = make_workload(org.project_a, org.researcher, "half", command=["sleep", "1"])
    whole = make_workload(org.project_a, org.researcher, "whole", command=["sleep", "1"])
    admit(half, node, pods=[{"shared_gpu_index": 3, "gpu_share": 0.25}])
    admit(whole, node, pods=[{"gpu_indices": [0]}])
    for _ in range(3):  # the reservation, its device, the shared pod
        assert cluster_reconcile(cluster).errors == []
    shared = fake.pod("gp-ml-vision", k8s_name(cluster, f"gp-{half.pk}-0"))["spec"]
    container = shared["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    device = env["NVIDIA_VISIBLE_DEVICES"]
    assert {k: env[k] for k in MPS_KEYS} == mps_env(MpsLimits(20480, 25), POD_PIPE_DIRECTORY)
    assert shared["hostIPC"] is True
    [volume] = [v for v in shared["volumes"] if "hostPath" in v]
    assert volume["hostPath"] == {"path": f"/run/gpupool/mps/{device}/pipe", "type": "Directory"}
    assert {"name": volume["name"], "mountPath": POD_PIPE_DIRECTORY} in container["volumeMounts"]
    plain = fake.pod("gp-ml-vision", k8s_name(cluster, f"gp-{whole.pk}-0"))["spec"]
    assert "hostIPC" not in plain and not any(k.startswith("CUDA_MPS") for k in str(plain))
    # The agent of gpu-a learns which device's daemon to run.
    rows = {r["workload_id"]: r for r in agent_pods(node.pk)}
    assert rows[half.pk]["mps_device"] == device and rows[whole.pk]["mps_device"] == ""
    assert mps_wanted(list(rows.values())) == {device: device}


def test_the_fake_api_server_refuses_a_host_path_the_real_one_refuses(kube):  # noqa: F811
    for bad in (
        {"name": "p", "hostPath": {"path": ""}},
        {"name": "p", "hostPath": {"path": "/run/../etc"}},
        {"name": "p", "hostPath": {"path": "/run/x", "type": "Folder"}},
        {"name": "p"},
        {"name": "p", "hostPath": {"path": "/x"}, "emptyDir": {}},
    ):
        with pytest.raises(ApiError):
            _validate_volumes([bad])
    assert _validate_volumes([{"name": "p", "hostPath": {"path": "/x", "type": "Directory"}}])


class _Shipper:
    portal = "test"

    def __init__(self, answers):
        self.answers = list(answers)
        self.buffer: list = []
        self.reports: list = []

    def pods(self):
        return self.answers.pop(0)

    def report_mps(self, running):
        self.reports.append(running)
        return True

    def add(self, samples):
        self.buffer += samples

    def flush(self):
        return True


class _Sampler:
    def read(self):
        return []


def test_the_agent_runs_a_daemon_per_shared_gpu_and_stops_none_while_cut_off(tmp_path):
    with tempfile.TemporaryDirectory(dir="/tmp") as root:
        daemons = MpsDaemons(Path(root) / "mps", path=f"{FAKE}:{os.environ['PATH']}")
        pod = {"id": 11, "workload_id": 1, "pod_index": 0, "backend_ref": "",
               "shared_gpu_index": 2, "mps_device": "GPU-x-2"}  # fmt: skip
        whole = {"id": 12, "workload_id": 2, "pod_index": 0, "backend_ref": "",
                 "shared_gpu_index": None, "mps_device": ""}  # fmt: skip
        # A daemon that cannot start (its pipe's path too long for a socket) is not said to run.
        stuck = {**pod, "id": 13, "shared_gpu_index": 3, "mps_device": "GPU-" + "y" * 90}
        shipper = _Shipper([[pod, whole, stuck], None, [whole]])
        agent = Agent(_Sampler(), shipper, pods_every_s=0, mps=daemons)
        try:
            agent.tick()
            assert daemons.keys() == ["GPU-x-2"] and daemons.pid("GPU-x-2") is not None
            # It says the daemon runs, for the allocation it was told of (a native sharer's
            # Binding waits for that: clusters/mps_report.py).
            assert shipper.reports == [{"GPU-x-2": [11]}]
            agent.tick()  # the portal did not answer: nothing stops, nothing said
            assert daemons.pid("GPU-x-2") is not None and len(shipper.reports) == 1
            agent.tick()  # no sharer left on that GPU
            assert daemons.keys() == [] and shipper.reports[-1] == {}
        finally:
            daemons.stop_all()


@needs_sandbox
def test_a_sandboxed_sharer_reaches_its_pipe_folder_and_the_hosts_shared_memory(
    db, fake_mps_on_path
):
    backend = LocalBackend(make_cluster(config={"node_name": "here"}))
    marker = Path("/dev/shm") / f"gpupool-mps-test-{os.getpid()}"
    marker.write_text("host")
    code = (
        "import os, json; p = os.environ['CUDA_MPS_PIPE_DIRECTORY'];"
        f"print(json.dumps({{'pipe': os.path.isdir(p), 'shm': os.path.exists('{marker}'),"
        "'uid': os.getuid()}))"
    )
    try:
        backend.ensure_pod(replace(sharer("gp-7-0", code=code), submitted_by_admin=False))
        seen = _env_printed(backend, "gp-7-0")
    finally:
        marker.unlink()
        backend.stop_all(grace_period_s=0)
        backend.mps.stop_all()
    assert seen == {"pipe": True, "shm": True, "uid": pod_uid(7)}


# --- the API and the workload page show what is enforced ------------------------------------
def test_the_api_and_the_workload_page_show_the_enforced_limits(org, client_as):
    from django.urls import reverse
    from rest_framework.test import APIClient

    cluster = make_cluster()
    node = make_node(cluster, "here", gpus=2)
    half = make_workload(org.project_a, org.researcher, "half")
    whole = make_workload(org.project_a, org.researcher, "whole")
    admit(half, node, pods=[{"shared_gpu_index": 1, "gpu_share": 0.25}])
    admit(whole, node, pods=[{"gpu_indices": [0]}])
    api = APIClient()
    api.force_authenticate(org.researcher)
    body = api.get(reverse("api-workload", args=[half.pk])).json()
    assert body["allocations"][0]["enforced_limits"] == {
        "mechanism": "mps", "gpu_memory_mib": 20480, "active_thread_percentage": 25,
    }  # fmt: skip
    body = api.get(reverse("api-workload", args=[whole.pk])).json()
    assert body["allocations"][0]["enforced_limits"] is None
    page = client_as(org.researcher).get(reverse("workload_detail", args=[half.pk]))
    assert "enforced: 20480 MiB, 25 % of SMs (MPS)" in page.content.decode()
    cluster.config = {"mps": False}
    cluster.save(update_fields=["config"])
    body = api.get(reverse("api-workload", args=[half.pk])).json()
    assert body["allocations"][0]["enforced_limits"] is None
    page = client_as(org.researcher).get(reverse("workload_detail", args=[half.pk]))
    assert "not enforced (MPS off on this cluster)" in page.content.decode()
    outsider = APIClient()
    outsider.force_authenticate(org.outsider)
    assert outsider.get(reverse("api-workload", args=[half.pk])).status_code in (403, 404)


def test_the_nodes_page_and_api_show_each_shares_enforced_limits(org, client_as):
    from django.urls import reverse

    cluster = make_cluster()
    node = make_node(cluster, "here", gpus=2)
    node.pool = org.pool
    node.save(update_fields=["pool"])
    half = make_workload(org.project_a, org.researcher, "half")
    admit(half, node, pods=[{"shared_gpu_index": 1, "gpu_share": 0.25}])
    page = client_as(org.researcher).get(reverse("node_list")).content.decode()
    assert "[MPS: 20 GiB, 25 % SMs]" in page
    rows = client_as(org.researcher).get(reverse("api-nodes")).json()
    [share] = [s for r in rows for g in r["gpus"] for s in g["shares"]]
    assert share["mps"] == {"mechanism": "mps", "gpu_memory_mib": 20480,
                            "active_thread_percentage": 25}  # fmt: skip
