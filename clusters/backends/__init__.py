"""One interface over the places pods run: a Kubernetes cluster, this machine, a simulation.

The database says what should run (PodAllocation rows of admitted workloads); a backend
only knows its cluster. `clusters.reconcile` turns allocations into `PodSpec`s, hands them
to `Backend.reconcile`, and reads `PodStatus`es back into workload states. Backends never
import scheduling models, so each can be tested against its cluster alone.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from clusters.sharing import MpsLimits, mps_enabled
from portal.errors import GPUPoolError

if TYPE_CHECKING:
    from clusters.models import Cluster

# Every object GPUPool creates carries this label; objects without it are never touched.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpupool"
# The scheduler name pods made outside GPUPool give to be scheduled by it (a cluster's config
# `scheduler_name` changes it; clusters/native.py).
SCHEDULER_NAME = "gpupool"


class BackendError(GPUPoolError):
    """The cluster refused or failed a request after retries."""


class BackendUnreachable(BackendError):
    """The cluster cannot be reached at all: mark it so, keep its workloads."""


RECORD_UNREADABLE = "Its record cannot be read (fix it in the database)"


class PodSpecInvalid(BackendError):
    """The cluster will never run this pod as specified (no command, an invalid manifest):
    the workload fails with this message instead of being retried forever."""


class PodPhase(enum.StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


TERMINAL_PHASES = (PodPhase.SUCCEEDED, PodPhase.FAILED)


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    model: str = ""
    memory_mib: int = 0
    uuid: str = ""
    mig: bool = False  # MIG mode on: only ever split into MIG instances


@dataclass(frozen=True, slots=True)
class ForeignUse:
    """What pods GPUPool did not bind hold on a node (the default scheduler's, another
    GPUPool's, DaemonSets'): their requests, as the Kubernetes scheduler counts them.

    `pods` names a few of them (namespace/name, the largest first) for the nodes page;
    `pod_count` counts them all."""

    gpus: int = 0
    cpu: float = 0.0
    memory_mib: int = 0
    pod_count: int = 0
    pods: tuple[str, ...] = ()


NO_FOREIGN_USE = ForeignUse()


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    cpu_cores: float = 0
    memory_mib: int = 0
    schedulable: bool = True
    gpus: tuple[GpuInfo, ...] = ()
    # Why the node is not schedulable, for a person: "NotReady", "cordoned".
    unschedulable_reason: str = ""
    # Held by pods GPUPool did not bind (Kubernetes only; other backends: none).
    foreign: ForeignUse = NO_FOREIGN_USE


# How an admin may publish a Kubernetes cluster's workload ports beyond it (Cluster.config
# "publish_ports"): not at all (the portal's proxy alone), on every node, or through an
# Ingress class. The SSH server's port is never published: only the portal's tunnel reaches it.
PUBLISH_NODEPORT, PUBLISH_INGRESS = "nodeport", "ingress"
PUBLISH_MODES = ("", PUBLISH_NODEPORT, PUBLISH_INGRESS)


@dataclass(frozen=True, slots=True)
class PortSpec:
    name: str
    port: int
    protocol: str = "http"  # http: through the portal's proxy; tcp: the SSH tunnel, or none


@dataclass(frozen=True, slots=True)
class VolumeSpec:
    """A persistent volume claim mounted into the pod (Kubernetes only)."""

    name: str
    claim: str
    mount_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """How the pods of a distributed workload find each other (clusters.podspecs)."""

    service: str  # the headless Service (Kubernetes): every pod's DNS subdomain
    port: int  # MASTER_PORT, on the rank-0 pod
    hosts: tuple[str, ...]  # every pod's address, in rank order
    slots: int  # processes per pod: the hostfile's slots, PET_NPROC_PER_NODE


@dataclass(frozen=True, slots=True)
class PodSpec:
    """One pod the database wants running. `name` is unique in the cluster."""

    name: str
    namespace: str
    workload_id: int
    pod_index: int
    node_name: str
    project: str = ""
    project_id: int = 0
    workload_name: str = ""
    kind: str = ""
    image: str = ""
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cpu: float = 1
    memory_mib: int = 1024
    # Processes and threads per pod, as the workload asked (local pods' cgroups); None: the
    # cluster's `pids_max`, which also caps it.
    pids_max: int | None = None
    gpu_indices: tuple[int, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    shared_gpu_index: int | None = None
    shared_gpu_uuid: str = ""
    gpu_share: float | None = None
    gpu_memory_mib: int = 0
    # A sharer's limits on its GPU, enforced through that GPU's MPS daemon (clusters.sharing):
    # each backend gives the pod sharing.mps_env(mps, <its pipe folder>).
    mps: MpsLimits | None = None
    # A MIG pod's device, as the node reported it (MIG-<uuid>); its env shows it only that
    # (clusters.mig.mig_env), and the local backend's CUDA_VISIBLE_DEVICES names it too.
    mig_device: str = ""
    ports: tuple[PortSpec, ...] = ()
    checkpoint_dir: str = ""
    restart_count: int = 0
    duration_s: float | None = None
    # Seconds from SIGTERM to SIGKILL when the cluster itself stops the pod (a drain);
    # None: the cluster's default.
    termination_grace_s: int | None = None
    # Data volumes: {"name", "claim" (a PVC on Kubernetes), "mount_path"}.
    volumes: tuple[VolumeSpec, ...] = ()
    # The image must run as root (Workload.spec["run_as_root"]); otherwise Kubernetes
    # pods run as a non-root user, as the `restricted` Pod Security level asks.
    run_as_root: bool = False
    # What the backend recorded last time (a pid and start time, a pod uid).
    backend_ref: str = ""
    # Distributed workloads: the peers' addresses (the env already holds MASTER_ADDR...).
    rendezvous: Rendezvous | None = None
    # Submitted by a platform admin: the only work a local machine that cannot sandbox runs.
    submitted_by_admin: bool = False
    # A pod GPUPool did not make (kubectl, Helm, an operator: clusters/native.py): its name
    # in the cluster. "Creating" it binds that pod to `node_name`; "" for GPUPool's own pods.
    native_pod: str = ""
    # A native sharer: the devices whose MPS daemon its node's agent reported running for
    # its allocation. It is bound only once its GPU's is one (clusters/mps_report.py).
    mps_running: tuple[str, ...] = ()
    # Whether its node's agent ever reported its MPS daemons: one older than the portal
    # reports none, and its native sharers wait for ever (their pods and workloads say so).
    mps_reported: bool = True


@dataclass(slots=True)
class PodStatus:
    name: str
    namespace: str
    workload_id: int
    pod_index: int
    phase: PodPhase = PodPhase.PENDING
    exit_code: int | None = None
    message: str = ""
    endpoint: str = ""
    # Where each port answers, by name (host:port), for the port proxy and the SSH tunnel.
    ports: dict[str, str] = field(default_factory=dict)
    backend_ref: str = ""
    node_name: str = ""
    terminating: bool = False
    # Terminating long past its deadline: its node does not answer, so the pod never goes
    # by itself. A wanted pod is lost; an unwanted one is deleted by force.
    stuck: bool = False
    # Failed for the node's reasons, not its own (evicted, node lost): requeue, not fail.
    lost: bool = False
    # Why a pod that should run does not yet, as kubectl shows it instead of the phase:
    # ContainerCreating, ImagePullBackOff, CreateContainerConfigError.
    reason: str = ""
    # A pod GPUPool bound but did not make: its name in the cluster (deleting it evicts it).
    native: str = ""
    # What the backend made beside the pod and no longer finds (its Binding, its Service):
    # a targeted reconcile hands its workload over, to be made again (clusters.reconcile).
    incomplete: str = ""


@dataclass(slots=True)
class ReconcileReport:
    """What the cluster holds after a reconcile, keyed by pod name, and what was done."""

    statuses: dict[str, PodStatus] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # Shared GPUs and the device whose MPS daemon serves them, as the node names it (its
    # UUID, or index): {(node name, GPU index as the cycle numbered it): device}. The
    # portal keeps them for the node agents (clusters.reconcile).
    mps_devices: dict[tuple[str, int], str] = field(default_factory=dict)
    # Pods the backend holds back although they are wanted, by name, and why: a native
    # sharer waiting for its GPU's MPS daemon. Said on their workloads (clusters.reconcile).
    waiting: dict[str, str] = field(default_factory=dict)


def as_enforced(spec: PodSpec, cluster_config: dict | None) -> PodSpec:
    """The spec as this cluster runs it: without MPS limits where its config turns MPS off."""
    if spec.mps is None or mps_enabled(cluster_config):
        return spec
    return replace(spec, mps=None)


def mps_device(spec: PodSpec) -> str:
    """The device a sharer's MPS daemon serves, as its node names it: the GPU's UUID, or
    its index where no UUID is known. It also names the daemon's folder on the node."""
    return spec.shared_gpu_uuid or str(spec.shared_gpu_index)


