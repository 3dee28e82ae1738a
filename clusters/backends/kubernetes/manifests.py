"""Kubernetes objects as GPUPool writes them, and as it reads nodes and pods back."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from clusters.backends import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    GpuInfo,
    NodeInfo,
    PodPhase,
    PodSpec,
    PodStatus,
    PortSpec,
)
from clusters.backends.kubernetes.ownership import Owner
from clusters.sharing import POD_PIPE_DIRECTORY, mps_env

ROLE = "gpupool.io/role"
PROJECT_LABEL = "gpupool.io/project"
POD_LABEL = "gpupool.io/pod"  # the pod's name in GPUPool: gp-<workload>-<index>
WORKLOAD_CONTAINER = "main"
RESERVATION_CONTAINER = "hold"
# The user a pod runs as unless its workload needs root (`run_as_user` in the cluster's
# config): the restricted Pod Security level refuses root, and an image's USER root would
# make the kubelet refuse `runAsNonRoot`. 1000 is the usual notebook user (jovyan).
DEFAULT_UID = 1000
RESERVATION_UID = 65534  # nobody: nvidia-smi needs no privilege
# Reservation pods are Guaranteed (requests equal limits), the last a node evicts.
RESERVATION_RESOURCES = {"cpu": "10m", "memory": "64Mi"}
RESERVATION_PRIORITY = 1_000_000  # above every user pod; system classes are above 1e9
GPU_RESOURCE = "nvidia.com/gpu"
TOLERATED = {GPU_RESOURCE}  # the taints every GPUPool pod tolerates (see pod_manifest)
# A pod that failed for one of these reasons was pushed out by its node (kubelet eviction,
# node shutdown or loss, device allocation), not by its own code.
NODE_REASONS = {
    "Evicted",
    "NodeLost",
    "Shutdown",
    "Terminated",
    "NodeShutdown",
    "UnexpectedAdmissionError",
    "OutOfnvidia.com/gpu",
}
# A pod still terminating this long after its deletion deadline is on a node that does not
# answer (NotReady, cut off): its kubelet will never confirm, so it is deleted by force.
FORCE_DELETE_AFTER = timedelta(minutes=2)
# A container waiting for one of these reasons will never start, however long it waits.
NEVER_STARTS = {"InvalidImageName", "ErrImageNeverPull"}
# The reservation pod prints the UUID of the GPU the device plugin gave it, then holds it.
# nvidia-smi is mounted into the container by the NVIDIA container toolkit ("utility").
MPS_VOLUME = "gpupool-mps-pipe"
# Where the node agent keeps each shared GPU's MPS pipe folder on the host (its --mps-root;
# the cluster's config `mps_root` when an admin moves it).
MPS_ROOT = "/run/gpupool/mps"
RESERVATION_COMMAND = [
    "sh",
    "-c",
    "nvidia-smi --query-gpu=uuid --format=csv,noheader; exec sleep infinity",
]


def quantity_mib(value: str) -> int:
    units = {
        "Ki": 1 / 1024,
        "Mi": 1,
        "Gi": 1024,
        "Ti": 1024**2,
        "k": 1e3 / 2**20,
        "M": 1e6 / 2**20,
        "G": 1e9 / 2**20,
    }
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([A-Za-z]*)", str(value))
    if not match:
        return 0
    number, unit = match.groups()
    return int(float(number) * units.get(unit, 1 / 2**20))


def cpu_cores(value: str) -> float:
    value = str(value)
    return float(value[:-1]) / 1000 if value.endswith("m") else float(value or 0)


def reservation_name(owner: Owner, node: str, index: int) -> str:
    return f"gp-reserve-{owner.tag}-{node}-{index}"[:253]


def _labels(spec: PodSpec, owner: Owner) -> dict[str, str]:
    return {
        **owner.labels,
        ROLE: "workload",
        POD_LABEL: spec.name,
        "gpupool.io/workload-id": str(spec.workload_id),
        "gpupool.io/pod-index": str(spec.pod_index),
        PROJECT_LABEL: spec.project[:63],
        "gpupool.io/workload": spec.workload_name[:63],
        "gpupool.io/kind": spec.kind,
    }


def port_names(spec: PodSpec) -> list[str]:
    """The ports' names as the API server takes them (IANA service names: at most 15
    lower-case letters, digits and single dashes, with a letter), unique in the pod;
    a name that cannot be made so becomes port<N>."""
    names: list[str] = []
    for index, port in enumerate(spec.ports):
        name = re.sub(r"[^a-z0-9]+", "-", port.name.lower())[:15].strip("-")
        if not re.search("[a-z]", name) or name in names:
            name = f"port{index}"
        names.append(name)
    return names


def port_env(spec: PodSpec) -> dict[str, str]:
    """The same port variables the local backend sets, so `$(GPUPOOL_PORT)` in a command
    (a workspace's tool) means the container port here too."""
    env = {f"GPUPOOL_PORT_{p.name.upper().replace('-', '_')}": str(p.port) for p in spec.ports}
    if spec.ports:
        env["GPUPOOL_PORT"] = str(spec.ports[0].port)
    return env


def security_contexts(*, run_as_root: bool, uid: int | None) -> tuple[dict, dict]:
    """(pod, container) securityContext. By default what the `restricted` Pod Security
    level asks: a non-root user, no privilege escalation, every capability dropped, the
    runtime's seccomp profile. A workload that needs root keeps the image's user and its
    capabilities (the `baseline` level), still without privilege escalation."""
    pod: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    container: dict[str, Any] = {"allowPrivilegeEscalation": False}
    if run_as_root:
        return pod, container
    pod["runAsNonRoot"] = True
    if uid is not None:
        pod.update(runAsUser=uid, runAsGroup=uid, fsGroup=uid)  # fsGroup: volumes writable
    container["capabilities"] = {"drop": ["ALL"]}
    return pod, container


def pod_manifest(
    spec: PodSpec,
    owner: Owner,
    *,
    pin_with_node_name: bool = True,
    uid: int | None = DEFAULT_UID,
    mps_root: str = MPS_ROOT,
) -> dict:
    env = {**port_env(spec), **spec.env}
    limits: dict[str, str] = {"memory": f"{spec.memory_mib}Mi"}
    if spec.gpu_indices:
        limits[GPU_RESOURCE] = str(len(spec.gpu_indices))
    elif spec.shared_gpu_index is not None:
        # The reservation pod holds the device; this pod only points at it.
        env["NVIDIA_VISIBLE_DEVICES"] = spec.shared_gpu_uuid or str(spec.shared_gpu_index)
        env.update(mps_env(spec.mps, POD_PIPE_DIRECTORY) if spec.mps else {})
    elif not spec.mig_device:
        # A MIG pod's env names its instance already (clusters.mig.mig_env: the device
        # UUID its node's agent reported), which the container toolkit shows it alone.
        env["NVIDIA_VISIBLE_DEVICES"] = "void"  # a CPU-only pod sees no GPU
    pod_security, container_security = security_contexts(run_as_root=spec.run_as_root, uid=uid)
    container: dict[str, Any] = {
        "name": WORKLOAD_CONTAINER,
        "image": spec.image or "busybox:1.36",
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "resources": {
            "requests": {"cpu": str(spec.cpu), "memory": f"{spec.memory_mib}Mi"},
            "limits": limits,
        },
        "ports": [
            {"name": name, "containerPort": p.port}
            for name, p in zip(port_names(spec), spec.ports, strict=True)
        ],
        "securityContext": container_security,
    }
    if spec.command:
        container["command"] = list(spec.command)
    if spec.args:
        container["args"] = list(spec.args)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": pod_security,
        "containers": [container],
        "tolerations": [
            {"key": key, "operator": "Exists", "effect": "NoSchedule"} for key in sorted(TOLERATED)
        ],
    }
    if spec.volumes:
        _mount_volumes(pod_spec, container, spec)
    _mount_mps_pipe(pod_spec, container, spec, mps_root)
    if spec.rendezvous is not None:
        _rendezvous(pod_spec, container, spec, owner)
    if spec.termination_grace_s is not None:
        # GPUPool passes the grace period on each delete; this one covers deletions it
        # does not make (a node drain), so a job can still checkpoint.
        pod_spec["terminationGracePeriodSeconds"] = spec.termination_grace_s
    if pin_with_node_name:
        pod_spec["nodeName"] = spec.node_name
    else:
        pod_spec["schedulerName"] = "gpupool"  # no default scheduler races our Binding
    annotations = {
        "gpupool.io/node": spec.node_name,
        "gpupool.io/gpu-indices": ",".join(map(str, spec.gpu_indices)),
    }
    if spec.shared_gpu_index is not None:
        annotations["gpupool.io/shared-gpu"] = f"{spec.shared_gpu_index}:{spec.gpu_share}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": owner.object_name(spec.name),
            "labels": _labels(spec, owner),
            "annotations": annotations,
        },
        "spec": pod_spec,
    }


