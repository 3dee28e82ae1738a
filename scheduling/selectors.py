"""Reads for the workload pages and the API: lists, the queue, usage per project."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db.models import (
    Count,
    DecimalField,
    DurationField,
    ExpressionWrapper,
    F,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from clusters.models import Backend, Cluster
from clusters.selectors import SSH_USER
from portal.models import Project, ProjectQuota
from portal.permissions import visible_projects
from portal.selectors import project_named
from scheduling.adapters import project_queue
from scheduling.bounds import fmt, query_id
from scheduling.engine.mig import AUTO, pod_fraction
from scheduling.engine.types import PodRequest
from scheduling.models import (
    ACTIVE_STATES,
    CycleRun,
    GpuRequestKind,
    PodAllocation,
    Workload,
    WorkloadState,
)

SORTS = {
    "name": "name",
    "project": "project__name",
    "kind": "kind",
    "state": "state",
    "user": "submitted_by__username",
    "gpus": "gpus_requested",
    "gpus_allocated": "gpus_held",
    "pool": "first_pool",
    "node": "first_node",
    "age": "-created_at",
    "runtime": "runtime",
    "created": "created_at",
}
# Sort keys over computed columns: annotated only when asked for.
ANNOTATED_SORTS = ("gpus_held", "first_pool", "first_node", "runtime")
FILTERS = ("project", "kind", "state", "user", "cluster")


def workload_list(user: Any, params: Any = None) -> QuerySet[Workload]:
    """Workloads the user may see, filtered by project (name or id), kind, state, user and
    cluster (name or id), sorted by `sort` (a key of SORTS, '-' for descending)."""
    params = params or {}
    qs = (
        Workload.objects.filter(project__in=visible_projects(user))
        .select_related("project", "submitted_by")
        .prefetch_related(
            Prefetch("allocations", queryset=PodAllocation.objects.select_related("node__pool"))
        )
        .annotate(gpus_requested=F("gpus") * F("pods"))
    )
    project = params.get("project")
    if project:
        qs = qs.filter(project__in=project_named(visible_projects(user), project))
    if params.get("kind"):
        qs = qs.filter(kind=params["kind"])
    if params.get("state"):
        qs = qs.filter(state=params["state"])
    if params.get("user"):
        qs = qs.filter(submitted_by__username=params["user"])
    if params.get("cluster"):  # where it runs or last ran (name or id)
        cluster = str(params["cluster"])
        if cluster.isdigit():  # an id no row can have matches nothing
            qs = qs.filter(cluster_id=query_id(cluster)) if query_id(cluster) else qs.none()
        else:
            qs = qs.filter(cluster__name=cluster)
    if params.get("parent"):
        parent = query_id(params["parent"])
        qs = qs.filter(parent_id=parent) if parent else qs.none()
    sort = params.get("sort", "")
    column = SORTS.get(sort.lstrip("-"), "")
    if column in ANNOTATED_SORTS:
        qs = qs.annotate(**{column: _sort_annotation(column)})
    return qs.order_by(*_ordering(sort))


def cluster_names() -> list[str]:
    """For the list's cluster filter (pages filter by cluster when several feed the pools)."""
    return list(Cluster.objects.order_by("name").values_list("name", flat=True))


def _ordering(sort: str) -> list[Any]:
    descending = sort.startswith("-")
    column = SORTS.get(sort.lstrip("-"))
    if column is None:
        return ["-created_at", "-id"]
    if column.startswith("-"):
        column, descending = column[1:], not descending
    # Workloads without a value (no pod placed, never started) go last either way.
    order = F(column).desc(nulls_last=True) if descending else F(column).asc(nulls_last=True)
    return [order, "-id"]


