"""PodAllocation rows (what the cycle decided) as backend PodSpecs (what a cluster runs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clusters.backends import PodSpec, PortSpec, VolumeSpec, pod_name
from clusters.models import Gpu

if TYPE_CHECKING:
    from clusters.models import Cluster
    from scheduling.models import PodAllocation


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
    if allocation.gpu_share is not None:
        env["GPUPOOL_GPU_FRACTION"] = str(allocation.gpu_share.normalize())
    if allocation.gpu_memory_mib:
        env["GPUPOOL_GPU_MEMORY_MIB"] = str(allocation.gpu_memory_mib)
    return env


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
) -> PodSpec:
    workload = allocation.workload
    uuids = uuids or {}
    node_id = allocation.node_id
    shared = allocation.shared_gpu_index
    ports = tuple(
        PortSpec(name=str(p.get("name") or f"port{i}"), port=int(p["port"]))
        for i, p in enumerate((workload.spec or {}).get("ports", []))
    )
    duration = (workload.spec or {}).get("duration_s")
    return PodSpec(
        name=pod_name(workload.pk, allocation.pod_index),
        namespace=workload.project.namespace,
        workload_id=workload.pk,
        pod_index=allocation.pod_index,
        node_name=allocation.node.name,
        project=workload.project.name,
        workload_name=workload.name,
        kind=workload.kind,
        image=workload.image,
        command=tuple(str(c) for c in workload.command or ()),
        args=tuple(str(a) for a in workload.args or ()),
        env=pod_env(allocation),
        cpu=float(workload.cpu),
        memory_mib=int(workload.memory_mib),
        gpu_indices=tuple(int(i) for i in allocation.gpu_indices or ()),
        gpu_uuids=tuple(uuids.get((node_id, int(i)), "") for i in allocation.gpu_indices or ()),
        shared_gpu_index=shared,
        shared_gpu_uuid=uuids.get((node_id, shared), "") if shared is not None else "",
        gpu_share=float(allocation.gpu_share) if allocation.gpu_share is not None else None,
        gpu_memory_mib=allocation.gpu_memory_mib,
        ports=ports,
        checkpoint_dir=workload.checkpoint_dir,
        restart_count=workload.restart_count,
        duration_s=float(duration) if duration is not None else None,
        termination_grace_s=(graces or {}).get(workload.pk),
        volumes=pod_volumes(workload.spec or {}),
        run_as_root=bool((workload.spec or {}).get("run_as_root")),
        backend_ref=allocation.backend_ref,
    )


def pod_specs_for(
    allocations: list[PodAllocation], cluster: Cluster, graces: dict[int, int] | None = None
) -> list[PodSpec]:
    """`graces`: workload id -> the grace period its policy sets (clusters.reconcile)."""
    node_ids = {a.node_id for a in allocations}
    uuids = {
        (node_id, index): uuid
        for node_id, index, uuid in Gpu.objects.filter(node_id__in=node_ids).values_list(
            "node_id", "index", "uuid"
        )
    }
    return [pod_spec(a, uuids, graces) for a in allocations]
