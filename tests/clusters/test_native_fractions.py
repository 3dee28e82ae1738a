"""GPU fractions of pods made outside GPUPool (issue 26): a native pod asks for part of a GPU
with `gpupool.io/gpu-fraction` or `gpupool.io/gpu-memory`, shares a GPU as portal work does
(a reservation pod holds it), and takes its GPU environment (the GPU's UUID, its MPS limits)
from a ConfigMap GPUPool writes before it binds the pod (clusters/native_sharing.py).

The pod mounts its GPU's pipe folder alone (the MPS root with subPathExpr
$(GPUPOOL_MPS_PIPE), which the ConfigMap sets), and is bound only once its node's agent has
reported that GPU's MPS daemon running for it (clusters/mps_report.py).

Against the in-suite API server, whose kubelet starts no container whose envFrom ConfigMap
is missing (CreateContainerConfigError), and expands subPathExpr from the container's
environment, as a real kubelet does."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils.html import escape

from clusters import native_sharing
from clusters.backends.kubernetes.manifests import MPS_ROOT
from clusters.backends.kubernetes.reservations import UUID_ANNOTATION
from clusters.mps_report import mps_report_store
from clusters.native_sharing import (
    FRACTION,
    GPU_MEMORY,
    config_map_name,
    gpu_env,
    missing_parts,
    sharing_patch,
)
from clusters.reconcile import cluster_reconcile
from clusters.sharing import POD_PIPE_DIRECTORY, MpsLimits
from scheduling.cycle import cycle_run
from scheduling.models import PodAllocation, Workload
from scheduling.selectors import workload_why
from scheduling.services import workload_stop
from tests.clusters.conftest import agents_report
from tests.clusters.fake_apiserver import json_patch
from tests.clusters.kube import kube  # noqa: F401 - the fixture
from tests.clusters.test_kubernetes_native import (
    NS,
    kubectl_jobs,
    native_workloads,
    pod_body,
    pod_scheduled,
    setup,  # noqa: F401 - the fixture
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def native(kube, setup, org):  # noqa: F811
    """(the fake API server, the cluster, a client): the in-suite server's kubelet and
    reservation pods' logs are what these tests watch."""
    return kube.require_fake(), *setup


def share_pod(name: str, annotations: dict[str, str], *, patch: bool = True) -> dict:
    """A pod asking for a share, made ready to take one as the admission webhook would
    (`sharing_patch`): no nvidia.com/gpu, hostIPC, the MPS root, the envFrom ConfigMap."""
    body = pod_body(name, gpus=0, annotations=annotations)
    del body["spec"]["containers"][0]["resources"]["limits"]
    body["apiVersion"], body["kind"] = "v1", "Pod"
    if patch:
        ops = sharing_patch(body, config_map=config_map_name(name), mps_root=MPS_ROOT)
        body = json_patch(body, ops)
    return body


def bind_all(cluster, rounds: int = 4, *, agents: bool = True) -> None:
    """A reconcile (intake), a cycle, then passes, each followed by the agents' reports: the
    reservation pod, its device (the agent's daemon), the Bindings."""
    cluster_reconcile(cluster)
    cycle_run()
    for _ in range(rounds):
        cluster_reconcile(cluster)
        if agents:
            agents_report(cluster)