def _sort_annotation(column: str) -> Any:
    """The SQL of a computed column of the list (see gpus_allocated, placement_of, runtime_s)."""
    if column == "runtime":
        start = Coalesce(F("started_at"), F("admitted_at"))
        return ExpressionWrapper(Coalesce(F("finished_at"), Now()) - start, DurationField())
    pods = PodAllocation.objects.filter(workload=OuterRef("pk"))
    if column == "gpus_held":
        # A pod holds its whole GPUs (the workload's count) or its share of a shared one.
        held = Coalesce(F("gpu_share"), OuterRef("gpus"), output_field=DecimalField())
        total = pods.values("workload").annotate(total=Sum(held)).values("total")
        return Coalesce(Subquery(total), Value(0), output_field=DecimalField())
    path = "node__pool__name" if column == "first_pool" else "node__name"
    return Subquery(pods.exclude(**{f"{path}__isnull": True}).order_by(path).values(path)[:1])


def gpus_allocated(wl: Workload) -> Decimal:
    """Whole GPUs held, plus shares of shared GPUs and MIG slices (slices / 7)."""
    total = Decimal(0)
    for alloc in wl.allocations.all():
        total += len(alloc.gpu_indices)
        total += alloc.gpu_share or 0
        if alloc.mig_profile:
            fraction = pod_fraction(PodRequest(mig_profile=alloc.mig_profile))
            total += Decimal(fraction).quantize(Decimal("0.001"))
    return total


def workload_size(wl: Workload) -> dict[str, int]:
    """Pods running now (allocated), and the range it may run with."""
    running = [a for a in wl.allocations.all() if not a.releasing]
    if wl.min_gpus is not None:  # a GPU range: the GPUs of its one pod
        current = sum(len(a.gpu_indices) for a in running)
        return {"current": current, "min": wl.min_gpus, "max": int(wl.gpus)}
    return {"current": len(running), "min": wl.min_pods, "max": wl.pods}


def size_text(wl: Workload) -> str:
    """'3 of 2..8 pods' for an elastic workload, '' for any other."""
    if not wl.elastic:
        return ""
    size = workload_size(wl)
    unit = "replicas" if wl.kind == "inference" else "pods"
    unit = "GPUs" if wl.min_gpus is not None else unit
    return f"{size['current']} of {size['min']}..{size['max']} {unit}"


def gpus_requested(wl: Workload) -> str:
    if wl.gpu_request == GpuRequestKind.MEMORY:
        return f"{wl.pods} x {wl.gpu_memory_mib} MiB"
    if wl.gpu_request == GpuRequestKind.MIG:
        what = wl.mig_profile if wl.mig_profile != AUTO else f"{wl.gpu_memory_mib} MiB"
        return f"{wl.pods} x MIG {what}"
    if wl.min_gpus is not None:  # a GPU range: one pod, at least min_gpus, up to gpus
        return f"{wl.min_gpus}..{fmt(wl.gpus)}"
    return fmt(wl.gpus * wl.pods)


def _counted_in_gpus(wl: Workload) -> bool:
    return wl.gpu_request not in (GpuRequestKind.MIG, GpuRequestKind.MEMORY)


def runtime_s(wl: Workload) -> float | None:
    start = wl.started_at or wl.admitted_at
    if start is None:
        return None
    end = wl.finished_at if wl.finished_at and wl.finished_at > start else timezone.now()
    return (end - start).total_seconds()


def placement_of(wl: Workload) -> dict[str, str]:
    allocations = list(wl.allocations.all())
    pools = sorted({a.node.pool.name for a in allocations if a.node.pool})
    nodes = sorted({a.node.name for a in allocations})
    return {"pool": ", ".join(pools), "node": ", ".join(nodes)}


def port_path(workload_id: int, name: str) -> str:
    """The stable address of a workload's HTTP port, served by the portal's proxy
    (workspaces.proxy)."""
    return f"/workloads/{workload_id}/ports/{name}/"


def ssh_path(workload_id: int) -> str:
    """The WebSocket that carries an SSH connection to the workload (`gpupool ssh`)."""
    return f"/workloads/{workload_id}/ssh"