def _mount_volumes(pod_spec: dict[str, Any], container: dict[str, Any], spec: PodSpec) -> None:
    """Each claim as a pod volume, mounted into the main container at its path."""
    pod_spec["volumes"] = [
        {
            "name": v.name,
            "persistentVolumeClaim": {"claimName": v.claim, "readOnly": v.read_only},
        }
        for v in spec.volumes
    ]
    container["volumeMounts"] = [
        {"name": v.name, "mountPath": v.mount_path, "readOnly": v.read_only} for v in spec.volumes
    ]


HOSTFILE_VOLUME = "gpupool-hostfile"


def mps_pipe_host_path(mps_root: str, device: str) -> str:
    """The host folder of a shared GPU's MPS pipe, named as the agent names it: by the
    device the sharers see (the UUID the reservation pod holds)."""
    return f"{mps_root.rstrip('/')}/{device}/pipe"


def _mount_mps_pipe(
    pod_spec: dict[str, Any], container: dict[str, Any], spec: PodSpec, mps_root: str
) -> None:
    """A sharer talks to its GPU's MPS daemon (run by the node agent) through the daemon's
    pipe folder and System V shared memory: the folder is mounted from the host, and the
    pod shares the host's IPC namespace (hostIPC), as NVIDIA's MPS needs. `Directory`: the
    kubelet starts the pod only once the agent has made the folder (its daemon is up), so
    no sharer ever runs without its limits."""
    if spec.mps is None or spec.shared_gpu_index is None:
        return
    device = spec.shared_gpu_uuid or str(spec.shared_gpu_index)
    pod_spec["hostIPC"] = True
    pod_spec.setdefault("volumes", []).append(
        {
            "name": MPS_VOLUME,
            "hostPath": {"path": mps_pipe_host_path(mps_root, device), "type": "Directory"},
        }
    )
    container.setdefault("volumeMounts", []).append(
        {"name": MPS_VOLUME, "mountPath": POD_PIPE_DIRECTORY}
    )