def test_sharing_patch_gives_a_bare_pod_what_a_share_needs_and_is_idempotent():
    bare = share_pod("bare", {FRACTION: "0.5"}, patch=False)
    bare["spec"]["containers"][0]["env"] = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},  # would escape its GPU
        {"name": "KEEP", "value": "1"},
    ]
    assert missing_parts(bare, mps_root=MPS_ROOT) == [
        "spec.hostIPC: true",
        f"spec.volumes hostPath {MPS_ROOT} (type Directory)",
        "containers[main].envFrom configMapRef bare-gpupool-gpu (not optional, no prefix, "
        "the last source)",
        "no containers[main].env NVIDIA_VISIBLE_DEVICES (GPUPool sets it)",
    ]
    patched = json_patch(
        bare, sharing_patch(bare, config_map="bare-gpupool-gpu", mps_root=MPS_ROOT)
    )
    assert missing_parts(patched, mps_root=MPS_ROOT) == []
    assert patched["spec"]["containers"][0]["env"] == [{"name": "KEEP", "value": "1"}]
    assert patched["spec"]["containers"][0]["envFrom"] == [
        {"configMapRef": {"name": "bare-gpupool-gpu"}}
    ]
    assert sharing_patch(patched, config_map="bare-gpupool-gpu", mps_root=MPS_ROOT) == []
    only_env = json_patch(bare, [{"op": "replace", "path": "/spec/containers/0/env/0/name",
                                  "value": "OTHER"}])  # fmt: skip
    only_env["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "x-gpupool-gpu"}}]
    assert missing_parts(only_env, mps_root=MPS_ROOT, mps=False) == []  # `mps: false`
    assert len(missing_parts(only_env, mps_root=MPS_ROOT)) == 2
    whole = pod_body("whole")  # asks for no share: nothing to add
    assert sharing_patch(whole, config_map="x-gpupool-gpu", mps_root=MPS_ROOT) == []


WHOLE_ROOT = {"name": "gpupool-mps", "mountPath": "/run/gpupool/mps"}  # as GPUPool asked before
PIPE_MOUNT = {"name": "gpupool-mps", "mountPath": POD_PIPE_DIRECTORY,
              "subPathExpr": "$(GPUPOOL_MPS_PIPE)"}  # fmt: skip


def test_a_pod_mounting_the_whole_mps_root_is_refused_and_the_patch_mounts_its_pipe_alone():
    old = share_pod("old", {FRACTION: "0.5"})
    spec = old["spec"]
    spec["containers"][0]["volumeMounts"] = [dict(WHOLE_ROOT)]
    init_mount = {**PIPE_MOUNT, "mountPath": "/mps"}  # its own env could name any GPU
    spec["initContainers"] = [{"name": "setup", "image": "x", "volumeMounts": [init_mount]}]
    assert missing_parts(old, mps_root=MPS_ROOT) == [
        "containers[main].volumeMounts gpupool-mps at /run/nvidia-mps with subPathExpr "
        "$(GPUPOOL_MPS_PIPE) (its GPU's pipe alone)",
        "no other mount of gpupool-mps: initContainers[setup] at /mps",
        "no other mount of gpupool-mps: containers[main] at /run/gpupool/mps",
    ]
    assert missing_parts(old, mps_root=MPS_ROOT, mps=False) == []  # no daemon, no pipe
    patched = json_patch(old, sharing_patch(old, config_map="old-gpupool-gpu", mps_root=MPS_ROOT))
    assert patched["spec"]["containers"][0]["volumeMounts"] == [PIPE_MOUNT]
    assert patched["spec"]["initContainers"][0]["volumeMounts"] == []
    assert missing_parts(patched, mps_root=MPS_ROOT) == []
    assert sharing_patch(patched, config_map="old-gpupool-gpu", mps_root=MPS_ROOT) == []
    # Its subPath spelled another way is not its pipe: that mount goes too.
    at = "/spec/containers/0/volumeMounts/0/subPathExpr"
    other = json_patch(patched, [{"op": "replace", "path": at, "value": "$(OTHER)"}])
    assert "no other mount of gpupool-mps: containers[main] at /run/nvidia-mps" in missing_parts(
        other, mps_root=MPS_ROOT
    )
    fixed = json_patch(other, sharing_patch(other, config_map="old-gpupool-gpu", mps_root=MPS_ROOT))
    assert fixed["spec"]["containers"][0]["volumeMounts"] == [PIPE_MOUNT]


@pytest.mark.parametrize("path", ["/", "/run", "/run/gpupool/mps/", "/run/gpupool/mps/GPU-b/pipe"])
def test_another_host_path_in_or_above_the_mps_root_is_refused_and_left_to_the_pod(path):
    pod = share_pod("peek", {FRACTION: "0.5"})
    pod["spec"]["volumes"].append({"name": "host", "hostPath": {"path": path}})
    pod["spec"]["volumes"].append({"name": "beside", "hostPath": {"path": "/run/gpupool/mpsx"}})
    shown = path.rstrip("/") or "/"
    assert missing_parts(pod, mps_root=MPS_ROOT) == [
        f"no spec.volumes host (hostPath {shown}): in or above the MPS root"
    ]
    assert sharing_patch(pod, config_map="peek-gpupool-gpu", mps_root=MPS_ROOT) == []


def test_the_gpu_config_map_must_be_the_last_env_source_and_no_env_sets_its_variables():
    pod = share_pod("late", {FRACTION: "0.5"})
    container = pod["spec"]["containers"][0]
    container["envFrom"].append({"secretRef": {"name": "mine"}})  # would win over it
    container["env"] = [{"name": "GPUPOOL_MPS_PIPE", "value": "GPU-b/pipe"}]  # another GPU's
    assert missing_parts(pod, mps_root=MPS_ROOT) == [
        "containers[main].envFrom configMapRef late-gpupool-gpu (not optional, no prefix, "
        "the last source)",
        "no containers[main].env GPUPOOL_MPS_PIPE (GPUPool sets it)",
    ]
    patched = json_patch(pod, sharing_patch(pod, config_map="late-gpupool-gpu", mps_root=MPS_ROOT))
    assert patched["spec"]["containers"][0]["envFrom"] == [
        {"secretRef": {"name": "mine"}},
        {"configMapRef": {"name": "late-gpupool-gpu"}},
    ]
    assert patched["spec"]["containers"][0]["env"] == []
    assert missing_parts(patched, mps_root=MPS_ROOT) == []


def test_the_config_map_names_the_gpus_pipe_folder_and_its_limits():
    assert gpu_env("GPU-8f2c", MpsLimits(40960, 50)) == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-8f2c",
        "GPUPOOL_MPS_PIPE": "GPU-8f2c/pipe",  # under the MPS root, as the agent names it
        "CUDA_MPS_PIPE_DIRECTORY": POD_PIPE_DIRECTORY,  # where the pod mounts it
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=40960M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
    }
    # MPS off: no limits, but the pipe still named, for a pod that mounts it all the same.
    assert gpu_env("GPU-8f2c", None) == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-8f2c",
        "GPUPOOL_MPS_PIPE": "GPU-8f2c/pipe",
    }