def workload_links(wl: Workload) -> dict[str, Any]:
    """What the workload page, the API and `gpupool describe` offer to reach it: a URL per
    HTTP port; TCP ports as they are (inside the cluster); SSH when it was started with it."""
    ports = []
    for port in (wl.spec or {}).get("ports", []):
        protocol = port.get("protocol", "http")
        url = port_path(wl.pk, port["name"]) if protocol == "http" else ""
        ports.append({"name": port["name"], "port": port["port"], "protocol": protocol,
                      "url": url})  # fmt: skip
    ssh = None
    if (wl.spec or {}).get("ssh"):
        ssh = {"user": SSH_USER, "path": ssh_path(wl.pk), "command": f"gpupool ssh {wl.pk}"}
    return {"ports": ports, "ssh": ssh}


def workload_row(wl: Workload) -> dict[str, Any]:
    """One row of the list page, the CSV and the CLI's table."""
    place = placement_of(wl)
    runtime = runtime_s(wl)
    return {
        "id": wl.pk,
        "name": wl.name,
        "project": wl.project.name,
        "kind": wl.kind,
        "state": wl.state,
        "user": wl.submitted_by.username,
        "gpus_requested": gpus_requested(wl),
        "gpus_allocated": f"{gpus_allocated(wl).normalize():f}",
        "node_pool": place["pool"],
        "node": place["node"],
        "age_s": int((timezone.now() - wl.created_at).total_seconds()),
        "runtime_s": None if runtime is None else int(runtime),
        "restarts": wl.restart_count,
        "pending_reason": wl.pending_reason if wl.state == WorkloadState.PENDING else "",
        "why": workload_why(wl),
    }


# States whose reason the user needs wherever the workload shows: what it waits for, or
# why it ended or was sent back (failed items once showed no reason on the home page).
WHY_STATES = (WorkloadState.FAILED, WorkloadState.STOPPED, WorkloadState.PREEMPTED)


# States whose `pending_reason` is what they wait for: the cycle's, of pending work; the
# reconcile's, of admitted work whose pods the cluster holds back (a native sharer waiting
# for its GPU's MPS daemon: clusters.reconcile._record_waits).
WAIT_STATES = (WorkloadState.PENDING, WorkloadState.ADMITTED, WorkloadState.RUNNING)


def workload_waits(wl: Workload) -> bool:
    """Whether its why (`workload_why`) is what it waits for, not why it ended."""
    return wl.state in WAIT_STATES


def workload_why(wl: Workload) -> str:
    """Why it is where it is, in one line: what a pending workload waits for, or an admitted
    one's pods, or why a failed, stopped or preempted one ended (its message, with a
    non-zero exit code)."""
    if workload_waits(wl):
        return wl.pending_reason
    if wl.state not in WHY_STATES:
        return ""
    text = wl.message.strip()
    if wl.exit_code not in (None, 0) and "exit code" not in text.lower():
        text = f"{text} (exit code {wl.exit_code})".strip()
    return text


def workload_origin(wl: Workload) -> dict[str, Any] | None:
    """Where a workload made outside GPUPool comes from (kubectl, Helm, an operator:
    clusters/native.py): its owner object, who made it, its pods; None for portal work."""
    native = (wl.spec or {}).get("native")
    if not native:
        return None
    owner = native.get("owner") or {}
    namespace, manager = native.get("namespace", ""), native.get("manager", "")
    summary = f"{owner.get('kind', '')} {namespace}/{owner.get('name', '')}"
    return {
        "api_version": owner.get("apiVersion", ""),
        "kind": owner.get("kind", ""),
        "name": owner.get("name", ""),
        "namespace": namespace,
        "manager": manager,
        "pods": [slot[0] for slot in native.get("pods") or [] if slot],
        "summary": summary + (f" (made by {manager})" if manager else ""),
    }


def last_cycle() -> CycleRun | None:
    return CycleRun.objects.filter(ok=True).order_by("-started_at", "-id").first()