def _rendezvous(
    pod_spec: dict[str, Any], container: dict[str, Any], spec: PodSpec, owner: Owner
) -> None:
    """A distributed pod is `<pod>.<service>.<namespace>.svc` in the cluster's DNS
    (hostname + subdomain of the headless Service), and reads the hostfile at
    /etc/gpupool/hostfile. The hostname is the pod's Kubernetes name (a DNS label: at
    most 63 characters), as clusters.podspecs wrote it into the peers' addresses."""
    assert spec.rendezvous is not None
    pod_spec["hostname"] = owner.object_name(spec.name)
    pod_spec["subdomain"] = spec.rendezvous.service
    pod_spec.setdefault("volumes", []).append(
        {"name": HOSTFILE_VOLUME, "configMap": {"name": hostfile_name(spec)}}
    )
    container.setdefault("volumeMounts", []).append(
        {"name": HOSTFILE_VOLUME, "mountPath": "/etc/gpupool", "readOnly": True}
    )


def hostfile_name(spec: PodSpec) -> str:
    assert spec.rendezvous is not None
    return f"{spec.rendezvous.service}-hostfile"


def rendezvous_service_manifest(spec: PodSpec, owner: Owner) -> dict:
    """The headless Service of a distributed workload: a DNS record per pod, published
    before the pods are ready (the peers meet while they start). Its name carries the
    owner's identities (clusters.podspecs), its selector both of them: another GPUPool's
    pods of a workload with the same id are not its peers."""
    assert spec.rendezvous is not None
    labels = {**_labels(spec, owner), ROLE: "rendezvous"}
    for per_pod in (POD_LABEL, "gpupool.io/pod-index"):
        labels.pop(per_pod)
    port = spec.rendezvous.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": spec.rendezvous.service, "labels": labels},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {**owner.labels, "gpupool.io/workload-id": str(spec.workload_id)},
            "ports": [{"name": "rendezvous", "port": port, "targetPort": port}],
        },
    }


def hostfile_manifest(spec: PodSpec, service: dict) -> dict:
    """The MPI hostfile (`host slots=N` per pod, rank order), owned by the headless
    Service: the garbage collector removes it with the Service."""
    assert spec.rendezvous is not None
    text = "".join(f"{host} slots={spec.rendezvous.slots}\n" for host in spec.rendezvous.hosts)
    meta = service["metadata"]
    owner = {"apiVersion": "v1", "kind": "Service", "name": meta["name"], "uid": meta["uid"]}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": hostfile_name(spec),
            "labels": meta.get("labels") or {},
            "ownerReferences": [owner],
        },
        "data": {"hostfile": text},
    }


