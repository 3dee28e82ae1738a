"""A simulated cluster: nodes and GPUs from a description, pods that "run" for a while.

The description (Cluster.config, written as YAML or JSON) lists node groups and single
nodes; labels are real label keys, so the cluster's node-pool and topology labels read
them like a real cluster's:

    groups:
      - {prefix: a100, count: 4, gpus: 8, gpu_model: NVIDIA A100-SXM4-80GB,
         gpu_memory_mib: 81920, cpu_cores: 96, memory_mib: 1048576,
         labels: {gpupool.io/node-pool: a100},
         spread: {gpupool.io/rack: [rack-1, rack-2]}}
    nodes:
      - {name: t4-0, gpus: 2, gpu_model: Tesla T4, labels: {gpupool.io/node-pool: t4}}
      - {name: h100-mig, gpus: 8, gpu_model: NVIDIA H100 80GB HBM3, mig_gpus: 4}
                           # mig_gpus: the last N GPUs run in MIG mode (dynamic MIG)
      - {name: shared-0, gpus: 8, foreign: {gpus: 2, cpu: 4, memory_mib: 16384,
         pods: [kube-system/dcgm-exporter-0, default/train-x]}}
                           # foreign: what pods GPUPool did not bind hold (a shared cluster)
    stop_delay_s: 0        # how long a stopped pod takes to go away (at most its grace period)
    down_nodes: [t4-0]     # nodes that failed: they vanish, and their pods with them
                           # (as do the pods of a node edited out of the description)
    sample_interval_s: 10  # synthetic GPU samples at most this often

A pod runs for its workload's spec.duration_s (none: until stopped), then succeeds.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import logging
import threading
from collections import defaultdict
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import yaml
from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.utils import timezone

from clusters.backends import (
    NO_FOREIGN_USE,
    Backend,
    ForeignUse,
    GpuInfo,
    MigKey,
    MigLayout,
    NodeInfo,
    PodChanges,
    PodPhase,
    PodSpec,
    PodStatus,
    ReconcileReport,
    deleted_into,
)
from clusters.mig import simulated_uuid
from clusters.models import SimulatedPod
from clusters.sharing import POD_PIPE_DIRECTORY, mps_env
from portal import versioned
from portal.errors import ValidationFailed

log = logging.getLogger(__name__)
NODE_KEYS = {"name", "gpus", "gpu_model", "gpu_memory_mib", "cpu_cores", "memory_mib", "mig_gpus"}


def description_parse(text: str) -> dict[str, Any]:
    """YAML (JSON is YAML too) into a checked description; ValidationFailed if it is not."""
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise ValidationFailed({"description": [f"Not valid YAML or JSON: {exc}"]}) from None
    if not isinstance(data, dict):
        raise ValidationFailed({"description": ["Must be a mapping with groups and/or nodes."]})
    try:
        nodes = description_nodes(data)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ValidationFailed({"description": [f"Cannot read the nodes: {exc!r}"]}) from None
    if not nodes:
        raise ValidationFailed({"description": ["Describe at least one node."]})
    if len({n.name for n in nodes}) != len(nodes):
        raise ValidationFailed({"description": ["Node names must be unique."]})
    return json.loads(json.dumps(data))  # dates and the like become plain JSON


def description_nodes(config: dict[str, Any]) -> list[NodeInfo]:
    nodes = []
    for group in config.get("groups") or []:
        count = int(group["count"])
        for i in range(count):
            labels = {str(k): str(v) for k, v in (group.get("labels") or {}).items()}
            for key, values in (group.get("spread") or {}).items():
                labels[str(key)] = str(values[i * len(values) // count])  # contiguous blocks
            nodes.append(_node({**group, "name": _group_node(group, i), "labels": labels}))
    nodes.extend(_node(item) for item in config.get("nodes") or [])
    return nodes


def description_node_names(config: dict[str, Any]) -> set[str]:
    """The described nodes' names alone (a pass reads them; their GPUs are not needed)."""
    names = {_group_node(g, i) for g in config.get("groups") or [] for i in range(int(g["count"]))}
    return names | {str(item["name"]) for item in config.get("nodes") or []}


def _group_node(group: dict[str, Any], i: int) -> str:
    return f"{group['prefix']}-{i}"