def test_a_config_map_name_stays_a_dns_subdomain_however_long_the_pod_name():
    name = config_map_name("p" * 253)
    assert len(name) == 253 and name.endswith("-gpupool-gpu")
    assert config_map_name("p" * 253) == name != config_map_name("p" * 252 + "q")
    assert config_map_name("sweep-", salt="a1b2c3") == "sweep-a1b2c3-gpupool-gpu"


def test_two_native_halves_share_one_gpu_each_with_its_config_map_before_binding(native):
    fake, cluster, core = native
    for name in ("left", "right"):
        core.create_namespaced_pod(NS, share_pod(name, {FRACTION: "0.5"}))
    bind_all(cluster)
    workloads = native_workloads()
    assert [(w.name, w.gpu_request, float(w.gpus)) for w in workloads] == [
        ("left", "fraction", 0.5),
        ("right", "fraction", 0.5),
    ]
    places = {
        (a.node.name, a.shared_gpu_index, float(a.gpu_share))
        for a in PodAllocation.objects.filter(workload__in=workloads)
    }
    assert len(places) == 1  # one GPU, half each
    ((node, index, _),) = places
    reservation = next(
        p
        for p in fake.pods()
        if (p["metadata"].get("labels") or {}).get("gpupool.io/role") == "reservation"
    )
    device = reservation["metadata"]["annotations"][UUID_ANNOTATION]
    for name in ("left", "right"):
        pod = fake.pod(NS, name)
        assert pod["spec"]["nodeName"] == node
        config = fake.objects["configmaps"][(NS, f"{name}-gpupool-gpu")]
        assert config["data"] == gpu_env(device, MpsLimits(40960, 50))
        assert config["data"]["CUDA_MPS_PIPE_DIRECTORY"] == POD_PIPE_DIRECTORY
        # Its GPU's pipe folder alone is mounted: <MPS root>/<device>/pipe.
        assert config["data"]["GPUPOOL_MPS_PIPE"] == f"{device}/pipe"
        assert fake.sub_paths[(NS, name)] == {("main", POD_PIPE_DIRECTORY): f"{device}/pipe"}
        assert config["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod["metadata"]["uid"]}
        ]
        # The kubelet started it at its Binding: the ConfigMap was there before.
        assert pod["status"]["phase"] == "Running", pod["status"]
    core.delete_namespaced_pod("left", NS, grace_period_seconds=0)
    assert (NS, "left-gpupool-gpu") not in fake.objects["configmaps"]  # collected with it