def service_manifest(spec: PodSpec, owner: Owner) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": owner.object_name(spec.name), "labels": _labels(spec, owner)},
        "spec": {
            # The owner's labels too: another GPUPool's pod of the same name is not selected.
            "selector": {POD_LABEL: spec.name, **owner.identity},
            "ports": [
                {"name": name, "port": p.port, "targetPort": p.port}
                for name, p in zip(port_names(spec), spec.ports, strict=True)
            ],
        },
    }


SSH_PORT = "ssh"  # scheduling.specs.SSH_PORT_NAME: never published (PUBLISH_MODES)


def published_ports(spec: PodSpec) -> list[tuple[str, PortSpec]]:
    """(name in the cluster, port) of the ports an admin may publish: not SSH's."""
    named = zip(port_names(spec), spec.ports, strict=True)
    return [(name, port) for name, port in named if port.name != SSH_PORT]


def _owned_by(service: dict) -> list[dict]:
    meta = service["metadata"]
    return [{"apiVersion": "v1", "kind": "Service", "name": meta["name"], "uid": meta["uid"]}]


def node_port_service_manifest(spec: PodSpec, owner: Owner, service: dict) -> dict | None:
    """The pod's published ports on every node (the cluster picks the node ports), owned by
    its own Service so that they go with it. None: nothing to publish."""
    ports = published_ports(spec)
    if not ports:
        return None
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": f"{service['metadata']['name']}-np",
            "labels": _labels(spec, owner),
            "ownerReferences": _owned_by(service),
        },
        "spec": {
            "type": "NodePort",
            "selector": {POD_LABEL: spec.name, **owner.identity},
            "ports": [{"name": n, "port": p.port, "targetPort": p.port} for n, p in ports],
        },
    }


def ingress_manifest(
    spec: PodSpec, owner: Owner, service: dict, *, ingress_class: str, domain: str
) -> dict | None:
    """A host per published HTTP port (`ingress_host`) to the pod's own Service, in the
    admin's Ingress class; owned by the Service. None: no HTTP port."""
    ports = [(n, p) for n, p in published_ports(spec) if p.protocol == "http"]
    if not ports:
        return None
    name = service["metadata"]["name"]
    rules = []
    for port_name, port in ports:
        target = {"service": {"name": name, "port": {"number": port.port}}}
        path = {"path": "/", "pathType": "Prefix", "backend": target}
        host = ingress_host(port_name, spec, owner, domain)
        rules.append({"host": host, "http": {"paths": [path]}})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {
            "name": name,
            "labels": _labels(spec, owner),
            "ownerReferences": _owned_by(service),
        },
        "spec": {"ingressClassName": ingress_class, "rules": rules},
    }


def ingress_host(port_name: str, spec: PodSpec, owner: Owner, domain: str) -> str:
    """<port>-<workload>-<pod>-<installation 8>-<cluster 8>.<domain>: two GPUPools (or two
    Cluster records) publishing on one cluster and domain never claim the same host. The
    first label stays a DNS label whatever the ids: at most 15 + 19 (a bigint) + 4 + 17
    characters and dashes, under 63."""
    return f"{port_name}-{spec.workload_id}-{spec.pod_index}-{owner.tag}.{domain}"


def ingress_hosts(ingress: dict) -> set[str]:
    return {r.get("host") or "" for r in (ingress.get("spec") or {}).get("rules") or []}


def priority_class_manifest(name: str) -> dict:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        "value": RESERVATION_PRIORITY,
        "globalDefault": False,
        "preemptionPolicy": "Never",
        "description": "GPUPool reservation pods: they hold a shared GPU for its sharers, "
        "so a node under pressure must evict the sharers first.",
    }