@dataclass(slots=True)
class PodChanges:
    """Every pod's status as `pod_statuses` gives it, and the buckets (workload id modulo
    `portal.versioned.BUCKETS`) where a pod may have changed since this process's last
    `pod_changes` for the cluster: outside them, every pod is as it was then."""

    statuses: dict[str, PodStatus]
    moved: set[int]
    read: int = 0  # pod rows read for it (the rest were kept)


MigKey = tuple[str, int, int]  # (node name, GPU index, first memory slice)
MigLayout = dict[tuple[str, int], list[tuple[str, int]]]


def pod_name(workload_id: int, pod_index: int) -> str:
    return f"gp-{workload_id}-{pod_index}"


class Backend(abc.ABC):
    """A cluster seen through one interface. Instances are cheap; make one per task run."""

    # Whether `reconcile` may be handed part of the desired set: the pods of the workloads
    # that need work, with the names of the others to `keep` as they are (clusters.reconcile's
    # targeted pass). Backends whose reconcile does more with every desired spec (local: MPS
    # daemons) always get the whole set; Kubernetes says what a kept pod lacks instead
    # (`PodStatus.incomplete`).
    partial_reconcile = False

    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    @abc.abstractmethod
    def test_connection(self) -> str:
        """A one-line description of the cluster; raises BackendUnreachable."""

    @abc.abstractmethod
    def list_inventory(self) -> list[NodeInfo]:
        """Every node with its labels and GPUs."""

    @abc.abstractmethod
    def pod_statuses(self) -> dict[str, PodStatus]:
        """Every pod GPUPool created in this cluster, by name (other pods are not listed)."""

    def pod_changes(self) -> PodChanges | None:
        """`PodChanges`, where this backend can tell which pods changed since its last
        call in this process (the simulated one: its rows' versions); None where it
        cannot, and a targeted pass compares every pod."""
        return None

    @abc.abstractmethod
    def ensure_pod(self, spec: PodSpec) -> PodStatus:
        """Create the pod unless it exists; idempotent."""

    @abc.abstractmethod
    def delete_pod(self, status: PodStatus, *, grace_period_s: int) -> bool:
        """Ask the pod to stop (SIGTERM, then SIGKILL after the grace period).

        Returns True once the pod is gone; callers call again on the next reconcile.
        """

    @abc.abstractmethod
    def pod_logs(self, name: str, namespace: str, *, tail_lines: int = 500) -> str:
        """The pod's recent stdout and stderr."""

    def mig_sync(self, wanted: MigLayout) -> tuple[dict[MigKey, str], list[str]]:
        """Make each MIG-enabled GPU hold exactly the instances wanted ({(node name, GPU
        index): [(profile, start)]}); return the MIG device UUID of each instance made or
        found ({(node, index, start): uuid}) and the errors. The base: nothing on the
        node side (on Kubernetes the node agent does it, clusters/agent/mig.py)."""
        return {}, []

    def reconcile(
        self,
        desired: list[PodSpec],
        *,
        grace_period_s: int,
        grace_periods: Mapping[int, int] | None = None,
        keep: frozenset[str] = frozenset(),
        observed: Mapping[str, PodStatus] | None = None,
    ) -> ReconcileReport:
        """Make the cluster hold exactly `desired`: create what is missing, delete the rest.

        A pod is deleted with its workload's grace period (`grace_periods`, by workload id,
        from its policy), else `grace_period_s`. Pods that finished (Succeeded/Failed) but
        are still desired are left alone so that their exit codes can be read; they are
        never created twice. Pods named in `keep` are wanted too, as they are (a targeted
        pass: only where `partial_reconcile`). `observed`: the statuses this pass read a
        moment ago, else read now.
        """
        statuses = dict(observed) if observed is not None else self.pod_statuses()
        report = ReconcileReport(statuses=statuses)
        wanted = {spec.name: spec for spec in desired}
        doomed = [
            (status, grace_for(status, grace_period_s, grace_periods))
            for name, status in report.statuses.items()
            if name not in wanted and name not in keep
        ]
        self._delete_all_into(report, doomed)
        self._create_all_into(report, [s for s in desired if s.name not in report.statuses])
        for spec in desired:
            if spec.mps is not None and spec.shared_gpu_index is not None:
                report.mps_devices[(spec.node_name, spec.shared_gpu_index)] = mps_device(spec)
        return report

    def _create_all_into(self, report: ReconcileReport, specs: list[PodSpec]) -> None:
        """Create the missing pods, one by one (a backend may do it in bulk)."""
        for spec in specs:
            self._create_into(report, spec)

    def _create_into(self, report: ReconcileReport, spec: PodSpec) -> None:
        try:
            report.statuses[spec.name] = self.ensure_pod(spec)
            report.created.append(spec.name)
        except BackendUnreachable:
            raise
        except PodSpecInvalid as exc:
            report.statuses[spec.name] = never_runs(spec, str(exc))
        except BackendError as exc:
            report.errors.append(f"create {spec.name}: {exc}")

    def _delete_all_into(
        self, report: ReconcileReport, doomed: list[tuple[PodStatus, int]]
    ) -> None:
        """Delete the unwanted pods, each with its grace period, one by one (a backend may
        do it in bulk)."""
        for status, grace in doomed:
            self._delete_into(report, status, grace)

    def _delete_into(self, report: ReconcileReport, status: PodStatus, grace: int) -> None:
        try:
            gone = self.delete_pod(status, grace_period_s=grace)
        except BackendUnreachable:
            raise
        except BackendError as exc:
            report.errors.append(f"delete {status.name}: {exc}")
            return
        deleted_into(report, status, gone=gone)


