"""Pods made outside GPUPool (kubectl, a Job's controller) that name its scheduler are
queued, bound, told why they wait, evicted and stopped like portal work (issue 26).

Each test drives the portal's real path: the cluster's reconcile pass (intake, binding,
phases) and the scheduling cycle, against the in-suite API server, whose Job controller,
Binding, pod status, Events and Eviction API behave as a real server's do
(tests/clusters/test_fake_apiserver_native.py)."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from clusters.backends.kubernetes import KubernetesBackend
from clusters.backends.kubernetes.native import BOUND_BY, identity
from clusters.reconcile import cluster_reconcile
from scheduling.cycle import cycle_run
from scheduling.models import Workload, WorkloadState
from scheduling.services import workload_stop, workload_submit
from tests.clusters.kube import kube  # noqa: F401 - the fixture

S = WorkloadState
NS = "gp-ml-vision"  # project_a's namespace
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def setup(kube, org):  # noqa: F811
    cluster = kube.cluster()
    kube.nodes(cluster)
    if kube.fake is not None:
        kube.fake.job_controller = True  # as kube-controller-manager runs beside a real one
    core = k8s.CoreV1Api(k8s_config.new_client_from_config_dict(kube.kubeconfig))
    core.create_namespace({"metadata": {"name": NS}})  # as the team's admin made it
    return cluster, core


def pod_body(name: str, gpus: int = 1, *, scheduler: str = "gpupool", **meta) -> dict:
    return {
        "metadata": {"name": name, **meta},
        "spec": {
            "schedulerName": scheduler,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "pytorch/pytorch:2.3",
                    "command": ["python", "train.py"],
                    "resources": {
                        "requests": {"cpu": "2", "memory": "4Gi"},
                        "limits": {"nvidia.com/gpu": str(gpus)},
                    },
                }
            ],
        },
    }


def job_body(name: str, parallelism: int, gpus: int = 1, backoff: int = 0, **meta) -> dict:
    template = pod_body("unused", gpus)
    del template["metadata"]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, **meta},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "backoffLimit": backoff,
            "template": template,
        },
    }


def kubectl_jobs(fake, core, *jobs: dict) -> k8s.BatchV1Api:
    """Create the Jobs as a user would, and let the Job controller make their pods."""
    batch = k8s.BatchV1Api(core.api_client)
    for job in jobs:
        batch.create_namespaced_job(NS, job)
    fake.run_controllers()
    return batch


def pod_scheduled(pod: dict) -> dict:
    return next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")


def step(cluster) -> None:
    """What the beat does: a reconcile (intake), a cycle, a reconcile (binding)."""
    cluster_reconcile(cluster)
    cycle_run()
    cluster_reconcile(cluster)


def second_waits(cluster, core, first: str, second: str) -> Workload:
    """Two pods of non-preemptible work, 4 GPUs each: it stays within the project's quota
    (4), so the second one's workload waits. Returns that workload."""
    build = {"gpupool.io/priority-class": "build"}
    for name in (first, second):
        core.create_namespaced_pod(NS, pod_body(name, gpus=4, labels=build))
        step(cluster)
    return Workload.objects.get(name=second)


def native_workloads() -> list[Workload]:
    return list(Workload.objects.filter(spec__has_key="native").order_by("pk"))