def _node(item: dict[str, Any]) -> NodeInfo:
    gpus = int(item.get("gpus", 0))
    mig_from = gpus - int(item.get("mig_gpus", 0))
    return NodeInfo(
        name=str(item["name"]),
        labels={str(k): str(v) for k, v in (item.get("labels") or {}).items()},
        cpu_cores=float(item.get("cpu_cores", 32)),
        memory_mib=int(item.get("memory_mib", 256 * 1024)),
        schedulable=bool(item.get("schedulable", True)),
        unschedulable_reason="" if item.get("schedulable", True) else "schedulable: false",
        foreign=_foreign(item.get("foreign") or {}),
        gpus=tuple(
            GpuInfo(
                index=i,
                model=str(item.get("gpu_model", "Simulated GPU")),
                memory_mib=int(item.get("gpu_memory_mib", 81920)),
                uuid=f"GPU-sim-{item['name']}-{i}",
                mig=i >= mig_from,
            )
            for i in range(gpus)
        ),
    )


def _foreign(item: dict[str, Any]) -> ForeignUse:
    """A node's `foreign` entry: what pods GPUPool did not bind hold there, and their
    names (at least one pod holds whatever is stated)."""
    if not item:
        return NO_FOREIGN_USE
    pods = [str(name) for name in item.get("pods") or []]
    return ForeignUse(
        gpus=max(int(item.get("gpus", 0)), 0),
        cpu=max(float(item.get("cpu", 0)), 0.0),
        memory_mib=max(int(item.get("memory_mib", 0)), 0),
        pod_count=max(len(pods), 1),
        pods=tuple(pods[:5]),
    )