# --- The queue ---------------------------------------------------------------------------


@dataclass
class QueueRow:
    """A project's standing: deserved, fair share and allocation in GPUs (all pools)."""

    project: Project
    deserved: float = 0.0
    fair_share: float = 0.0
    allocated: float = 0.0
    pending: list[Workload] = field(default_factory=list)
    running: int = 0  # counted for the home page only (my_projects)
    waiting: int = 0

    @property
    def over_quota(self) -> float:
        return max(0.0, self.allocated - self.deserved)


def _queue_rows(projects: list[Project], shares: list[dict]) -> dict[int, QueueRow]:
    rows = {p.pk: QueueRow(project=p) for p in projects}
    by_queue = {p.pk: project_queue(p.pk) for p in projects}
    fair = {}
    for share in shares:
        if share["resource"] == "gpu":
            fair[share["queue"]] = fair.get(share["queue"], 0.0) + share["fair_share"]
    for quota in ProjectQuota.objects.filter(project__in=projects):
        rows[quota.project_id].deserved += float(quota.gpus)
    for pk, row in rows.items():
        row.fair_share = fair.get(by_queue[pk], 0.0)
    for alloc in (
        PodAllocation.objects.filter(workload__project__in=projects)
        .only("gpu_indices", "gpu_share", "workload__project_id")
        .select_related("workload")
    ):
        rows[alloc.workload.project_id].allocated += len(alloc.gpu_indices) + float(
            alloc.gpu_share or 0
        )
    return rows


def queue_order(user: Any) -> tuple[list[QueueRow], list[tuple[int, Workload]]]:
    """The queues, most starved first, and pending workloads in the order the engine
    considered them in the last cycle (CycleRun.pending_order); workloads it has not seen
    yet (submitted since) come last, by priority then age."""
    projects = list(Project.objects.select_related("department").order_by("pk"))
    cycle = last_cycle()
    rows = _queue_rows(projects, cycle.shares if cycle else [])
    pending = list(
        Workload.objects.filter(state=WorkloadState.PENDING)
        .exclude(kind="hpo")
        .select_related("project", "submitted_by")
        .order_by("-priority", "queued_at", "pk")
    )
    for wl in pending:
        rows[wl.project_id].pending.append(wl)
    order = _engine_order(pending, cycle.pending_order if cycle else [])
    visible = set(visible_projects(user).values_list("pk", flat=True))
    shown_rows = _rows_in_engine_order(
        [r for r in rows.values() if r.project.pk in visible], order, cycle
    )
    shown = [wl for wl in order if wl.project_id in visible]
    return shown_rows, list(enumerate(shown, start=1))


def _rows_in_engine_order(
    rows: list[QueueRow], order: list[Workload], cycle: CycleRun | None
) -> list[QueueRow]:
    """Projects in the order the engine first served them in the last cycle (its key:
    department, then project, by dominant share over GPUs, CPU and memory where those
    are limited); projects it did not consider after them, by GPUs held against their
    fair share (the engine's GPU key)."""
    seen = set(cycle.pending_order) if cycle else set()
    first: dict[int, int] = {}
    for wl in order:
        if wl.pk in seen:
            first.setdefault(wl.project_id, len(first))
    last = len(first)
    return sorted(
        rows,
        key=lambda r: (
            first.get(r.project.pk, last),
            _starvation(r.allocated, r.fair_share, r.deserved, r.project.pk),
        ),
    )


def _starvation(alloc: float, fair: float, deserved: float, pk: int) -> tuple:
    # The engine's per-queue key (allocate.starvation_key) for GPUs over all pools.
    ratio = alloc / fair if fair > 1e-9 else (0.0 if alloc <= 1e-9 else math.inf)
    return (alloc >= deserved - 1e-9, ratio, alloc, pk)


