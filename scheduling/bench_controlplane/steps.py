"""The measured steps: cycles, reconcile passes, inventory syncs, submissions through the
API, and a cycle waiting for the node lock while an inventory sync holds it.

Cycles and reconciles run through their Celery tasks' functions (`run_cycle`,
`reconcile_cluster`), called in this process as a worker would run them. While the bench
drives each step itself, the signals that would queue further tasks are disconnected
(`tasks_muted`); the latency samples turn them back on with eager Celery, so one API call
runs submit, cycle and reconcile in a chain, as a worker would soon after.
"""

from __future__ import annotations

import contextlib
import cProfile
import json
import os
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from django.db import connection
from django.test import Client
from django.utils import timezone

import scheduling.cycle
from clusters import inventory
from clusters.backends import NodeInfo
from clusters.backends.simulated import SimulatedBackend
from clusters.models import Cluster, SimulatedPod
from clusters.reconcile import full_pass_next
from clusters.tasks import on_clusters_changed, reconcile_cluster
from portal.celery import app as celery_app
from portal.models import Project
from scheduling import signals
from scheduling.bench_controlplane.probe import Cost, measured
from scheduling.models import CycleRun, PriorityClass, Workload, WorkloadEvent, WorkloadState
from scheduling.tasks import on_cycle_wanted, run_cycle

# The receivers as the apps connect them (scheduling/apps.py, clusters/apps.py).
RECEIVERS = (
    (signals.cycle_wanted, on_cycle_wanted, "scheduling.cycle"),
    (signals.clusters_changed, on_clusters_changed, "clusters.reconcile"),
)
CHANGED_LABEL = "gpupool.io/bench-tick"
T = TypeVar("T")


@contextlib.contextmanager
def tasks_muted() -> Iterator[None]:
    """No task queued on commit: the bench runs each cycle and reconcile itself."""
    for signal, _, uid in RECEIVERS:
        signal.disconnect(dispatch_uid=uid)
    try:
        yield
    finally:
        for signal, receiver, uid in RECEIVERS:
            signal.connect(receiver, dispatch_uid=uid)


@contextlib.contextmanager
def eager_tasks() -> Iterator[None]:
    """Celery tasks run at once, in this process (the app reads CELERY_-prefixed keys)."""
    conf = celery_app.conf
    previous = conf.CELERY_TASK_ALWAYS_EAGER
    conf.CELERY_TASK_ALWAYS_EAGER = True
    try:
        yield
    finally:
        conf.CELERY_TASK_ALWAYS_EAGER = previous


@dataclass(slots=True)
class CycleCost:
    cost: Cost
    admitted: int = 0
    evicted: int = 0
    pending: int = 0
    ok: bool = True
    quarantined: int = 0

    def as_dict(self) -> dict[str, Any]:
        return self.cost.as_dict() | {
            "admitted": self.admitted,
            "evicted": self.evicted,
            "pending": self.pending,
            "ok": self.ok,
            "quarantined": self.quarantined,
        }


def cycle() -> CycleCost:
    """One cycle through the task's function; what it decided."""
    with snapshots_kept(), measured() as cost:
        run_id = run_cycle()
    run = CycleRun.objects.get(pk=run_id)
    return CycleCost(cost, run.admitted, run.evicted, run.pending, run.ok, run.quarantined)


# What a reconcile step reports beside its cost: pods made and deleted, and the rows its
# targeted passes read to find that work (pods, allocations compared).
RECONCILE_KEYS = ("created", "deleted", "pods_read", "allocations_read")


def reconcile(cluster: Cluster) -> tuple[Cost, dict]:
    with measured() as cost:
        result = reconcile_cluster(cluster.pk) or {}
    return cost, result


class ChangedInventory(SimulatedBackend):
    """The simulated cluster with one node in `every` (None: none) carrying a new label
    value."""

    def __init__(self, cluster: Cluster, every: int | None, tick: str) -> None:
        super().__init__(cluster)
        self.every, self.tick = every, tick

    def list_inventory(self) -> list[NodeInfo]:
        if self.every is None:
            return super().list_inventory()
        return [
            replace(node, labels={**node.labels, CHANGED_LABEL: self.tick})
            if i % self.every == 0
            else node
            for i, node in enumerate(super().list_inventory())
        ]


def inventory_changed(cluster: Cluster, share: float, tick: str) -> Cost:
    """An inventory sync in which `share` of the nodes (at least one) changed."""
    backend = ChangedInventory(cluster, max(1, round(1 / share)), tick)
    with measured() as cost:
        inventory.inventory_sync(cluster, backend=backend)
    return cost


