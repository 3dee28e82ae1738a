"""PodAllocation rows (what the cycle decided) as backend PodSpecs (what a cluster runs)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ObjectDoesNotExist

from clusters.backends import (
    PodSpec,
    PodStatus,
    PortSpec,
    Rendezvous,
    VolumeSpec,
    never_runs,
    pod_name,
)
from clusters.backends.sshd import SSH_ENV, with_ssh_server
from clusters.mig import mig_device_map, mig_env, mig_ready
from clusters.models import Backend, Gpu
from clusters.mps_report import mps_reported, mps_running_for
from clusters.sharing import allocation_mps
from portal.permissions import is_platform_admin
from portal.selectors import ssh_authorized_keys
from scheduling.checkpoints import workload_checkpoint_env
from scheduling.stored import allocation_problem, stored_spec_problem

if TYPE_CHECKING:
    from clusters.backends.kubernetes.ownership import Owner
    from clusters.models import Cluster
    from scheduling.models import PodAllocation

log = logging.getLogger(__name__)
# What building a pod of a malformed row raises (a value of the wrong JSON type or range).
UNBUILDABLE = (ArithmeticError, AttributeError, KeyError, IndexError, TypeError, ValueError)


class Malformed(ValueError):
    """A stored row fails scheduling/stored.py's check: the message names the field."""


def pod_env(allocation: PodAllocation) -> dict[str, str]:
    """The workload's environment plus what every GPUPool pod is told about itself."""
    workload = allocation.workload
    env = {str(k): str(v) for k, v in (workload.env or {}).items()}
    env.update(
        GPUPOOL_WORKLOAD_ID=str(workload.pk),
        GPUPOOL_WORKLOAD_NAME=workload.name,
        GPUPOOL_PROJECT=workload.project.name,
        GPUPOOL_POD_INDEX=str(allocation.pod_index),
        GPUPOOL_NUM_PODS=str(workload.pods),
        GPUPOOL_RESTART_COUNT=str(workload.restart_count),
    )
    if workload.checkpoint_dir:
        env["GPUPOOL_CHECKPOINT_DIR"] = workload.checkpoint_dir
    env.update(workload_checkpoint_env(workload))
    if allocation.gpu_indices:  # whole GPUs: a GPU range's current count
        env["GPUPOOL_NUM_GPUS"] = str(len(allocation.gpu_indices))
    if allocation.gpu_share is not None:
        env["GPUPOOL_GPU_FRACTION"] = str(allocation.gpu_share.normalize())
    if allocation.gpu_memory_mib:
        env["GPUPOOL_GPU_MEMORY_MIB"] = str(allocation.gpu_memory_mib)
    env.update(_secret_env(workload))
    if (workload.spec or {}).get("ssh"):
        env[SSH_ENV] = "\n".join(_ssh_keys(workload))
    return env


def _ssh_keys(workload: Any) -> list[str]:
    """Read when the pod starts: a key added later, or a change of sharing, reaches the
    workload when its pod next starts."""
    try:
        shared = workload.workspace.shared_with_project
    except ObjectDoesNotExist:  # not a workspace: only workspaces are shared
        shared = False
    return ssh_authorized_keys(
        owner_id=workload.submitted_by_id, project_id=workload.project_id, shared=shared
    )