def _engine_order(pending: list[Workload], stored: list[int]) -> list[Workload]:
    """Pending workloads (by priority, then age) rearranged into the engine's order;
    those absent from it keep their place after all the ones it considered."""
    position = {pk: n for n, pk in enumerate(stored)}
    last = len(position)
    # sorted() is stable: the unseen keep the priority-then-age order of the query.
    return sorted(pending, key=lambda wl: position.get(wl.pk, last))


# --- Project usage -----------------------------------------------------------------------


def project_usage(project: Project) -> dict[str, Any]:
    """Per node pool: deserved, limit, fair share (last cycle) and allocated GPUs, plus
    the project's running and pending counts."""
    pools: dict[str, dict[str, Any]] = {}
    for quota in ProjectQuota.objects.filter(project=project).select_related("node_pool"):
        pools[quota.node_pool.name] = {
            "pool": quota.node_pool.name,
            "deserved": float(quota.gpus),
            "limit": None if quota.gpus_limit is None else float(quota.gpus_limit),
            "fair_share": 0.0,
            "allocated": 0.0,
        }
    cycle = last_cycle()
    queue = project_queue(project.pk)
    for share in cycle.shares if cycle else []:
        if share["queue"] == queue and share["resource"] == "gpu":
            _pool_row(pools, share["pool"])["fair_share"] = share["fair_share"]
    held = PodAllocation.objects.filter(workload__project=project).select_related("node__pool")
    for alloc in held:
        row = _pool_row(pools, alloc.node.pool.name if alloc.node.pool else "-")
        row["allocated"] += len(alloc.gpu_indices) + float(alloc.gpu_share or 0)
    states = Workload.objects.filter(project=project).exclude(kind="hpo")
    return {
        "pools": sorted(pools.values(), key=lambda r: r["pool"]),
        "running": states.filter(state__in=ACTIVE_STATES).count(),
        "pending": states.filter(state=WorkloadState.PENDING).count(),
        "cycle_at": cycle.started_at if cycle else None,
    }


def _pool_row(pools: dict[str, dict[str, Any]], name: str) -> dict[str, Any]:
    return pools.setdefault(
        name,
        {"pool": name, "deserved": 0.0, "limit": None, "fair_share": 0.0, "allocated": 0.0},
    )


# --- A researcher's home page ------------------------------------------------------------

HOME_LIMIT = 50  # rows of "my work"; the workload list holds the rest
RECENT = dt.timedelta(hours=24)
OPEN_STATES = (WorkloadState.PENDING, *ACTIVE_STATES, WorkloadState.PREEMPTED)


def my_work(user: Any) -> list[dict[str, Any]]:
    """The user's own workloads and workspaces that run or wait, then those that ended in
    the last day: one row each (sweep trials count under their sweep), newest first.
    Four queries whatever the number of rows."""
    since = timezone.now() - RECENT
    workloads = (
        Workload.objects.filter(
            project__in=visible_projects(user), submitted_by=user, parent__isnull=True
        )
        .filter(Q(state__in=OPEN_STATES) | Q(finished_at__gte=since))
        .select_related("project", "submitted_by", "cluster", "workspace")
        .prefetch_related(
            Prefetch("allocations", queryset=PodAllocation.objects.select_related("node__pool"))
        )
        .order_by("-created_at", "-id")[:HOME_LIMIT]
    )
    return [_work_row(wl) for wl in workloads]


def _work_row(wl: Workload) -> dict[str, Any]:
    row = workload_row(wl)
    active = wl.state in ACTIVE_STATES
    workspace = getattr(wl, "workspace", None)  # selected with the workload: no query
    row.update(
        kind_label=wl.get_kind_display(),
        # One figure per workload: what it holds while active, in GPUs; a request for MIG
        # instances or GPU memory is named as asked everywhere (never 0.429 here and "1 x
        # MIG 3g.40gb" elsewhere).
        gpus=row["gpus_allocated"] if active and _counted_in_gpus(wl) else row["gpus_requested"],
        open=active or wl.state in (WorkloadState.PENDING, WorkloadState.PREEMPTED),
        url=f"/workspaces/{wl.pk}/" if workspace else f"/workloads/{wl.pk}/",
        lab_url=workspace.lab_url if workspace and wl.state == WorkloadState.RUNNING else "",
        simulated=bool(wl.cluster and wl.cluster.backend == Backend.SIMULATED),
    )
    return row