def inventory_idle(cluster: Cluster) -> Cost:
    with measured() as cost:
        inventory.inventory_sync(cluster)
    return cost


@dataclass(slots=True)
class Submitter:
    """Training jobs of one GPU through POST /api/v1/workloads/, round-robin over the
    projects, signed in as the bench's platform admin. `urgent`: in the priority class
    above every other (inference's) and preemptible, so that it goes first in its project
    and may borrow: what the cycle owes it is prompt."""

    user: Any
    projects: list[str]
    client: Client = field(default_factory=Client)
    made: int = 0
    urgent: bool = False

    def __post_init__(self) -> None:
        self.client.force_login(self.user)

    def submit(self) -> int:
        project = self.projects[self.made % len(self.projects)]
        body = {"project": project, "kind": "training", "name": f"arrival-{self.made}"}
        body |= {"image": "bench", "gpus": 1}
        if self.urgent:
            body |= {"priority_class": PriorityClass.INFERENCE, "preemptible": True}
        self.made += 1
        response = self.client.post("/api/v1/workloads/", json.dumps(body), "application/json")
        if response.status_code != 201:
            raise RuntimeError(f"the API answered {response.status_code}: {response.content!r}")
        return int(response.json()["id"])


def projects_with_room() -> list[str]:
    """Projects whose GPU allocation the last cycle left at least one GPU below their fair
    share in some pool."""
    run = CycleRun.objects.filter(ok=True).order_by("-pk").first()
    rows = run.shares if run else []
    names = {
        row["name"]
        for row in rows
        if row["resource"] == "gpu" and row["fair_share"] - row["allocated"] >= 1
    }
    return sorted(Project.objects.filter(name__in=names).values_list("name", flat=True))


def submissions(submitter: Submitter, count: int) -> tuple[Cost, list[int]]:
    with measured() as cost:
        ids = [submitter.submit() for _ in range(count)]
    return cost, ids


@dataclass(slots=True)
class Latency:
    admitted_s: float | None  # when its timeline says Admitted (the state changed)
    pod_s: float | None
    rounds: int  # cycles run by hand after the submit's own chain
    stamped_s: float | None = None  # its admitted_at: the deciding cycle's start


def latency_sample(submitter: Submitter, cluster: Cluster, rounds: int = 6) -> Latency:
    """Submit with eager tasks (the submit's commit runs a cycle, whose commit runs a
    reconcile); if that chain did not admit it, run cycle and reconcile again at once, as
    the next requested cycle would, up to `rounds` times."""
    began = timezone.now()
    with eager_tasks():
        wid = submitter.submit()
    done = 0
    while done < rounds and not _pod_of(cluster, wid):
        with tasks_muted():
            run_cycle()
            reconcile_cluster(cluster.pk)
        done += 1
    workload = Workload.objects.get(pk=wid)
    pod = _pod_of(cluster, wid)
    admitted = (
        WorkloadEvent.objects.filter(workload_id=wid, type=WorkloadState.ADMITTED)
        .values_list("created_at", flat=True)
        .first()
    )
    return Latency(
        admitted_s=_since(began, admitted),
        pod_s=_since(began, pod.started_at if pod else None),
        rounds=done,
        stamped_s=_since(began, workload.admitted_at),
    )


def _pod_of(cluster: Cluster, wid: int) -> SimulatedPod | None:
    return SimulatedPod.objects.filter(cluster=cluster, workload_id=wid).order_by("pk").first()


def _since(began: Any, moment: Any) -> float | None:
    return None if moment is None else (moment - began).total_seconds()


@dataclass(slots=True)
class Arrival:
    """One job's way from submit to its pod running, step by step."""

    steps: list[dict[str, Any]]
    rounds: int  # cycle + reconcile rounds run after the submit
    pod: bool  # its pod runs in the cluster at the end

    def total_cpu_s(self) -> float | None:
        totals = [step["total_cpu_s"] for step in self.steps]
        return None if None in totals else round(sum(totals), 4)

    def as_dict(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "pod": self.pod,
            "sql": sum(step["sql"] for step in self.steps),
            "wall_s": round(sum(step["wall_s"] for step in self.steps), 4),
            "gc_s": round(sum(step["gc_s"] for step in self.steps), 4),
            "total_cpu_s": self.total_cpu_s(),
            "steps": self.steps,
        }