def test_a_bare_pod_naming_gpupool_is_queued_bound_and_runs(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, core = setup
    core.create_namespaced_pod(NS, pod_body("trainer", gpus=2))
    cluster_reconcile(cluster)
    (workload,) = native_workloads()
    assert (workload.project, workload.kind, workload.state) == (
        org.project_a,
        "training",
        S.PENDING,
    )
    assert (float(workload.gpus), float(workload.cpu), workload.memory_mib) == (2.0, 2.0, 4096)
    assert workload.spec["native"]["owner"]["kind"] == "Pod"
    assert workload.name == "trainer"
    cycle_run()
    cluster_reconcile(cluster)
    pod = fake.pod(NS, "trainer")
    assert pod["spec"]["nodeName"] in ("gpu-a", "gpu-b")
    assert pod["metadata"]["annotations"][BOUND_BY] == identity(KubernetesBackend(cluster))
    workload.refresh_from_db()
    assert workload.state in (S.ADMITTED, S.RUNNING)
    assert workload.allocations.get().node.name == pod["spec"]["nodeName"]
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert workload.state == S.RUNNING
    reasons = [e["reason"] for e in fake.events(NS) if e["involvedObject"]["name"] == "trainer"]
    assert "Scheduled" in reasons
    fake.finish(NS, "trainer", exit_code=0)
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert workload.state == S.SUCCEEDED
    assert not workload.allocations.exists()
    assert fake.pod(NS, "trainer") is not None  # a finished pod stays for `kubectl logs`


def test_pods_of_other_schedulers_and_namespaces_are_left_alone(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, core = setup
    core.create_namespace({"metadata": {"name": "elsewhere"}})
    core.create_namespaced_pod(NS, pod_body("default-scheduled", scheduler="default-scheduler"))
    core.create_namespaced_pod("elsewhere", pod_body("not-a-project"))
    step(cluster)
    assert native_workloads() == []
    assert not fake.pod(NS, "default-scheduled")["spec"].get("nodeName")
    assert not fake.pod("elsewhere", "not-a-project")["spec"].get("nodeName")


def test_a_waiting_pod_says_why_in_its_condition_and_one_event(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, core = setup
    workload = second_waits(cluster, core, "runs", "waits")
    assert workload.state == S.PENDING and workload.pending_reason
    cluster_reconcile(cluster)
    pod = fake.pod(NS, "waits")
    condition = pod_scheduled(pod)
    assert (condition["status"], condition["reason"]) == ("False", "Unschedulable")
    workload.refresh_from_db()
    assert condition["message"] == workload.pending_reason
    failed = [e for e in fake.events(NS) if e["reason"] == "FailedScheduling"]
    assert len(failed) == 1 and failed[0]["type"] == "Warning"
    assert failed[0]["message"] == workload.pending_reason
    step(cluster)  # the same reason again: no second event
    assert len([e for e in fake.events(NS) if e["reason"] == "FailedScheduling"]) == 1


def test_a_pod_that_cannot_be_queued_says_which_field_and_others_still_run(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, core = setup
    core.create_namespaced_pod(NS, pod_body("too-big", gpus=300))
    core.create_namespaced_pod(NS, pod_body("bad-kind", labels={"gpupool.io/kind": "weird"}))
    core.create_namespaced_pod(NS, pod_body("fine", gpus=1))
    step(cluster)
    assert [w.name for w in native_workloads()] == ["fine"]
    assert fake.pod(NS, "fine")["spec"].get("nodeName")
    for name, field in (("too-big", "nvidia.com/gpu"), ("bad-kind", "gpupool.io/kind")):
        pod = fake.pod(NS, name)
        condition = pod_scheduled(pod)
        assert condition["status"] == "False"
        assert field in condition["message"], condition["message"]
        assert not pod["spec"].get("nodeName")


def test_a_job_is_one_gang_bound_together_and_succeeds(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, core = setup
    kubectl_jobs(fake, core, job_body("sweep", parallelism=3))
    cluster_reconcile(cluster)
    (workload,) = native_workloads()
    assert (workload.kind, workload.pods, workload.min_pods) == ("distributed", 3, 3)
    assert workload.spec["native"]["owner"]["kind"] == "Job"
    assert len([s for s in workload.spec["native"]["pods"] if s]) == 3
    cycle_run()
    cluster_reconcile(cluster)
    pods = [p for p in fake.pods() if p["metadata"]["namespace"] == NS]
    assert len(pods) == 3 and all(p["spec"].get("nodeName") for p in pods)
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert workload.state == S.RUNNING
    for pod in pods:
        fake.finish(NS, pod["metadata"]["name"], exit_code=0)
    fake.run_controllers()
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert workload.state == S.SUCCEEDED


def test_a_gang_annotation_groups_an_operators_pods(kube, setup, org):  # noqa: F811
    """A PyTorchJob-shaped gang: pods its operator made, with a controller reference and
    gpupool.io/min-available, wait until all can run, then are bound together."""
    fake = kube.require_fake()
    cluster, core = setup
    owner = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "name": "bert",
        "uid": "6f1c9a52-7d1e-4c55-9a53-2a1f6c0f1b11",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    meta = {"ownerReferences": [owner], "annotations": {"gpupool.io/min-available": "3"}}
    for index in range(2):
        core.create_namespaced_pod(NS, pod_body(f"bert-worker-{index}", gpus=4, **meta))
    step(cluster)
    assert native_workloads() == []  # queued once the gang is whole
    pod = fake.pod(NS, "bert-worker-0")
    condition = pod_scheduled(pod)
    assert "2 of 3 pods exist" in condition["message"]
    core.create_namespaced_pod(NS, pod_body("bert-worker-2", gpus=4, **meta))
    step(cluster)
    step(cluster)
    (workload,) = native_workloads()
    assert (workload.pods, workload.spec["native"]["owner"]["kind"]) == (3, "PyTorchJob")
    names = sorted(p["metadata"]["name"] for p in fake.pods() if p["spec"].get("nodeName"))
    assert names == ["bert-worker-0", "bert-worker-1", "bert-worker-2"]
    assert workload.state == S.RUNNING


def test_preemption_evicts_through_the_eviction_api_and_the_job_comes_back(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, core = setup
    # Over its quota of 4 on borrowed GPUs: 2 jobs of 8. An evicted pod counts as a
    # failure of its Job (no podFailurePolicy): room for one.
    kubectl_jobs(
        fake, core, *(job_body(n, parallelism=1, gpus=8, backoff=1) for n in ("big-1", "big-2"))
    )
    step(cluster)
    step(cluster)
    assert {w.state for w in native_workloads()} == {S.RUNNING}
    # The other project claims its guaranteed 4 GPUs.
    workload_submit(
        actor=org.outsider,
        project=org.project_b,
        kind="training",
        name="owner",
        image="pytorch/pytorch:2.3",
        command=["python", "train.py"],
        gpus=4,
    )
    cycle_run()
    cluster_reconcile(cluster)
    evictions = [p for m, p in fake.requests if m == "POST" and p.endswith("/eviction")]
    assert len(evictions) == 1
    victim = next(w for w in native_workloads() if w.state != S.RUNNING)
    fake.complete_deletions()
    fake.run_controllers()  # the Job makes its pod again
    cluster_reconcile(cluster)
    victim.refresh_from_db()
    assert victim.state == S.PENDING and victim.restart_count == 1
    slot = victim.spec["native"]["pods"][0]
    assert slot and fake.pod(NS, slot[0]) is not None
    assert not fake.pod(NS, slot[0])["spec"].get("nodeName")


def test_stop_in_the_portal_suspends_the_job(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, core = setup
    batch = kubectl_jobs(fake, core, job_body("long", parallelism=1))
    step(cluster)
    (workload,) = native_workloads()
    workload_stop(actor=org.researcher, workload=workload)
    cluster_reconcile(cluster)
    fake.complete_deletions()
    fake.run_controllers()
    cluster_reconcile(cluster)
    job = batch.read_namespaced_job("long", NS)
    assert job.spec.suspend is True
    assert [p for p in fake.pods() if p["metadata"]["namespace"] == NS] == []
    workload.refresh_from_db()
    assert workload.state == S.STOPPED and not workload.allocations.exists()
    step(cluster)
    assert len(native_workloads()) == 1  # nothing queued again


def test_a_pending_bare_pod_deleted_with_kubectl_stops_its_workload(kube, setup, org):  # noqa: F811
    kube.require_fake()
    cluster, core = setup
    later = second_waits(cluster, core, "first", "later")
    assert later.state == S.PENDING
    core.delete_namespaced_pod("later", NS)
    cluster_reconcile(cluster)
    later.refresh_from_db()
    assert later.state == S.STOPPED
    assert "deleted outside GPUPool" in later.events.order_by("pk").last().message


def test_a_disruption_budget_holds_an_eviction_until_it_allows_it(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, core = setup
    core.create_namespaced_pod(NS, pod_body("guarded", gpus=8, labels={"app": "guarded"}))
    step(cluster)
    policy = k8s.PolicyV1Api(core.api_client)
    budget = {
        "metadata": {"name": "keep-one"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
    }
    policy.create_namespaced_pod_disruption_budget(NS, budget)
    (workload,) = native_workloads()
    workload_stop(actor=org.researcher, workload=workload)
    result = cluster_reconcile(cluster)
    assert any("disruption budget" in e for e in result.errors), result.errors
    assert fake.pod(NS, "guarded") is not None
    workload.refresh_from_db()
    assert workload.state == S.STOPPED and workload.allocations.exists()  # GPUs still held
    policy.delete_namespaced_pod_disruption_budget("keep-one", NS)
    cluster_reconcile(cluster)
    fake.complete_deletions()
    cluster_reconcile(cluster)
    assert fake.pod(NS, "guarded") is None
    workload.refresh_from_db()
    assert not workload.allocations.exists()


def test_a_native_workload_shows_its_owner_and_logs_on_the_page_and_api(
    kube,  # noqa: F811
    setup,
    org,
    client_as,
):
    fake = kube.require_fake()
    cluster, core = setup
    core.create_namespaced_pod(NS, pod_body("shown", gpus=1))
    step(cluster)
    cluster_reconcile(cluster)
    (workload,) = native_workloads()
    fake.logs[(NS, "shown")] = "epoch 1 loss 0.42\n"
    client = client_as(org.researcher)
    body = client.get(f"/api/v1/workloads/{workload.pk}/").json()
    assert body["origin"]["kind"] == "Pod"
    assert body["origin"]["summary"].startswith(f"Pod {NS}/shown")
    assert body["origin"]["pods"] == ["shown"]
    logs = client.get(f"/api/v1/workloads/{workload.pk}/logs/").json()
    assert "epoch 1 loss 0.42" in str(logs["pods"])
    page = client.get(f"/workloads/{workload.pk}/").content.decode()
    assert "From Kubernetes" in page and f"Pod {NS}/shown" in page
    # Another project's researcher sees nothing of it.
    assert client_as(org.outsider).get(f"/api/v1/workloads/{workload.pk}/").status_code == 404