def deleted_into(report: ReconcileReport, status: PodStatus, *, gone: bool) -> None:
    """A delete asked for: the pod is gone, or terminating."""
    if gone:
        report.statuses.pop(status.name, None)
        report.deleted.append(status.name)
    else:
        status.terminating = True


def never_runs(spec: PodSpec, why: str) -> PodStatus:
    """The status of a pod the cluster will never run: its workload fails with `why`."""
    return PodStatus(
        name=spec.name,
        namespace=spec.namespace,
        workload_id=spec.workload_id,
        pod_index=spec.pod_index,
        phase=PodPhase.FAILED,
        message=f"The pod cannot run: {why}",
    )


def grace_for(status: PodStatus, default: int, per_workload: Mapping[int, int] | None) -> int:
    """The pod's grace period: its workload's (policy) when known, else the cluster's."""
    return (per_workload or {}).get(status.workload_id, default)


def get_backend(cluster: Cluster) -> Backend:
    """The backend for a cluster row. Imports lazily: the kubernetes client is heavy.
    BackendUnreachable when the row holds what no backend can be made of (another writer's
    config): its passes skip the cluster saying why, and other clusters go on."""
    from clusters.models import Backend as Kind  # noqa: PLC0415 - models need apps ready

    if problem := cluster.record_problem:
        raise BackendUnreachable(problem)

    if cluster.backend == Kind.LOCAL:
        from clusters.backends.local import LocalBackend  # noqa: PLC0415

        return LocalBackend(cluster)
    if cluster.backend == Kind.SIMULATED:
        from clusters.backends.simulated import SimulatedBackend  # noqa: PLC0415

        return SimulatedBackend(cluster)
    if cluster.backend == Kind.KUBERNETES:
        from clusters.backends.kubernetes import KubernetesBackend  # noqa: PLC0415

        return KubernetesBackend(cluster)
    raise BackendError(f"Unknown backend {cluster.backend!r} for cluster {cluster.name}")


def expand_vars(text: str, env: Mapping[str, Any]) -> str:
    """Expand $(VAR) the way Kubernetes does: unknown names stay, $$ escapes a dollar."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and (end := text.find(")", i + 2)) != -1:
            name = text[i + 2 : end]
            out.append(str(env[name]) if name in env else text[i : end + 1])
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)