class SimulatedBackend(Backend):
    partial_reconcile = True  # the base reconcile: creates and deletes, nothing per spec

    def test_connection(self) -> str:
        nodes = description_nodes(self.cluster.config)
        gpus = sum(len(n.gpus) for n in nodes)
        return f"Simulated cluster: {len(nodes)} nodes, {gpus} GPUs"

    def list_inventory(self) -> list[NodeInfo]:
        return [n for n in description_nodes(self.cluster.config) if n.name not in self.down]

    @property
    def down(self) -> set[str]:
        """Nodes listed in `down_nodes` have failed: gone, with every pod on them."""
        return set(self.cluster.config.get("down_nodes") or [])

    def pod_statuses(self) -> dict[str, PodStatus]:
        now = timezone.now()
        pods = self._pods_gone(now)
        # What a status needs, not the pods' env and GPUs: a pass reads every pod.
        rows = pods.values_list(*_STATUS_FIELDS, named=True)
        return {pod.name: _status(pod, now) for pod in rows}

    def pod_changes(self) -> PodChanges:
        """Every pod's status from what this process read before (`PodView`), reading
        again only the buckets whose sums moved (a pod made, deleted or written, in band or
        not) and those where a pod's program ended since (its phase moved by the clock)."""
        now = timezone.now()
        pods = self._pods_gone(now)
        with _views_lock:  # one pass at a time per view (a worker's threads)
            view = _views.setdefault(self.cluster.pk, PodView())
            sums = versioned.bucket_sums(pods, "workload_id", ["version"])
            moved = versioned.buckets_moved(sums, view.sums) | view.ended(now)
            everything = not view.sums and not view.statuses  # new: read every pod at once
            read = view.read(pods, None if everything else moved, now) if moved else 0
            return PodChanges(dict(view.statuses), moved, read)

    def _pods_gone(self, now: Any) -> Any:
        """Delete the pods that are gone by now: stopped long enough, or on a node that is
        no more. The cluster's pods, as a query."""
        stop_delay = timedelta(seconds=float(self.cluster.config.get("stop_delay_s", 0)))
        pods = SimulatedPod.objects.filter(cluster=self.cluster)
        gone = [
            pod.pk
            for pod in pods.filter(deleting_since__isnull=False)
            if now >= pod.deleting_since + _stop_time(pod, stop_delay)
        ]
        if gone:
            pods.filter(pk__in=gone).delete()
        # A node that failed (down_nodes) or left the description takes its pods with it.
        nodes = description_node_names(self.cluster.config) - self.down
        pods.exclude(node_name__in=nodes).delete()
        return pods

    def ensure_pod(self, spec: PodSpec) -> PodStatus:
        try:
            with transaction.atomic():
                pod, _ = SimulatedPod.objects.get_or_create(
                    cluster=self.cluster, name=spec.name, defaults=_pod_fields(spec)
                )
        except IntegrityError:  # another worker created it a moment ago
            pod = SimulatedPod.objects.get(cluster=self.cluster, name=spec.name)
        return _status(pod, timezone.now())

    def _create_all_into(self, report: ReconcileReport, specs: list[PodSpec]) -> None:
        """All of them in two statements: an insert that skips pods another worker made a
        moment ago, then one read of what the cluster holds under those names."""
        if not specs:
            return
        pods = [SimulatedPod(cluster=self.cluster, name=s.name, **_pod_fields(s)) for s in specs]
        SimulatedPod.objects.bulk_create(pods, ignore_conflicts=True)
        now = timezone.now()
        made = SimulatedPod.objects.filter(cluster=self.cluster, name__in=[s.name for s in specs])
        held = []
        for pod in made.order_by("name"):
            status = report.statuses[pod.name] = _status(pod, now)
            report.created.append(pod.name)
            held.append((pod, status))
        _view_fold(self.cluster.pk, held, [])

    def delete_pod(self, status: PodStatus, *, grace_period_s: int) -> bool:
        return self._stop([status.name], grace_period_s)

    def _delete_all_into(
        self, report: ReconcileReport, doomed: list[tuple[PodStatus, int]]
    ) -> None:
        """A statement per grace period, not per pod."""
        by_grace: dict[int, list[PodStatus]] = defaultdict(list)
        for status, grace in doomed:
            by_grace[grace].append(status)
        for grace, statuses in sorted(by_grace.items()):
            gone = self._stop([s.name for s in statuses], grace)
            for status in statuses:
                deleted_into(report, status, gone=gone)

    def _stop(self, names: list[str], grace_period_s: int) -> bool:
        """The simulated program takes `stop_delay_s` to exit on SIGTERM; the grace period
        cuts that short (SIGKILL), in the same virtual seconds. True: gone at once."""
        now = timezone.now()
        stop_s = min(float(self.cluster.config.get("stop_delay_s", 0)), grace_period_s)
        pods = SimulatedPod.objects.filter(cluster=self.cluster, name__in=names)
        if stop_s <= 0:
            pods.delete()
            _view_fold(self.cluster.pk, [], names)
            return True
        pods.filter(deleting_since__isnull=True).update(deleting_since=now, stop_after_s=stop_s)
        return False

    def pod_logs(self, name: str, namespace: str, *, tail_lines: int = 500) -> str:
        pod = SimulatedPod.objects.filter(cluster=self.cluster, name=name).first()
        if pod is None:
            return ""
        started = (
            f"[simulated] {name} started on {pod.node_name} at {pod.started_at:%Y-%m-%d %H:%M:%S}"
        )
        limits = {k: v for k, v in sorted((pod.env or {}).items()) if k.startswith("CUDA_MPS_")}
        if not limits:
            return started
        return (
            started + "\n[simulated] MPS client: " + " ".join(f"{k}={v}" for k, v in limits.items())
        )

    def mig_sync(self, wanted: MigLayout) -> tuple[dict[MigKey, str], list[str]]:
        """The instances "exist" as soon as they are wanted, with stable made-up UUIDs."""
        gpus = {
            (n.name, g.index): g for n in description_nodes(self.cluster.config) for g in n.gpus
        }
        made, errors = {}, []
        for (node, index), instances in sorted(wanted.items()):
            gpu = gpus.get((node, index))
            if gpu is None or not gpu.mig:
                errors.append(f"{node} GPU {index} is not in MIG mode")
                continue
            for profile, start in instances:
                made[(node, index, start)] = simulated_uuid(gpu.uuid, profile, start)
        return made, errors

    def reconcile(
        self,
        desired: list[PodSpec],
        *,
        grace_period_s: int,
        grace_periods: Mapping[int, int] | None = None,
        **partial: Any,
    ) -> ReconcileReport:
        report = super().reconcile(
            desired, grace_period_s=grace_period_s, grace_periods=grace_periods, **partial
        )
        self._emit_samples(report)
        return report

    def _emit_samples(self, report: ReconcileReport) -> None:
        """Synthetic utilization through the same ingestion path as real agents."""
        interval = float(self.cluster.config.get("sample_interval_s", 10))
        if not cache.add(f"gpupool:simsamples:{self.cluster.pk}", "1", interval):
            return
        try:
            from clusters.metrics.services import samples_ingest  # noqa: PLC0415 - optional
        except ImportError:
            return
        samples = synthetic_samples(self.cluster, report, self.list_inventory())
        try:
            samples_ingest(samples)
        except Exception:
            log.exception("synthetic samples of %s were refused", self.cluster.name)