def waiting_sharer(native) -> tuple[Workload, PodAllocation, str]:
    """A native half-GPU pod admitted and held back: no agent has reported anything. Its
    workload, its allocation and its GPU's device."""
    fake, cluster, core = native
    core.create_namespaced_pod(NS, share_pod("first", {FRACTION: "0.5"}))
    bind_all(cluster, agents=False)
    assert not fake.pod(NS, "first")["spec"].get("nodeName")
    workload = Workload.objects.get(name="first")
    assert workload.state == "admitted"
    device = next(
        p["metadata"]["annotations"][UUID_ANNOTATION]
        for p in fake.pods()
        if (p["metadata"].get("labels") or {}).get("gpupool.io/role") == "reservation"
    )
    return workload, workload.allocations.get(), device


def said_to_user(client, workload: Workload) -> tuple[str, str, str]:
    """What the workload's row, its REST answer (`why`) and its page say it waits for."""
    workload.refresh_from_db()
    why = client.get(f"/api/v1/workloads/{workload.pk}/").json()["why"]
    page = client.get(f"/workloads/{workload.pk}/").content.decode()
    return workload.pending_reason, why, page


def test_a_native_sharer_is_bound_only_once_its_gpus_mps_daemon_runs_for_it(native):
    fake, cluster, _ = native
    _, allocation, device = waiting_sharer(native)  # no agent has said anything
    message = pod_scheduled(fake.pod(NS, "first"))["message"]
    assert message.startswith(
        f"Waiting for the MPS daemon of GPU {device} on node {allocation.node.name}:"
    ), message
    events = [e["message"] for e in fake.events(NS) if e["reason"] == "FailedScheduling"]
    assert events == [message]  # said once, however many passes
    assert fake.objects["configmaps"] == {}
    # The daemon runs, but the agent has not seen this allocation yet: it could stop it.
    node = allocation.node
    mps_report_store(node, {"running": {device: [allocation.pk + 1]}})
    cluster_reconcile(cluster)
    assert not fake.pod(NS, "first")["spec"].get("nodeName")
    # Another device's daemon (the GPU's reservation held another before) is not its own.
    mps_report_store(node, {"running": {"GPU-other": [allocation.pk]}})
    cluster_reconcile(cluster)
    assert not fake.pod(NS, "first")["spec"].get("nodeName")
    agents_report(cluster)
    cluster_reconcile(cluster)
    pod = fake.pod(NS, "first")
    assert pod["spec"]["nodeName"] == node.name and pod["status"]["phase"] == "Running"
    assert fake.sub_paths[(NS, "first")] == {("main", POD_PIPE_DIRECTORY): f"{device}/pipe"}


def test_a_native_sharers_mps_wait_is_said_on_its_workload_and_cleared_once_bound(
    native, org, client_as
):
    fake, cluster, _ = native
    workload, allocation, device = waiting_sharer(native)
    client = client_as(org.researcher)
    node = allocation.node
    # The node's agent never reported: it may be older than the portal.
    never = pod_scheduled(fake.pod(NS, "first"))["message"]
    assert never.startswith(f"Waiting for the MPS daemon of GPU {device} on node {node.name}: ")
    assert "agent has never reported its MPS daemons" in never and "upgrade it" in never
    stored, why, page = said_to_user(client, workload)
    assert stored == why == never
    assert f'<strong>Waiting:</strong> <span class="reason">{escape(never)}</span>' in page
    # It reports, but not this allocation's daemon yet: the pod and its workload say so.
    mps_report_store(node, {"running": {device: [allocation.pk + 1]}})
    cluster_reconcile(cluster)
    waits = pod_scheduled(fake.pod(NS, "first"))["message"]
    assert waits.startswith(f"Waiting for the MPS daemon of GPU {device} on node {node.name}: ")
    assert "starts it and says so" in waits and "upgrade" not in waits
    stored, why, page = said_to_user(client, workload)
    assert stored == why == waits
    assert escape(waits) in page and escape(never) not in page
    # The daemon runs for it: bound, and nothing said any more.
    agents_report(cluster)
    cluster_reconcile(cluster)
    assert fake.pod(NS, "first")["spec"]["nodeName"] == node.name
    stored, why, page = said_to_user(client, workload)
    assert stored == why == ""
    assert escape(waits) not in page and "Waiting for the MPS daemon" not in page