def arrival(submitter: Submitter, cluster: Cluster, *, full: bool, rounds: int = 4) -> Arrival:
    """Submit one job, then cycle and reconcile (targeted, or `full` passes) until its pod
    runs, up to `rounds` times: a reclaim frees its GPUs in one round, admits in the next."""
    cost, (wid,) = submissions(submitter, 1)
    steps = [{"step": "submit"} | cost.as_dict()]
    done = 0
    while done < rounds and not _pod_of(cluster, wid):
        kind = "full_pass" if full else "targeted"
        made = profiled(f"arrival-{kind}-cycle-{done}", cycle)
        steps.append({"step": "cycle"} | made.as_dict())
        if full:
            full_pass_next(cluster)
        cost, result = profiled(f"arrival-{kind}-reconcile-{done}", lambda: reconcile(cluster))
        read = {key: result.get(key) for key in RECONCILE_KEYS}
        steps.append({"step": "reconcile", "full": result.get("full")} | cost.as_dict() | read)
        done += 1
    return Arrival(steps, done, _pod_of(cluster, wid) is not None)


@contextlib.contextmanager
def patched(owner: object, name: str, make: Callable[[Callable], Callable]) -> Iterator[None]:
    """owner.name wrapped by make(original) for the block (measuring hooks only)."""
    original = getattr(owner, name)
    setattr(owner, name, make(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def lock_wait(cluster: Cluster, share: float, tick: str) -> dict[str, float]:
    """A cycle started while an inventory sync (its own thread and connection) is storing
    nodes: how long the cycle waited in `nodes_lock`, and how long the sync took."""
    storing, waits, sync = threading.Event(), [], {}

    def mark(write: Callable) -> Callable:
        def first_node_written(*args: Any) -> Any:
            written = write(*args)
            storing.set()  # the sync holds this node's row lock until its batch commits
            return written

        return first_node_written

    def timed(lock: Callable) -> Callable:
        def timed_lock() -> None:
            began = time.perf_counter()
            lock()
            waits.append(time.perf_counter() - began)

        return timed_lock

    def run_sync() -> None:
        began = time.perf_counter()
        try:
            inventory.inventory_sync(cluster, backend=ChangedInventory(cluster, every, tick))
        finally:
            sync["seconds"] = time.perf_counter() - began
            storing.set()
            connection.close()

    every = max(1, round(1 / share)) if share else None
    with (
        patched(inventory._NodeChange, "write", mark),
        patched(scheduling.cycle, "nodes_lock", timed),
    ):
        thread = threading.Thread(target=run_sync, name="bench-inventory")
        thread.start()
        storing.wait(timeout=600)
        run_cycle()
        thread.join()
    return {"lock_wait_s": round(max(waits, default=0.0), 4), "sync_s": round(sync["seconds"], 4)}


@contextlib.contextmanager
def snapshots_kept() -> Iterator[None]:
    """With GPUPOOL_BENCH_SNAPSHOT_DIR naming a folder, each cycle's engine input
    (snapshot, config, now) is pickled there, numbered in order (cycle-0001.pickle ...), to
    replay the engine's decisions offline: `python -m scheduling.engine.evictions_replay`."""
    folder = os.environ.get("GPUPOOL_BENCH_SNAPSHOT_DIR")
    if not folder:
        yield
        return
    Path(folder).mkdir(parents=True, exist_ok=True)

    def keeping(schedule: Callable) -> Callable:
        def kept(snapshot: Any, config: Any, now: float) -> Any:
            number = len(list(Path(folder).glob("cycle-*.pickle"))) + 1
            with (Path(folder) / f"cycle-{number:04d}.pickle").open("wb") as out:
                pickle.dump((snapshot, config, now), out)
            return schedule(snapshot, config, now)

        return kept

    with patched(scheduling.cycle, "schedule", keeping):
        yield


def profiled(name: str, step: Callable[[], T]) -> T:
    """step(), under cProfile when GPUPOOL_BENCH_PROFILE_DIR names a folder: its
    statistics go to <folder>/<name>.prof (read them with pstats). Profiling roughly
    doubles the step's CPU: the figures of a profiled run are not comparable."""
    folder = os.environ.get("GPUPOOL_BENCH_PROFILE_DIR")
    if not folder:
        return step()
    Path(folder).mkdir(parents=True, exist_ok=True)
    profile = cProfile.Profile()
    try:
        return profile.runcall(step)
    finally:
        profile.dump_stats(Path(folder) / f"{name}.prof")
