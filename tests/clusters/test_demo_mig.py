"""The demo's MIG nodes: a demo user sees instances appear, be held and be reused."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from clusters import demo as clusters_demo
from clusters.models import Cluster, Gpu, MigInstance, SimulatedPod
from clusters.reconcile import cluster_reconcile
from portal import demo as portal_demo
from scheduling import demo
from scheduling.cycle import cycle_run
from scheduling.models import Workload, WorkloadState

pytestmark = pytest.mark.django_db
S = WorkloadState


def seeded(settings, tmp_path) -> Cluster:
    settings.VAR_DIR = tmp_path
    out = io.StringIO()
    portal_demo.seed(out)
    clusters_demo.seed(out)
    demo.seed(out)
    return Cluster.objects.get(name="sim")


def held(name: str) -> tuple[str, int, str, int]:
    (a,) = Workload.objects.get(name=name).allocations.all()
    return a.node.name, a.mig_gpu_index, a.mig_profile, a.mig_start


def test_the_demo_has_a_mig_pool_whose_instances_are_cut_held_and_reused(settings, tmp_path):
    sim = seeded(settings, tmp_path)
    mig = Gpu.objects.filter(node__cluster=sim, mig_enabled=True)
    assert sorted({(g.node.name, g.node.pool.name) for g in mig}) == [
        ("hgx-0", "h100"),
        ("hgx-1", "h100"),
    ]
    assert sorted({g.index for g in mig}) == [4, 5, 6, 7]
    assert cycle_run().ok
    trials = ["tok-sweep-mig-trial-0", "tok-sweep-mig-trial-1"]
    assert held("eval-mig") == ("hgx-0", 4, "3g.40gb", 4)
    assert held("embed-mig")[2] == "1g.10gb"  # by memory: the smallest profile that holds 9000 MiB
    first = {t: held(t) for t in trials}
    assert {h[2] for h in first.values()} == {"1g.10gb"}
    cluster_reconcile(sim)
    devices = dict(MigInstance.objects.values_list("start", "uuid").filter(gpu__index=4))
    assert all(u.startswith("MIG-") for u in devices.values()) and len(devices) == 4
    pod = SimulatedPod.objects.get(workload_id=Workload.objects.get(name=trials[0]).pk)
    assert pod.env["NVIDIA_VISIBLE_DEVICES"] == devices[first[trials[0]][3]]
    # The first two trials end (their 240 s pass); the next two reuse their instances.
    ids = Workload.objects.filter(name__in=trials).values("pk")
    SimulatedPod.objects.filter(cluster=sim, workload_id__in=ids).update(
        started_at=timezone.now() - timedelta(hours=1)
    )
    cluster_reconcile(sim)
    assert set(Workload.objects.filter(name__in=trials).values_list("state", flat=True)) == {
        S.SUCCEEDED
    }
    # Their pods go (the demo's stop delay), and their GPUs are released.
    SimulatedPod.objects.filter(cluster=sim, deleting_since__isnull=False).update(
        deleting_since=timezone.now() - timedelta(minutes=5)
    )
    assert cluster_reconcile(sim).released == 2
    assert len(MigInstance.objects.filter(gpu__index=4)) == 4  # kept, idle
    assert cycle_run().ok
    later = {held(t) for t in ["tok-sweep-mig-trial-2", "tok-sweep-mig-trial-3"]}
    assert later == set(first.values())  # the same instances: none cut, none destroyed
    assert dict(MigInstance.objects.values_list("start", "uuid").filter(gpu__index=4)) == devices


def test_the_nodes_page_draws_the_demos_instances_and_their_holders(settings, tmp_path, client):
    sim = seeded(settings, tmp_path)
    cycle_run()
    cluster_reconcile(sim)
    client.force_login(Workload.objects.get(name="eval-mig").submitted_by)
    page = client.get(reverse("node_list")).content.decode()
    assert "hgx-0" in page and "3g.40gb" in page and "1g.10gb" in page
    uuid = MigInstance.objects.get(profile="3g.40gb").uuid
    assert uuid in page
    assert "eval-mig" in page


def test_a_demo_seeded_before_the_mig_nodes_gets_them_once(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    old = {**clusters_demo.SIMULATED, "groups": clusters_demo.SIMULATED["groups"][:1]}
    Cluster.objects.create(name="sim", backend="simulated", config=old,
                           node_pool_label=clusters_demo.POOL_LABEL)  # fmt: skip
    clusters_demo.seed(io.StringIO())
    clusters_demo.seed(io.StringIO())
    groups = Cluster.objects.get(name="sim").config["groups"]
    assert [g["prefix"] for g in groups] == ["dgx", "hgx"]