def test_a_waiting_sharer_stopped_no_longer_says_it_waits(native, org):
    fake, cluster, _ = native
    workload, _, _ = waiting_sharer(native)
    workload_stop(actor=org.researcher, workload=workload)
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert (workload.state, workload.pending_reason) == ("stopped", "")
    assert workload_why(workload) == "By rita."  # who stopped it, no longer what it waited for
    assert fake.pod(NS, "first") is None  # a bare pod whose workload was stopped: deleted


def test_an_unchanged_mps_wait_is_not_written_again(native):
    _, cluster, _ = native
    workload, _, _ = waiting_sharer(native)
    workload.refresh_from_db()
    assert workload.pending_reason.startswith("Waiting for the MPS daemon of GPU ")
    version = workload.version
    for full in (True, False):
        with CaptureQueriesContext(connection) as queries:
            cluster_reconcile(cluster, full=full)
        writes = [
            q["sql"]
            for q in queries.captured_queries
            if "pending_reason" in q["sql"] and not q["sql"].lstrip().upper().startswith("SELECT")
        ]
        assert writes == [], (full, writes)
        workload.refresh_from_db()
        assert workload.version == version and workload.state == "admitted"


def test_where_mps_is_off_a_native_sharer_waits_for_no_daemon(native):
    fake, cluster, core = native
    cluster.config["mps"] = False
    cluster.save(update_fields=["config"])
    core.create_namespaced_pod(NS, share_pod("plain", {FRACTION: "0.5"}))
    bind_all(cluster, agents=False)
    pod = fake.pod(NS, "plain")
    assert pod["status"]["phase"] == "Running"
    data = fake.objects["configmaps"][(NS, "plain-gpupool-gpu")]["data"]
    assert set(data) == {"NVIDIA_VISIBLE_DEVICES", "GPUPOOL_MPS_PIPE"}  # no limits


def test_a_whole_root_pod_queued_before_is_failed_at_binding_not_bound(native, monkeypatch):
    fake, cluster, core = native
    body = share_pod("before", {FRACTION: "0.5"})
    body["spec"]["containers"][0]["volumeMounts"] = [dict(WHOLE_ROOT)]
    core.create_namespaced_pod(NS, body)
    with monkeypatch.context() as before:  # queued by a GPUPool that asked for no more
        before.setattr(native_sharing, "missing_parts", lambda *a, **k: [])
        cluster_reconcile(cluster)
    cycle_run()
    for _ in range(4):
        cluster_reconcile(cluster)
        agents_report(cluster)
    workload = Workload.objects.get(name="before")
    assert workload.state == "failed"
    failed = workload.events.last()
    assert failed.reason == "PodFailed"
    assert "no other mount of gpupool-mps: containers[main] at /run/gpupool/mps" in failed.message
    assert not fake.pod(NS, "before")["spec"].get("nodeName")
    assert fake.objects["configmaps"] == {}


