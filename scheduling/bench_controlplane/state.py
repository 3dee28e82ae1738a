"""The bench's state in the database: the engine bench's mix (scheduling/engine/bench.py),
scaled, turned into rows.

The nodes go in through the real inventory sync of a simulated cluster whose description
lists exactly the engine scenario's nodes (pools, racks, zones, GPU models); departments,
projects, quotas, workloads and the running workloads' pod allocations are bulk-created
from the scenario's snapshot, whose running set the engine itself placed. The running
workloads start as admitted, without pods: the first reconcile creates their pods.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal

from django.utils import timezone

from clusters.inventory import inventory_sync
from clusters.models import Backend, Cluster, Node, NodePool
from portal.models import Department, DepartmentQuota, Project, ProjectQuota, User
from scheduling.engine import bench
from scheduling.engine import types as t
from scheduling.models import GpuRequestKind, PodAllocation, Workload, WorkloadState

CLUSTER = "bench-controlplane"
POOL_LABEL = "gpupool.io/node-pool"
TOPOLOGY_LABELS = ("gpupool.io/zone", "gpupool.io/rack")
BATCH = 2000
# Host memory of a pod whose engine request names none (the scenario's GPU-memory
# requests): what a submission that names none gets. The portal refuses 0 MiB, so such a
# row was quarantined by the first cycle (about a tenth of the workloads: the cold
# cycle's 9,700 statements were mostly their quarantine).
HOST_MEMORY_MIB = Workload._meta.get_field("memory_mib").default


@dataclass(frozen=True, slots=True)
class Scale:
    """An engine scenario, and how many arrivals and latency samples the bench takes."""

    scenario: bench.Scenario
    arrivals: int = 100
    samples: int = 20


SCALES = {
    "tiny": Scale(
        bench.Scenario(nodes=10, departments=2, projects=2, running=30, pending=60, racks=2),
        arrivals=5,
        samples=3,
    ),
    "small": Scale(bench.SCALE_SMALL),
    "full": Scale(bench.SCALE, samples=10),
    "x3": Scale(
        replace(bench.SCALE, nodes=3000, running=15000, pending=30000, racks=30), samples=5
    ),
}


@dataclass(slots=True)
class Built:
    cluster: Cluster
    user: User
    projects: list[Project]
    nodes: int
    workloads: int
    running: int


def state_build(scale: Scale, seed: int = 7) -> Built:
    """1. the engine scenario's snapshot; 2. the cluster and its nodes through inventory
    sync; 3. departments, projects and quotas; 4. workloads and allocations."""
    snapshot = bench.scenario_snapshot(scale.scenario, seed)
    cluster = Cluster.objects.create(
        name=CLUSTER,
        backend=Backend.SIMULATED,
        node_pool_label=POOL_LABEL,
        topology_labels=list(TOPOLOGY_LABELS),
        config=cluster_description(snapshot.nodes),
    )
    inventory_sync(cluster)
    node_pks = node_pks_by_engine_id(cluster, snapshot.nodes)
    user = User.objects.create(
        username="bench", email="bench@example.invalid", is_platform_admin=True
    )
    projects = queues_store(snapshot.queues)
    shift = timezone.now().timestamp() - bench.NOW  # the scenario's clock onto today's
    running = workloads_store(snapshot.workloads, projects, user, node_pks, shift)
    return Built(
        cluster=cluster,
        user=user,
        projects=list(projects.values()),
        nodes=len(node_pks),
        workloads=len(snapshot.workloads),
        running=running,
    )


def cluster_description(nodes: tuple[t.Node, ...]) -> dict:
    """One group per pool; `spread` gives each node its own zone and rack, as the engine
    scenario has them. Synthetic GPU samples off: ingestion has its own bench."""
    groups = []
    for pool in sorted({n.pool for n in nodes}):
        members = [n for n in nodes if n.pool == pool]
        groups.append(
            {
                "prefix": pool,
                "count": len(members),
                "gpus": len(members[0].gpus),
                "gpu_model": members[0].gpus[0].model,
                "gpu_memory_mib": members[0].gpus[0].memory_mib,
                "cpu_cores": members[0].cpu,
                "memory_mib": members[0].memory_mib,
                "labels": {POOL_LABEL: pool},
                "spread": {
                    label: [n.topology[label.rsplit("/", 1)[-1]] for n in members]
                    for label in TOPOLOGY_LABELS
                },
            }
        )
    return {"groups": groups, "stop_delay_s": 0, "sample_interval_s": 10**9}


def node_pks_by_engine_id(cluster: Cluster, nodes: tuple[t.Node, ...]) -> dict[str, int]:
    """The k-th engine node of a pool is the simulated node `<pool>-<k>`."""
    pks = dict(Node.objects.filter(cluster=cluster).values_list("name", "pk"))
    seen: Counter[str] = Counter()
    mapping = {}
    for node in nodes:
        mapping[node.id] = pks[f"{node.pool}-{seen[node.pool]}"]
        seen[node.pool] += 1
    return mapping


def queues_store(queues: tuple[t.Queue, ...]) -> dict[str, Project]:
    """Departments and projects with their quotas per pool; project by queue id."""
    pools = {p.name: p for p in NodePool.objects.all()}
    departments = {
        q.id: Department.objects.create(name=q.id) for q in queues if q.parent_id is None
    }
    projects = {
        q.id: Project.objects.create(department=departments[q.parent_id], name=q.id, namespace=q.id)
        for q in queues
        if q.parent_id is not None
    }
    DepartmentQuota.objects.bulk_create(
        DepartmentQuota(department=departments[q.id], node_pool=pools[pool], **quota_fields(quota))
        for q in queues
        if q.parent_id is None
        for (pool, _), quota in q.quotas.items()
    )
    ProjectQuota.objects.bulk_create(
        ProjectQuota(project=projects[q.id], node_pool=pools[pool], **quota_fields(quota))
        for q in queues
        if q.parent_id is not None
        for (pool, _), quota in q.quotas.items()
    )
    return projects


def quota_fields(quota: t.Quota) -> dict:
    return {
        "gpus": Decimal(str(quota.deserved)),
        "gpus_limit": None if quota.limit is None else Decimal(str(quota.limit)),
        "over_quota_weight": Decimal(str(quota.over_quota_weight)),
        "over_quota_allowed": quota.over_quota_allowed,
    }


def workloads_store(
    workloads: tuple[t.Workload, ...],
    projects: dict[str, Project],
    user: User,
    node_pks: dict[str, int],
    shift: float,
) -> int:
    """Workload rows (running ones admitted, with their allocations), in bulk; how many
    run."""
    rows = Workload.objects.bulk_create(
        (workload_row(wl, projects[wl.queue_id], user, shift) for wl in workloads),
        batch_size=BATCH,
    )
    PodAllocation.objects.bulk_create(
        (
            allocation_row(row, placed, node_pks)
            for row, wl in zip(rows, workloads, strict=True)
            for placed in wl.placement or ()
        ),
        batch_size=BATCH,
    )
    return sum(1 for wl in workloads if wl.placement is not None)


def workload_row(wl: t.Workload, project: Project, user: User, shift: float) -> Workload:
    pod = wl.pods[0]
    request, gpus = GpuRequestKind.WHOLE, Decimal(pod.gpus)
    if pod.gpu_fraction:
        request, gpus = GpuRequestKind.FRACTION, Decimal(str(pod.gpu_fraction))
    elif pod.gpu_memory_mib:
        request, gpus = GpuRequestKind.MEMORY, Decimal(0)
    running = wl.placement is not None
    return Workload(
        project=project,
        submitted_by=user,
        kind="training",
        name=f"w-{wl.id}",
        image="bench",
        gpu_request=request,
        gpus=gpus,
        gpu_memory_mib=pod.gpu_memory_mib,
        cpu=Decimal(str(pod.cpu)),
        memory_mib=pod.memory_mib or HOST_MEMORY_MIB,
        pods=len(wl.pods),
        min_pods=wl.min_pods or len(wl.pods),
        node_pools=list(wl.pools),
        topology_level=wl.topology.level if wl.topology else "",
        topology_required=bool(wl.topology and wl.topology.mode == t.TopologyMode.REQUIRED),
        priority_class=wl.priority_class,
        priority=wl.priority,
        preemptible=wl.preemptible,
        state=WorkloadState.ADMITTED if running else WorkloadState.PENDING,
        queued_at=moment(wl.submit_time + shift),
        admitted_at=moment(wl.started_at + shift) if running and wl.started_at else None,
        last_checkpoint_at=moment(wl.last_checkpoint_time + shift)
        if wl.last_checkpoint_time
        else None,
    )


def allocation_row(
    row: Workload, placed: t.PodPlacement, node_pks: dict[str, int]
) -> PodAllocation:
    shared = placed.shared_gpu is not None
    return PodAllocation(
        workload=row,
        pod_index=placed.pod,
        node_id=node_pks[placed.node_id],
        gpu_indices=list(placed.gpus),
        shared_gpu_index=placed.shared_gpu,
        gpu_share=Decimal(str(round(placed.share, 3))) if shared else None,
        gpu_memory_mib=placed.gpu_memory_mib,
    )


def moment(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)