def my_projects(user: Any) -> list[QueueRow]:
    """The projects the user is a member of, with GPUs deserved, fair share (last cycle)
    and held in all pools, and their running and pending counts: a fixed number of queries."""
    projects = list(
        Project.objects.filter(memberships__user=user)
        .select_related("department")
        .distinct()
        .order_by("name")
    )
    cycle = last_cycle()
    rows = _queue_rows(projects, cycle.shares if cycle else [])
    counts = (
        Workload.objects.filter(project__in=projects, parent__isnull=True)
        .values_list("project_id", "state")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for project_id, state, n in counts:
        row = rows[project_id]
        if state in ACTIVE_STATES:
            row.running += n
        elif state == WorkloadState.PENDING:
            row.waiting += n
    return list(rows.values())


def workload_runs(
    wl: Workload, backends: dict[str, set[str]], gpu_pools: set[str] | None = None
) -> dict[str, Any]:
    """Whether its code really runs, in words and as a flag, so that no page or command
    leaves a user guessing (a CLI submit without --node-pool once landed on a simulated
    pool and said nothing). `backends`: clusters.selectors.pool_backends(); `gpu_pools`:
    the pools with GPUs (a pool without any cannot take work that asks for GPUs); both
    read once per answer.

    simulated: True (nothing runs: a simulated cluster only records it), False (processes
    or pods really run), None (pending, and pools of both kinds may take it)."""
    gpu_pools = set(backends) if gpu_pools is None else gpu_pools
    wants_gpus = wl.gpus > 0 or wl.gpu_request in (GpuRequestKind.MIG, GpuRequestKind.MEMORY)
    real_pools = sorted(name for name, kinds in backends.items() if kinds - {Backend.SIMULATED})
    if wl.cluster is not None:
        simulated = wl.cluster.backend == Backend.SIMULATED
        where = f"cluster {wl.cluster.name}"
        summary = (
            f"Simulated ({where}): nothing runs; its log is a note, not output."
            if simulated
            else f"Runs for real on {where} ({wl.cluster.backend})."
        )
        return {"simulated": simulated, "summary": summary, "real_pools": real_pools}
    pools = [
        p for p in (list(wl.node_pools) or sorted(backends)) if p in gpu_pools or not wants_gpus
    ]
    fake = [p for p in pools if backends.get(p) == {Backend.SIMULATED}]
    real = [p for p in pools if backends.get(p, set()) - {Backend.SIMULATED}]
    if fake and not real:
        simulated: bool | None = True
        summary = f"Only simulated pools can take it ({', '.join(fake)}): nothing will run."
        if real_pools:
            named = [p if p in gpu_pools else f"{p} (no GPUs)" for p in real_pools]
            summary += f" Pools with real nodes: {', '.join(named)} (--node-pool)."
    elif fake:
        simulated = None
        summary = (
            f"It may land on a simulated pool ({', '.join(fake)}), where nothing runs, or on "
            f"{', '.join(real)}, where it runs for real; --node-pool chooses."
        )
    else:
        simulated = False
        summary = f"Runs for real, in {', '.join(real) or 'no pool yet'}."
    return {"simulated": simulated, "summary": summary, "real_pools": real_pools}


# The tag of the "is queued." banner after a submit: shown only while that is still true.
QUEUED = "queued"


def queued_banner_stale(workload: Workload) -> str:
    """QUEUED when the workload has left the queue (a banner saying "queued" above "State:
    Failed" told two things at once); base.html then leaves such banners out."""
    return "" if workload.state in (WorkloadState.PENDING, WorkloadState.ADMITTED) else QUEUED
