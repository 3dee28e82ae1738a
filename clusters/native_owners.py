"""The owners of native pods (clusters/native.py), walked up from each pod's controller to
its top owner: which owner's pods are one gang, its size, which owner the pages show.

Only the owners of new groups' pods are read, each once a pass however many pods it has, in
parallel on the backend's pool; a queued workload's pods are placed by its record (its key,
and the links to its pods' own controllers), with no read.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from clusters.backends import BackendError
from clusters.backends.kubernetes import owners
from clusters.backends.kubernetes.owners import KindNotServed, OwnerRef, controller_of

if TYPE_CHECKING:
    from clusters.backends.kubernetes import KubernetesBackend
    from clusters.backends.kubernetes.native import NativePod
    from scheduling.models import Workload

# A LeaderWorkerSet's pods: the group they are of, its size, the LeaderWorkerSet's name.
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-key"
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
LWS = "leaderworkerset.x-k8s.io/v1"
OWNER_DEPTH = 4  # controllers walked up at most (RayJob > RayCluster > pod is 2)


@dataclass(frozen=True, slots=True)
class Origin:
    """Where an owner's pods belong, from its chain of controllers: `shown` the top owner
    (pages name it); `gang` the owner whose pods are one workload and which is suspended on
    stop (None: each pod is a workload of its own); `size` that gang's, from its spec."""

    shown: OwnerRef
    gang: OwnerRef | None = None
    size: int | None = None
    note: str = ""  # why the walk stopped short (a kind the API server does not serve)
    error: BackendError | None = None  # a read that failed: the group waits a pass


def to_walk(
    pods: list[NativePod], active: dict[str, Workload], links: dict[str, str]
) -> dict[str, tuple[str, OwnerRef]]:
    """The owners whose chain is read this pass: those of live pods that no queued
    workload holds already (a queued group's pods are placed by its record's links)."""
    return {
        pod.owner.uid: (pod.namespace, pod.owner)
        for pod in pods
        if pod.owner is not None
        and LWS_GROUP not in pod.labels
        and not pod.terminal
        and not pod.deleting
        and pod.uid not in active
        and pod.owner.uid not in active
        and pod.owner.uid not in links
    }


def origins(
    backend: KubernetesBackend, starts: dict[str, tuple[str, OwnerRef]]
) -> dict[str, Origin]:
    """Each owner's origin, by its chain of controllers:
    1. the chains' last links of a kind GPUPool reads are read, in parallel on the
       backend's pool, each object once a pass however many pods it has;
    2. each read object's controller is the next link; again, up to OWNER_DEPTH;
    3. the origin is worked out from each chain (`_origin`)."""
    if not starts:
        return {}
    read: dict[str, dict | BackendError | None] = {}
    chains = {uid: [ref] for uid, (_, ref) in starts.items()}

    def fetch(item: tuple[str, OwnerRef]) -> dict | BackendError | None:
        try:
            found = owners.read_owner(backend, *item)
        except BackendError as exc:  # that owner's pods' error, in their turn
            return exc
        # One of the same name made since (another uid) is not the pods' owner: gone.
        return found if found and found["metadata"].get("uid") == item[1].uid else None

    growing = dict(chains)
    with ThreadPoolExecutor(max_workers=backend.workers) as pool:
        for _ in range(OWNER_DEPTH):
            wanted = {
                chain[-1].uid: (starts[uid][0], chain[-1])
                for uid, chain in growing.items()
                if chain[-1].known is not None and chain[-1].uid not in read
            }
            read.update(zip(wanted, pool.map(fetch, wanted.values()), strict=True))
            growing = {uid: chain for uid, chain in growing.items() if _grow(chain, read)}
    return {uid: _origin(chain, read) for uid, chain in chains.items()}


def _grow(chain: list[OwnerRef], read: dict[str, dict | BackendError | None]) -> bool:
    """Add the last link's controller to the chain (True), if it was read and has one."""
    found = read.get(chain[-1].uid)
    parent = controller_of(found) if isinstance(found, dict) else None
    if parent is None or any(ref.uid == parent.uid for ref in chain):
        return False
    chain.append(parent)
    return True


def _origin(chain: list[OwnerRef], read: dict[str, dict | BackendError | None]) -> Origin:
    """The top owner is the chain's last link; the gang is the highest link of a gang kind
    over the link below it (a JobSet over its Job, a RayJob over its RayCluster but not its
    submitter Job, whose pod is a workload of its own, still shown under the RayJob), sized
    by the highest such link with a size at or below it. A link gone (404) ends the chain
    below it; a kind the server does not serve makes the pod's own controller its gang."""
    objects = [read.get(ref.uid) for ref in chain]
    for index, found in enumerate(objects):
        if isinstance(found, KindNotServed):
            first = objects[0] if isinstance(objects[0], dict) else None
            return Origin(chain[0], chain[0], _size(chain[0], first), note=f"{found}.")
        if isinstance(found, BackendError):
            return Origin(chain[0], error=found)
        if found is None and chain[index].known is not None:
            chain, objects = chain[: max(index, 1)], objects[: max(index, 1)]
            break
    gangs = [i for i, ref in enumerate(chain) if _gang_over(chain, i)]
    if not gangs:
        return Origin(chain[-1])
    sizes = (_size(chain[i], objects[i]) for i in range(gangs[-1], -1, -1))
    return Origin(chain[-1], chain[gangs[-1]], next((s for s in sizes if s is not None), None))


def _gang_over(chain: list[OwnerRef], index: int) -> bool:
    """Whether the chain's link runs a gang that holds the pods below it (a RayJob's is its
    RayCluster's pods, not its submitter Job's)."""
    kind = chain[index].known
    if kind is None or not kind.gang:
        return False
    return not kind.over or (index > 0 and chain[index - 1].kind in kind.over)


def _size(ref: OwnerRef, found: Any) -> int | None:
    kind = ref.known
    if kind is None or kind.size is None or not isinstance(found, dict):
        return None
    return kind.size(found)