def pod_program(workload: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(command, args) as the pod runs them: with the SSH server first when it asked."""
    command = tuple(str(c) for c in workload.command or ())
    args = tuple(str(a) for a in workload.args or ())
    if (workload.spec or {}).get("ssh"):
        return with_ssh_server((*command, *args)), ()
    return command, args


DISTRIBUTED = "distributed"  # scheduling.models.WorkloadKind.DISTRIBUTED
TRAINING = "training"  # an elastic training job's pods meet like a distributed job's
RENDEZVOUS_PORT = 29500  # PyTorch's default MASTER_PORT
LOCAL_PORTS = (29500, 10000)  # on one machine: 29500 + workload id mod 10000
HOSTFILE = "/etc/gpupool/hostfile"


def rendezvous_for(
    workload: Any, namespace: str, peers: tuple[int, ...], *, owner: Owner | None
) -> Rendezvous | None:
    """Where a distributed workload's pods meet: on Kubernetes (`owner`: whose objects
    they are) the rank-0 pod's stable name through the workload's headless Service
    (`<pod>.<service>.<namespace>.svc`, both names carrying the owner's identities as the
    backend names them), on one machine 127.0.0.1 and a port of the workload's own.
    `peers`: the pod indices admitted (a gang may run with `min_pods` of its pods, an
    elastic job with any number in its range), in rank order."""
    elastic = getattr(workload, "elastic", False) and workload.kind == TRAINING
    if workload.kind != DISTRIBUTED and not elastic:
        return None
    gpus = workload.gpus or 0
    slots = max(int(gpus), 1)
    names = [pod_name(workload.pk, i) for i in peers]
    if owner is None:
        port = LOCAL_PORTS[0] + workload.pk % LOCAL_PORTS[1]
        return Rendezvous(service="", port=port, hosts=("127.0.0.1",) * len(names), slots=slots)
    service = owner.object_name(names[0].rsplit("-", 1)[0])  # gp-<id>-...: no pod is named so
    hosts = tuple(f"{owner.object_name(name)}.{service}.{namespace}.svc" for name in names)
    return Rendezvous(service=service, port=RENDEZVOUS_PORT, hosts=hosts, slots=slots)


def rendezvous_env(rendezvous: Rendezvous, rank: int) -> dict[str, str]:
    """What PyTorch expects: MASTER_ADDR/PORT, WORLD_SIZE, RANK, LOCAL_RANK for a process
    started directly (one per pod, or the first of the pod's), NODE_RANK, and the PET_*
    variables `torchrun` reads in place of its flags (it sets RANK... for its workers)."""
    nodes, slots = len(rendezvous.hosts), rendezvous.slots
    master, port = rendezvous.hosts[0], str(rendezvous.port)
    env = {
        "MASTER_ADDR": master,
        "MASTER_PORT": port,
        "WORLD_SIZE": str(nodes * slots),
        "RANK": str(rank * slots),
        "LOCAL_RANK": "0",
        "NODE_RANK": str(rank),
        "PET_NNODES": str(nodes),
        "PET_NODE_RANK": str(rank),
        "PET_NPROC_PER_NODE": str(slots),
        "PET_MASTER_ADDR": master,
        "PET_MASTER_PORT": port,
    }
    if rendezvous.service:  # Kubernetes mounts the hostfile for MPI-style launchers
        env.update(GPUPOOL_HOSTFILE=HOSTFILE, OMPI_MCA_orte_default_hostfile=HOSTFILE)
    return env


def _secret_env(workload: Any) -> dict[str, str]:
    """A workspace's tool token: kept on the Workspace row, never in the workload's env
    (which the API and pages show), and handed to the pod only here."""
    try:
        token = workload.workspace.token
    except ObjectDoesNotExist:  # not a workspace
        return {}
    return {"JUPYTER_TOKEN": token}


def pod_volumes(spec: dict[str, Any]) -> tuple[VolumeSpec, ...]:
    """Volumes a workload asks for in its spec (a workspace's data volume, or any other
    workload's): {"name", "claim", "mount_path", "read_only"}."""
    return tuple(
        VolumeSpec(
            name=str(v.get("name") or f"vol{i}"),
            claim=str(v["claim"]),
            mount_path=str(v["mount_path"]),
            read_only=bool(v.get("read_only", False)),
        )
        for i, v in enumerate(spec.get("volumes") or [])
    )


def pod_spec(
    allocation: PodAllocation,
    uuids: dict[tuple[int, int], str] | None = None,
    graces: dict[int, int] | None = None,
    *,
    owner: Owner | None = None,
    peers: tuple[int, ...] = (),
    memories: dict[tuple[int, int], int] | None = None,
    mig_devices: dict[tuple[int, int, int], str] | None = None,
) -> PodSpec:
    workload = allocation.workload
    namespace = workload.project.namespace
    if native_slot(workload, allocation.pod_index):
        return _native_spec(allocation, graces, shared_gpu(allocation, uuids, memories))
    peers = peers or tuple(range(workload.pods))
    rendezvous = rendezvous_for(workload, namespace, peers, owner=owner)
    env = pod_env(allocation)
    mig_device = ""
    if allocation.mig_gpu_index is not None and allocation.mig_start is not None:
        key = (allocation.node_id, allocation.mig_gpu_index, allocation.mig_start)
        mig_device = (mig_devices or {}).get(key, "")
        env.update(mig_env(mig_device))
    if allocation.pod_index in peers:  # the current size: an elastic job's changes
        env.update(
            GPUPOOL_RANK=str(peers.index(allocation.pod_index)),
            GPUPOOL_WORLD_SIZE=str(len(peers)),
        )
    if rendezvous is not None and allocation.pod_index in peers:
        env.update(rendezvous_env(rendezvous, peers.index(allocation.pod_index)))
    uuids = uuids or {}
    node_id = allocation.node_id
    ports = tuple(
        PortSpec(
            name=str(p.get("name") or f"port{i}"),
            port=int(p["port"]),
            protocol=str(p.get("protocol") or "http"),
        )
        for i, p in enumerate((workload.spec or {}).get("ports", []))
    )
    command, args = pod_program(workload)
    duration = (workload.spec or {}).get("duration_s")
    return PodSpec(
        name=pod_name(workload.pk, allocation.pod_index),
        namespace=namespace,
        workload_id=workload.pk,
        pod_index=allocation.pod_index,
        node_name=allocation.node.name,
        project=workload.project.name,
        project_id=workload.project_id,
        workload_name=workload.name,
        kind=workload.kind,
        image=workload.image,
        command=command,
        args=args,
        env=env,
        cpu=float(workload.cpu),
        memory_mib=int(workload.memory_mib),
        pids_max=workload.pids_max,
        gpu_indices=tuple(int(i) for i in allocation.gpu_indices or ()),
        gpu_uuids=tuple(uuids.get((node_id, int(i)), "") for i in allocation.gpu_indices or ()),
        **shared_gpu(allocation, uuids, memories),
        mig_device=mig_device,
        ports=ports,
        checkpoint_dir=workload.checkpoint_dir,
        restart_count=workload.restart_count,
        duration_s=float(duration) if duration is not None else None,
        termination_grace_s=(graces or {}).get(workload.pk),
        volumes=pod_volumes(workload.spec or {}),
        run_as_root=bool((workload.spec or {}).get("run_as_root")),
        backend_ref=allocation.backend_ref,
        rendezvous=rendezvous,
        submitted_by_admin=is_platform_admin(workload.submitted_by),
    )


def shared_gpu(
    allocation: PodAllocation,
    uuids: dict[tuple[int, int], str] | None,
    memories: dict[tuple[int, int], int] | None,
) -> dict[str, Any]:
    """The PodSpec fields of a share of a GPU: which GPU, how much, its MPS limits."""
    node_id, shared = allocation.node_id, allocation.shared_gpu_index
    return {
        "shared_gpu_index": shared,
        "shared_gpu_uuid": (uuids or {}).get((node_id, shared), "") if shared is not None else "",
        "gpu_share": float(allocation.gpu_share) if allocation.gpu_share is not None else None,
        "gpu_memory_mib": allocation.gpu_memory_mib,
        "mps": allocation_mps(allocation, (memories or {}).get((node_id, shared or 0), 0)),
    }


def is_native(workload: Any) -> bool:
    return bool((workload.spec or {}).get("native"))


def native_slot(workload: Any, pod_index: int) -> str:
    """The name of the pod made outside GPUPool (clusters/native.py) that is pod
    `pod_index` of `workload`: "" for GPUPool's own pods, and for a slot with no pod yet."""
    slots = ((workload.spec or {}).get("native") or {}).get("pods") or []
    slot = slots[pod_index] if 0 <= pod_index < len(slots) else None  # -1: a text (SQLite)
    return slot[0] if slot else ""


def _native_spec(
    allocation: PodAllocation, graces: dict[int, int] | None, shared: dict[str, Any]
) -> PodSpec:
    """A pod someone else made: bound where the cycle placed it. Nothing is written into
    it; a share of a GPU (`shared`) is written into the ConfigMap its spec names, before
    the Binding (clusters/native_sharing.py), once the node's agent reported that GPU's MPS
    daemon running for it (`mps_running`)."""
    workload = allocation.workload
    return PodSpec(
        name=pod_name(workload.pk, allocation.pod_index),
        namespace=workload.project.namespace,
        workload_id=workload.pk,
        pod_index=allocation.pod_index,
        node_name=allocation.node.name,
        project=workload.project.name,
        project_id=workload.project_id,
        workload_name=workload.name,
        kind=workload.kind,
        cpu=float(workload.cpu),
        memory_mib=int(workload.memory_mib),
        gpu_indices=tuple(int(i) for i in allocation.gpu_indices or ()),
        **shared,
        termination_grace_s=(graces or {}).get(workload.pk),
        backend_ref=allocation.backend_ref,
        native_pod=native_slot(workload, allocation.pod_index),
        mps_running=mps_running_for(allocation.node.mps_report, allocation.pk),
        mps_reported=mps_reported(allocation.node.mps_report),
    )


def pod_specs_for(
    allocations: list[PodAllocation],
    cluster: Cluster,
    graces: dict[int, int] | None = None,
    *,
    unbuilt: dict[str, PodStatus] | None = None,
) -> list[PodSpec]:
    """`graces`: workload id -> the grace period its policy sets (clusters.reconcile).
    `unbuilt`: where a workload whose stored row no pod can be made of (scheduling/stored.py)
    puts its pods, as pods that never run (its workload fails, saying why); the others'
    specs are made as usual. Without it, such a row raises."""
    node_ids = {a.node_id for a in allocations}
    gpus = Gpu.objects.filter(node_id__in=node_ids).values_list(
        "node_id", "index", "uuid", "memory_mib"
    )
    uuids, memories = {}, {}
    for node_id, index, uuid, memory in gpus:
        uuids[(node_id, index)], memories[(node_id, index)] = uuid, memory
    mig_devices = mig_device_map(node_ids)
    # A MIG pod starts once its node made its instance (reported its UUID): before that it
    # would see no GPU, or all of them.
    allocations = [a for a in allocations if mig_ready(a, mig_devices)]
    # A pod made outside GPUPool is bound once it exists (its controller may make it later).
    allocations = [
        a for a in allocations if native_slot(a.workload, a.pod_index) or not is_native(a.workload)
    ]
    owner = None
    if cluster.backend == Backend.KUBERNETES:
        # Imported here: the package imports `kubernetes`, seconds of every process's start
        # that only a Kubernetes cluster needs.
        from clusters.backends.kubernetes.ownership import owner_of  # noqa: PLC0415

        owner = owner_of(cluster)
    by_workload: dict[int, list[PodAllocation]] = {}
    for allocation in allocations:
        by_workload.setdefault(allocation.workload_id, []).append(allocation)
    specs = []
    for mine in by_workload.values():
        peers = tuple(sorted(a.pod_index for a in mine))
        context = {"owner": owner, "peers": peers, "memories": memories}
        try:
            specs += _workload_specs(mine, uuids, graces, mig_devices=mig_devices, **context)
        except UNBUILDABLE as exc:
            if unbuilt is None:
                raise
            unbuilt.update(_unbuilt(mine, exc))
    return specs


def _workload_specs(allocations: list[PodAllocation], *args: Any, **kwargs: Any) -> list[PodSpec]:
    """One workload's pod specs, all or none: a row no pod can be made of raises."""
    problems = [stored_spec_problem(allocations[0].workload), *map(allocation_problem, allocations)]
    why = "; ".join(p for p in problems if p)
    if why:
        raise Malformed(why)
    return [pod_spec(a, *args, **kwargs) for a in allocations]


def _unbuilt(allocations: list[PodAllocation], exc: Exception) -> dict[str, PodStatus]:
    """The workload's pods as pods that never run, saying why; logged (once: its workload
    fails, and a failed workload is not asked for pods again)."""
    workload = allocations[0].workload
    why = str(exc) if isinstance(exc, Malformed) else f"{type(exc).__name__}: {exc}"
    log.warning("workload %s: no pod can be made of its stored row: %s", workload.pk, why)
    statuses = {}
    for a in allocations:
        name = pod_name(workload.pk, a.pod_index)
        spec = PodSpec(name, workload.project.namespace, workload.pk, a.pod_index, a.node.name)
        statuses[name] = never_runs(spec, f"its stored row is malformed: {why}. Submit it again.")
    return statuses