def synthetic_samples(cluster: Any, report: ReconcileReport, nodes: list[NodeInfo]) -> list[dict]:
    """One sample per GPU: busy GPUs at a steady, pod-specific load, idle ones near zero."""
    now = timezone.now()
    busy: dict[tuple[str, int], PodStatus] = {}
    pods = {p.name: p for p in SimulatedPod.objects.filter(cluster=cluster)}
    for status in report.statuses.values():
        pod = pods.get(status.name)
        if pod is None or status.phase != PodPhase.RUNNING:
            continue
        indices = pod.gpu_indices if pod.shared_gpu_index is None else [pod.shared_gpu_index]
        for index in indices:
            busy[(pod.node_name, int(index))] = status
    samples = []
    for node in nodes:
        for gpu in node.gpus:
            status = busy.get((node.name, gpu.index))
            samples.append(_sample(cluster, node.name, gpu, status, now))
    return samples


def _sample(cluster: Any, node: str, gpu: GpuInfo, status: PodStatus | None, now: Any) -> dict:
    seed = int(hashlib.sha256(f"{node}/{gpu.index}/{now.minute}".encode()).hexdigest()[:6], 16)
    sample = {
        "cluster": cluster.pk,
        "node": node,
        "gpu_index": gpu.index,
        "ts": now,
        "mem_total_mib": gpu.memory_mib,
        "temp_c": 35 + seed % 10,
    }
    if status is None:
        sample.update(util_pct=0, mem_used_mib=0, power_w=60)
        return sample
    util = 55 + seed % 40
    sample.update(
        util_pct=util,
        mem_used_mib=gpu.memory_mib * (40 + seed % 50) // 100,
        power_w=100 + 3 * util,
        workload_id=status.workload_id,
        pod_index=status.pod_index,
    )
    return sample


class PodView:
    """One process's copy of one simulated cluster's pods (issue 25): their statuses, and
    the sums (`portal.versioned.bucket_sums`, by workload id) of exactly the rows it holds,
    so that a pass reads again only the buckets whose rows changed. A pod's phase also
    moves with the clock (its program ends): `ends` holds when, by bucket. Nothing is
    trusted but the sums: a copy from another database or test reads everything again."""

    def __init__(self) -> None:
        self.sums: dict[int, versioned.Sums] = {}
        self.statuses: dict[str, PodStatus] = {}
        self.names: dict[int, set[str]] = defaultdict(set)  # by bucket
        self.ends: list[tuple[Any, str]] = []  # (when its program ends, pod name): a heap
        self.end_of: dict[str, Any] = {}  # each running pod's end as pushed on the heap
        self.stamps: dict[str, tuple[int, int]] = {}  # each pod's (primary key, version)

    def ended(self, now: Any) -> set[int]:
        """The buckets of the pods whose programs ended since they were read."""
        buckets = set()
        while self.ends and self.ends[0][0] <= now:
            end, name = heapq.heappop(self.ends)
            status = self.statuses.get(name)
            if status is not None and self.end_of.get(name) == end:
                buckets.add(versioned.bucket_of(status.workload_id))
        return buckets

    def read(self, pods: Any, buckets: set[int] | None, now: Any) -> int:
        """Read these buckets' pods again (None: every pod); how many there are. The rows
        are read before anything kept is touched: a failed read leaves the view whole."""
        if buckets is not None:
            pods = versioned.in_buckets(pods, "workload_id", buckets)
        rows = list(pods.values_list(*_STATUS_FIELDS, "version", named=True))
        ends = {}
        for bucket in self.names.keys() if buckets is None else buckets:
            for name in self.names.get(bucket, ()):
                del self.statuses[name]
                del self.stamps[name]
                if name in self.end_of:
                    ends[name] = self.end_of.pop(name)
        if buckets is None:
            self.names.clear()
        else:
            for bucket in buckets:
                self.names.pop(bucket, None)
        sums = versioned.SumsOf()
        for pod in rows:
            sums.add(pod.workload_id, pod.pk, pod.version)
            self._hold(pod, _status(pod, now), ends)
        if buckets is None:
            self.sums.clear()
        versioned.sums_keep(self.sums, sums.of(sums.sums if buckets is None else buckets))
        return len(rows)

    def _hold(self, pod: Any, status: PodStatus, ends: dict[str, Any]) -> None:
        self.statuses[pod.name] = status
        self.stamps[pod.name] = (pod.pk, pod.version)
        self.names[versioned.bucket_of(pod.workload_id)].add(pod.name)
        if pod.duration_s is not None and status.phase == PodPhase.RUNNING:
            end = self.end_of[pod.name] = pod.started_at + timedelta(seconds=pod.duration_s)
            if ends.get(pod.name) != end:  # else on the heap already
                heapq.heappush(self.ends, (end, pod.name))

    def fold(self, made: list[tuple[SimulatedPod, PodStatus]], deleted: list[str]) -> None:
        """What a pass wrote itself, so that the next does not read it again: the pods it
        made, as it read them back (another worker's, made a moment before under the same
        name, alike), and the names it deleted (no pod by that name, whoever held it). The
        sums move by exactly what is held or dropped here: kept minus the database stays
        what it was, so a bucket another writer touched (before, between or after) still
        differs and is read again."""
        change = versioned.SumsOf()
        for name in [*deleted, *(pod.name for pod, _ in made)]:
            stamp = self.stamps.pop(name, None)
            if stamp is None:
                continue
            status = self.statuses.pop(name)
            self.names[versioned.bucket_of(status.workload_id)].discard(name)
            self.end_of.pop(name, None)  # a stale entry on the heap is skipped
            change.remove(status.workload_id, *stamp)
        for pod, status in made:
            self._hold(pod, status, {})
            change.add(pod.workload_id, pod.pk, pod.version)
        versioned.sums_fold(self.sums, change)