@pytest.mark.parametrize(
    ("annotations", "gpus", "change", "field"),
    [
        ({FRACTION: "1.5"}, 0, None, FRACTION),
        ({FRACTION: "abc"}, 0, None, FRACTION),
        ({FRACTION: "0.0001"}, 0, None, FRACTION),
        ({GPU_MEMORY: "10GB"}, 0, None, GPU_MEMORY),
        ({FRACTION: "0.5", GPU_MEMORY: "10Gi"}, 0, None, GPU_MEMORY),
        ({FRACTION: "0.5"}, 1, None, "nvidia.com/gpu"),
        ({FRACTION: "0.5"}, 0, "hostIPC", "spec.hostIPC"),
        ({GPU_MEMORY: "10Gi"}, 0, "envFrom", "envFrom configMapRef"),
        ({FRACTION: "0.5"}, 0, "whole root", "subPathExpr $(GPUPOOL_MPS_PIPE)"),
        ({FRACTION: "0.5"}, 0, "whole root", "no other mount of gpupool-mps: containers[main]"),
    ],
)
def test_a_share_that_cannot_be_given_says_which_field_and_queues_nothing(
    native, annotations, gpus, change, field
):
    fake, cluster, core = native
    body = share_pod("asks", annotations)
    spec = body["spec"]
    if gpus:
        spec["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": str(gpus)}
    if change == "hostIPC":
        del spec["hostIPC"]
    if change == "envFrom":
        del spec["containers"][0]["envFrom"]
    if change == "whole root":  # the shape GPUPool asked for before: every GPU's pipe
        spec["containers"][0]["volumeMounts"] = [dict(WHOLE_ROOT)]
    core.create_namespaced_pod(NS, body)
    bind_all(cluster, rounds=1)
    assert native_workloads() == []
    pod = fake.pod(NS, "asks")
    condition = pod_scheduled(pod)
    assert condition["status"] == "False" and field in condition["message"], condition
    assert not pod["spec"].get("nodeName")
    events = [e["message"] for e in fake.events(NS) if e["reason"] == "FailedScheduling"]
    assert events == [condition["message"]]
    assert fake.objects["configmaps"] == {}


def test_pods_of_one_template_naming_one_config_map_are_refused_as_a_gang(native):
    fake, cluster, core = native
    template = share_pod("sweep", {FRACTION: "0.5"})  # every pod names sweep-gpupool-gpu
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "sweep"},
        "spec": {"parallelism": 2, "completions": 2, "template": {
            "metadata": {"annotations": template["metadata"]["annotations"]},
            "spec": template["spec"],
        }},
    }  # fmt: skip
    kubectl_jobs(fake, core, job)
    bind_all(cluster, rounds=1)
    assert native_workloads() == []
    pods = [p for p in fake.pods() if p["metadata"]["name"].startswith("sweep-")]
    assert len(pods) == 2
    for pod in pods:
        message = pod_scheduled(pod)["message"]
        assert f"the annotation {FRACTION}" in message and "a ConfigMap of its own" in message
        assert not pod["spec"].get("nodeName")


def test_a_config_map_in_the_way_holds_the_binding_until_it_is_gone(native):
    fake, cluster, core = native
    core.create_namespaced_config_map(
        NS, {"metadata": {"name": "taken-gpupool-gpu"}, "data": {"NVIDIA_VISIBLE_DEVICES": "all"}}
    )
    core.create_namespaced_pod(NS, share_pod("taken", {GPU_MEMORY: "20Gi"}))
    bind_all(cluster)
    assert not fake.pod(NS, "taken")["spec"].get("nodeName")  # never on a GPU it cannot limit
    taken = fake.objects["configmaps"][(NS, "taken-gpupool-gpu")]
    assert taken["data"] == {"NVIDIA_VISIBLE_DEVICES": "all"}
    cluster.refresh_from_db()
    assert "taken-gpupool-gpu exists and is not the GPU environment" in cluster.last_error
    assert Workload.objects.get(name="taken").state == "admitted"
    core.delete_namespaced_config_map("taken-gpupool-gpu", NS)
    cluster_reconcile(cluster)
    assert fake.pod(NS, "taken")["status"]["phase"] == "Running"
    data = fake.objects["configmaps"][(NS, "taken-gpupool-gpu")]["data"]
    assert data["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"


def test_a_config_map_whose_create_answer_was_lost_is_taken_as_written(native):
    fake, cluster, core = native
    core.create_namespaced_pod(NS, share_pod("lost", {FRACTION: "0.25"}))
    # The create is answered too late: the client tries again once the server made it,
    # and meets its own ConfigMap (409).
    cluster.config["backoff_s"] = fake.timeout_s
    cluster.save(update_fields=["config"])
    fake.inject("timeout", 1, method="POST", path=f"/namespaces/{NS}/configmaps")
    bind_all(cluster)
    assert fake.pod(NS, "lost")["status"]["phase"] == "Running"
    posts = [r for r in fake.requests if r == ("POST", f"/api/v1/namespaces/{NS}/configmaps")]
    assert len(posts) == 2
    cluster.refresh_from_db()
    assert not cluster.last_error
