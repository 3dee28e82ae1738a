"""`manage.py export_trace`: the portal's history as the simulator's trace, read back with
read_trace and replayed by the simulator's own command line."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from clusters.metrics.models import AllocationInterval
from clusters.models import Cluster, Gpu
from clusters.reconcile import cluster_reconcile
from portal.models import ProjectQuota
from scheduling.engine.sim.trace import TraceJob, read_trace
from scheduling.models import Workload, WorkloadState
from scheduling.trace_export import trace_export
from tests.clusters.kube import kube  # noqa: F401 - the fixture
from tests.clusters.test_kubernetes_native import NS, job_body, kubectl_jobs, step

S = WorkloadState
T0 = dt.datetime(2026, 11, 2, 9, 0, tzinfo=dt.UTC)  # a Monday


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def ran(workload: Workload, *runs: tuple[float, float | None], pods: int = 1, share=1.0):
    """Allocation intervals of each pod for each run (seconds after T0; None = still held)."""
    AllocationInterval.objects.bulk_create(
        AllocationInterval(
            pod_allocation_id=workload.pk * 100 + n * 10 + pod,
            workload_id=workload.pk,
            pod_index=pod,
            project_id=workload.project_id,
            department_id=workload.project.department_id,
            node_id=1,
            gpu_indices=[0],
            share=share,
            started_at=at(start + pod),  # pods start a second apart: counted once
            ended_at=None if end is None else at(end),
        )
        for n, (start, end) in enumerate(runs)
        for pod in range(pods)
    )


def history(workload: Workload, submitted: float, state: str, finished: float | None = None):
    Workload.objects.filter(pk=workload.pk).update(
        queued_at=at(submitted),
        state=state,
        finished_at=None if finished is None else at(finished),
    )


def native_job(org, name: str) -> Workload:
    """A Job made with kubectl, queued as clusters/native.py queues one."""
    return Workload.objects.create(
        project=org.project_b,
        submitted_by=org.outsider,
        kind="training",
        name=name,
        gpus=1,
        pods=2,
        min_pods=2,
        priority=50,
        spec={
            "native": {
                "key": f"batch/Job/{name}",
                "namespace": org.project_b.namespace,
                "owner": {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": "u-1"},
                "target": None,
                "links": [],
                "manager": "kubectl",
                "pods": [[f"{name}-0", "p-0"], [f"{name}-1", "p-1"]],
            }
        },
    )


@pytest.fixture
def week(org, cluster, submit):
    """A small history: portal work of several shapes, a sweep, a native Job, and work
    submitted before the window and work withdrawn before it ran."""
    r = org.researcher
    whole = submit(r, org.project_a, "whole", gpus=2)  # evicted once, no checkpoint
    history(whole, 0, S.SUCCEEDED, 4600)
    ran(whole, (60, 660), (1000, 4600))
    saved = submit(r, org.project_a, "saved", gpus=1, checkpoint_dir="/ckpt")
    history(saved, 10, S.SUCCEEDED, 2000)
    ran(saved, (20, 620), (800, 2000))  # resumed from its checkpoint: both runs are work
    gang = submit(
        r, org.project_a, "gang", kind="distributed", gpus=4, pods=2, priority_class="build",
        topology_level="rack", topology_required=True, preemptible=False,
    )  # fmt: skip
    history(gang, 20, S.SUCCEEDED, 1030)
    ran(gang, (30, 1030), pods=2)
    frac = submit(r, org.project_a, "frac", gpu_request="fraction", gpus="0.5")
    history(frac, 30, S.RUNNING)
    ran(frac, (40, None), share=0.5)
    mem = submit(r, org.project_a, "mem", gpu_request="memory", gpu_memory_mib=20480)
    history(mem, 40, S.FAILED, 350)
    ran(mem, (50, 350), share=0.5)  # on a 40 GiB GPU
    waits = submit(r, org.project_a, "mem-waits", gpu_request="memory", gpu_memory_mib=20480)
    history(waits, 45, S.PENDING)
    Gpu.objects.filter(index=0).update(memory_mib=163840)  # the largest GPU: 160 GiB
    Gpu.objects.filter(index=3).update(mig_enabled=True)
    mig = submit(r, org.project_a, "mig", gpu_request="mig", mig_profile="3g.40gb")
    history(mig, 50, S.PENDING)
    elastic = submit(r, org.project_a, "grow", gpus=1, min_pods=2, max_pods=4)
    history(elastic, 60, S.SUCCEEDED, 700)
    ran(elastic, (100, 700), pods=2)
    zone = submit(r, org.project_a, "zone", gpus=1, topology_level="zone")
    history(zone, 65, S.PENDING)
    search = {"method": "grid", "parameters": {"lr": [1, 2]}}
    sweep = submit(r, org.project_a, "tune", kind="hpo", search=search)
    history(sweep, 70, S.RUNNING)
    Workload.objects.filter(parent=sweep).update(queued_at=at(70), state=S.PENDING)
    job = native_job(org, "nightly")
    history(job, 80, S.SUCCEEDED, 1000)
    ran(job, (100, 1000), pods=2)
    withdrawn = submit(r, org.project_a, "withdrawn", gpus=1)
    history(withdrawn, 90, S.STOPPED, 95)
    before = submit(r, org.project_a, "before", gpus=1)
    history(before, -3600, S.SUCCEEDED, -60)
    ran(before, (-3000, -60))
    return org


def export(tmp_path: Path, *extra: str) -> tuple[Path, str]:
    out, err = tmp_path / "trace.csv", StringIO()
    window = ["--since", T0.isoformat(), "--until", at(86400).isoformat()]
    call_command("export_trace", *window, "--output", str(out), *extra, stderr=err)
    return out, err.getvalue()


def job(jobs: list[TraceJob], name: str) -> TraceJob:
    return next(j for j in jobs if j.id == name)


def test_the_export_reads_back_as_each_workload_ran(week, tmp_path):
    path, _ = export(tmp_path)
    jobs, origin = read_trace(path)
    assert origin == T0.timestamp()
    portal = ("whole", "saved", "gang", "frac", "mem", "mem-waits", "mig", "grow", "zone",
              "tune-trial-0", "tune-trial-1")  # fmt: skip
    assert sorted(j.id for j in jobs) == [*sorted(f"ml-vision/{n}" for n in portal), "nlp/nightly"]
    v = {j.id.removeprefix("ml-vision/"): j for j in jobs}
    # A restart without a checkpoint began again: only its last run is its work.
    assert (v["whole"].submit, v["whole"].duration, v["whole"].gpus_per_pod) == (0, 3600, 2)
    assert (v["whole"].pods, v["whole"].priority, v["whole"].preemptible) == (1, 50, True)
    assert v["saved"].duration == 600 + 1200
    # The gang's two pods held their GPUs together: one run, counted once.
    assert (v["gang"].pods, v["gang"].gpus_per_pod, v["gang"].duration) == (2, 4, 1000)
    assert (v["gang"].priority, v["gang"].preemptible) == (100, False)
    assert (v["gang"].topology_level, v["gang"].topology_required) == ("rack", True)
    assert (v["frac"].gpus_per_pod, v["frac"].duration) == (0.5, None)  # still running
    assert (v["mem"].gpus_per_pod, v["mem"].duration) == (0.5, 300)  # the share it held
    assert v["mem-waits"].gpus_per_pod == 0.125  # 20 GiB of the largest GPU there is
    assert (v["mig"].mig_profile, v["mig"].gpus_per_pod, v["mig"].duration) == (
        "3g.40gb",
        3 / 7,
        None,
    )
    assert (v["grow"].pods, v["grow"].min_pods, v["grow"].elastic) == (4, 2, True)
    assert v["grow"].duration == 600
    assert v["zone"].topology_level == ""  # the simulated nodes have racks only
    assert (v["whole"].cpu, v["whole"].memory_gib, v["whole"].team) == (1, 1, "ml-vision")
    native = job(jobs, "nlp/nightly")
    assert (native.team, native.pods, native.gpus_per_pod, native.duration) == ("nlp", 2, 1, 900)
    assert native.submit == 80


def test_the_origin_column_names_the_owner_kind_and_the_replay_ignores_it(week, tmp_path):
    path, err = export(tmp_path)
    rows = path.read_text().splitlines()
    assert rows[0].endswith(",origin")
    origins = {line.split(",")[0]: line.rsplit(",", 1)[1] for line in rows[1:]}
    assert origins["nlp/nightly"] == "kubernetes:Job"
    assert origins["ml-vision/whole"] == "portal"
    assert err.strip() == (
        "export_trace: 12 workloads, 1 left out (ended without running), "
        "topology dropped from 1 (a level other than rack)"
    )


def test_the_export_streams_in_a_few_queries(week, django_assert_max_num_queries):
    with django_assert_max_num_queries(3):
        stats = trace_export(StringIO(), since=T0)
    assert stats.rows == 12


def test_the_simulator_replays_the_export_with_the_projects_quotas(week, tmp_path):
    ProjectQuota.objects.filter(project=week.project_b).update(over_quota_allowed=False)
    path, _ = export(tmp_path, "--quotas", str(tmp_path / "quotas.json"))
    quotas = json.loads((tmp_path / "quotas.json").read_text())
    assert quotas["teams"]["ml-vision"] == {
        "department": "vision",
        "pools": {"a100": {"deserved": 4.0, "limit": None, "weight": 1.0}},
    }
    assert quotas["teams"]["nlp"] == {  # may not go over quota: its deserved is its limit
        "department": "language",
        "pools": {"a100": {"deserved": 4.0, "limit": 4.0, "weight": 1.0}},
    }
    cluster = {
        "pools": [
            {
                "name": "a100",
                "nodes": [
                    {"count": 2, "gpus": 8, "gpu_model": "A100", "gpu_memory_mib": 81920,
                     "mig_gpus": 2, "nodes_per_rack": 2},
                ],
            }
        ]
    }  # fmt: skip
    (tmp_path / "cluster.json").write_text(json.dumps(cluster))
    argv = [
        sys.executable,
        "-m",
        "scheduling.engine.sim",
        "--cluster",
        str(tmp_path / "cluster.json"),
    ]
    argv += ["--trace", str(path), "--quotas", str(tmp_path / "quotas.json")]
    argv += ["--policy", "gpupool", "--no-baseline", "--out", str(tmp_path / "replay")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "replay" / "summary.json").read_text())
    assert summary["jobs"] == 12, summary


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--since", "last monday"], "--since: not an ISO date-time: 'last monday'"),
        (["--until", "2026-13-01"], "--until: not an ISO date-time: '2026-13-01'"),
        (["--since", "2026-11-02", "--until", "2026-11-01"], "--until: must be after --since"),
        (["--cluster", "nowhere"], "--cluster: no cluster named 'nowhere'"),
        (["--since", "2030-01-01"], "no workload was submitted in the window"),
    ],
)
def test_a_bad_window_names_its_option_and_writes_no_file(week, tmp_path, options, message):
    out = tmp_path / "trace.csv"
    with pytest.raises(CommandError, match=message):
        call_command("export_trace", *options, "--output", str(out))
    assert list(tmp_path.iterdir()) == []


def test_a_cluster_keeps_the_work_placed_on_it(week, tmp_path):
    Workload.objects.filter(name="nightly").update(cluster=Cluster.objects.get(name="sim"))
    out = StringIO()
    call_command("export_trace", "--cluster", "sim", stdout=out, stderr=StringIO())
    assert [line.split(",")[0] for line in out.getvalue().splitlines()[1:]] == ["nlp/nightly"]


def test_a_job_made_with_kubectl_is_exported_as_it_ran(kube, org, tmp_path):  # noqa: F811
    """The intake's own record (clusters/native.py), not one written by hand."""
    fake = kube.require_fake()
    cluster = kube.cluster()
    kube.nodes(cluster)
    fake.job_controller = True
    core = k8s.CoreV1Api(k8s_config.new_client_from_config_dict(kube.kubeconfig))
    core.create_namespace({"metadata": {"name": NS}})
    kubectl_jobs(fake, core, job_body("nightly", parallelism=3))
    for _ in range(2):
        step(cluster)
    for pod in fake.pods():
        fake.finish(NS, pod["metadata"]["name"], exit_code=0)
    fake.run_controllers()
    cluster_reconcile(cluster)
    assert Workload.objects.get(name="nightly").state == S.SUCCEEDED
    out = tmp_path / "trace.csv"
    call_command("export_trace", "--output", str(out), "--cluster", cluster.name, stderr=StringIO())
    (native,), _ = read_trace(out)
    assert (native.id, native.team, native.pods, native.gpus_per_pod) == (
        "ml-vision/nightly", "ml-vision", 3, 1,
    )  # fmt: skip
    assert (native.cpu, native.memory_gib, native.priority) == (2, 4, 50)
    assert native.duration is not None and native.duration >= 0
    assert out.read_text().splitlines()[1].endswith(",kubernetes:Job")