def _view_fold(
    cluster_pk: int, made: list[tuple[SimulatedPod, PodStatus]], deleted: list[str]
) -> None:
    """`PodView.fold` into this process's view of the cluster, where there is one."""
    with _views_lock:
        view = _views.get(cluster_pk)
        if view is not None:
            view.fold(made, deleted)


_views: dict[int, PodView] = {}  # by cluster id, in this process
_views_lock = threading.Lock()


def _stop_time(pod: SimulatedPod, stop_delay: timedelta) -> timedelta:
    if pod.stop_after_s is None:
        return stop_delay
    return timedelta(seconds=pod.stop_after_s)


def pod_environment(spec: PodSpec) -> dict[str, str]:
    """What the simulated pod's program would be given: the pod's variables, and a sharer's
    MPS limits as a Kubernetes pod gets them (sharing.mps_env)."""
    env = dict(spec.env)
    if spec.mps is not None:
        env.update(mps_env(spec.mps, POD_PIPE_DIRECTORY))
    return env


def _pod_fields(spec: PodSpec) -> dict[str, Any]:
    return {
        "namespace": spec.namespace,
        "workload_id": spec.workload_id,
        "pod_index": spec.pod_index,
        "node_name": spec.node_name,
        "gpu_indices": list(spec.gpu_indices),
        "shared_gpu_index": spec.shared_gpu_index,
        "gpu_share": spec.gpu_share,
        "env": pod_environment(spec),
        "started_at": timezone.now(),
        "duration_s": spec.duration_s,
    }


_STATUS_FIELDS = (
    "pk",
    "name",
    "namespace",
    "workload_id",
    "pod_index",
    "node_name",
    "deleting_since",
    "duration_s",
    "started_at",
)


def _status(pod: Any, now: Any) -> PodStatus:
    """A SimulatedPod's status (the row, or its `_STATUS_FIELDS`)."""
    status = PodStatus(
        name=pod.name,
        namespace=pod.namespace,
        workload_id=pod.workload_id,
        pod_index=pod.pod_index,
        phase=PodPhase.RUNNING,
        backend_ref=f"sim:{pod.pk}",
        node_name=pod.node_name,
        terminating=pod.deleting_since is not None,
    )
    if pod.duration_s is not None and now >= pod.started_at + timedelta(seconds=pod.duration_s):
        status.phase, status.exit_code = PodPhase.SUCCEEDED, 0
    return status