def reservation_manifest(
    owner: Owner, node: str, index: int, image: str, priority_class: str
) -> dict:
    pod_security, container_security = security_contexts(run_as_root=False, uid=RESERVATION_UID)
    limits = {**RESERVATION_RESOURCES, GPU_RESOURCE: "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": reservation_name(owner, node, index),
            "labels": {
                **owner.labels,
                ROLE: "reservation",
                "gpupool.io/gpu-index": str(index),
            },
            "annotations": {"gpupool.io/node": node},
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 0,
            "priorityClassName": priority_class,
            "securityContext": pod_security,
            "containers": [
                {
                    "name": RESERVATION_CONTAINER,
                    "image": image,
                    "command": RESERVATION_COMMAND,
                    "env": [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"}],
                    # Guaranteed: equal requests and limits of cpu and memory.
                    "resources": {"requests": dict(limits), "limits": limits},
                    "securityContext": container_security,
                }
            ],
            "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        },
    }


def _unschedulable_reasons(node_spec: dict, ready: bool) -> list[str]:
    """Why no new GPUPool pod may go there. A taint its pods do not tolerate keeps them off:
    NoExecute would evict them, NoSchedule says the admin wants nothing new there (pinned
    pods skip the scheduler that would enforce it, so GPUPool honours it itself)."""
    reasons = [] if ready else ["NotReady"]
    said = set() if ready else {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
    if node_spec.get("unschedulable"):
        reasons.append("cordoned")
        said.add("node.kubernetes.io/unschedulable")  # the taint a cordon puts on
    repelling = [
        taint
        for taint in node_spec.get("taints") or []
        if taint.get("effect") in ("NoSchedule", "NoExecute") and taint.get("key") not in TOLERATED
    ]
    reasons += [
        f"tainted {t.get('key')}:{t['effect']}" for t in repelling if t.get("key") not in said
    ]
    return reasons


def node_info(item: dict) -> NodeInfo:
    meta, spec, status = item["metadata"], item.get("spec") or {}, item.get("status") or {}
    labels = meta.get("labels") or {}
    allocatable = status.get("allocatable") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    reasons = _unschedulable_reasons(spec, ready)
    count = int(allocatable.get(GPU_RESOURCE, 0) or 0)
    model = labels.get("nvidia.com/gpu.product", "")
    memory = int(labels.get("nvidia.com/gpu.memory", 0) or 0)
    return NodeInfo(
        name=meta["name"],
        labels=labels,
        cpu_cores=cpu_cores(allocatable.get("cpu", "0")),
        memory_mib=quantity_mib(allocatable.get("memory", "0")),
        schedulable=not reasons,
        unschedulable_reason=", ".join(reasons),
        gpus=tuple(GpuInfo(index=i, model=model, memory_mib=memory) for i in range(count)),
    )


def _overdue(deletion_timestamp: str | None) -> bool:
    """deletionTimestamp is when the pod should be gone (request time + grace period)."""
    if not deletion_timestamp:
        return False
    try:
        deadline = datetime.fromisoformat(deletion_timestamp.replace("Z", "+00:00"))
    except ValueError:
        return False
    return datetime.now(UTC) - deadline > FORCE_DELETE_AFTER


def pod_status(pod: dict) -> PodStatus:
    meta, status = pod["metadata"], pod.get("status") or {}
    labels = meta.get("labels") or {}
    phase = status.get("phase") or "Pending"
    result = PodStatus(
        name=labels.get(POD_LABEL) or meta["name"],
        namespace=meta.get("namespace", ""),
        workload_id=int(labels.get("gpupool.io/workload-id", 0)),
        pod_index=int(labels.get("gpupool.io/pod-index", 0)),
        phase=PodPhase(phase) if phase in PodPhase.__members__.values() else PodPhase.UNKNOWN,
        backend_ref=meta.get("uid", ""),
        node_name=(pod.get("spec") or {}).get("nodeName", ""),
        terminating=bool(meta.get("deletionTimestamp")),
        stuck=_overdue(meta.get("deletionTimestamp")),
    )
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        terminated, waiting = state.get("terminated"), state.get("waiting")
        if terminated:
            result.exit_code = terminated.get("exitCode")
            result.message = terminated.get("message") or terminated.get("reason") or ""
        elif waiting and result.phase == PodPhase.PENDING:
            result.reason = waiting.get("reason") or ""
            result.message = ": ".join(filter(None, [result.reason, waiting.get("message")]))
            if result.reason in NEVER_STARTS:
                result.phase = PodPhase.FAILED  # the kubelet would wait forever
    if status.get("message"):
        result.message = status["message"]
    result.lost = result.phase == PodPhase.FAILED and status.get("reason") in NODE_REASONS
    if result.lost:
        result.reason = status["reason"]  # as kubectl shows it: Evicted, NodeLost
    ports = [p for c in (pod.get("spec") or {}).get("containers", []) for p in c.get("ports") or []]
    if ports:
        result.endpoint = f"{meta['name']}.{result.namespace}.svc:{ports[0]['containerPort']}"
        result.ports = {
            p.get("name") or str(p["containerPort"]): f"{meta['name']}.{result.namespace}.svc:"
            f"{p['containerPort']}"
            for p in ports
        }
    return result
