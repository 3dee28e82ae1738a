"""Which workload a GPU process belongs to.

A pod's processes are found by what the pod cannot change, before anything it can: a
process's environment is the pod's to write, and a pod that set GPUPOOL_WORKLOAD_ID to
another workload's id used to have its GPU use (and its activity, which idle culling
reads) counted as that workload's. In order:

1. its kernel uid: the local backend runs each sandboxed pod as `UID_BASE` + its workload
   id (clusters/pod_users.py), which nothing in the sandbox can change;
2. the pod UID in its cgroup path (Kubernetes; matched against backend_ref);
3. its process tree (the local backend records each pod's pid as backend_ref);
4. last, for a process outside any sandbox (a platform admin's unsandboxed pod, whose
   daemon left the tree), its environment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from clusters.pod_users import workload_of_uid

PROC = Path("/proc")
POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)


@dataclass(frozen=True)
class Owner:
    workload_id: int
    pod_index: int | None


def pod_uid_from_cgroup(text: str) -> str | None:
    """The pod UID in a /proc/<pid>/cgroup text (cgroup v1 or v2, systemd or cgroupfs)."""
    found = POD_UID.search(text)
    return found.group(1).replace("_", "-") if found else None


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:  # the process ended, or belongs to another user
        return None


def real_uid(pid: int, proc: Path = PROC) -> int | None:
    """The process's real uid (the `Uid:` line of /proc/<pid>/status), or None."""
    raw = _read(proc / str(pid) / "status")
    for line in (raw or b"").splitlines():
        if line.startswith(b"Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None


def owner_from_environ(pid: int, proc: Path = PROC) -> Owner | None:
    raw = _read(proc / str(pid) / "environ")
    if not raw:
        return None
    env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    workload = env.get(b"GPUPOOL_WORKLOAD_ID", b"")
    if not workload.isdigit():
        return None
    pod = env.get(b"GPUPOOL_POD_INDEX", b"")
    return Owner(int(workload), int(pod) if pod.isdigit() else None)


def parent_of(pid: int, proc: Path = PROC) -> int | None:
    raw = _read(proc / str(pid) / "stat")
    if not raw:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def ancestors(pid: int, proc: Path = PROC, limit: int = 64) -> list[int]:
    chain, current = [], pid
    while current and current > 1 and len(chain) < limit:
        chain.append(current)
        current = parent_of(current, proc) or 0
    return chain


def ref_key(backend_ref: str) -> str:
    """The local backend writes "<pid>:<start time>" (the start time guards against pid reuse
    on its side); a process is matched on the pid. Kubernetes writes the pod UID as it is."""
    pid, sep, _ = backend_ref.partition(":")
    return pid if sep and pid.isdigit() else backend_ref


class ProcessMap:
    """Resolves pids to owners against the pods the portal placed on this node."""

    def __init__(self, proc: Path = PROC):
        self.proc = proc
        self.by_ref: dict[str, Owner] = {}

    def update(self, pods: list[dict]) -> None:
        self.by_ref = {
            ref_key(str(p["backend_ref"])): Owner(p["workload_id"], p.get("pod_index"))
            for p in pods
            if p.get("backend_ref")
        }

    def owner(self, pid: int) -> Owner | None:
        uid = real_uid(pid, self.proc)
        workload_id = None if uid is None else workload_of_uid(uid)
        if workload_id is not None:
            return self._sandboxed(pid, workload_id)
        cgroup = _read(self.proc / str(pid) / "cgroup")
        pod_uid = pod_uid_from_cgroup(cgroup.decode(errors="replace")) if cgroup else None
        if pod_uid and pod_uid in self.by_ref:
            return self.by_ref[pod_uid]
        return self._by_tree(pid) or owner_from_environ(pid, self.proc)

    def _by_tree(self, pid: int) -> Owner | None:
        for candidate in ancestors(pid, self.proc):
            if str(candidate) in self.by_ref:
                return self.by_ref[str(candidate)]
        return None

    def _sandboxed(self, pid: int, workload_id: int) -> Owner:
        """A sandboxed pod's process: its workload is its uid's; which of the workload's
        pods here (a gang may have several on a node) from its tree, else the only one,
        else what its environment names among them (a pod may only mislabel its own)."""
        tree = self._by_tree(pid)
        if tree is not None and tree.workload_id == workload_id:
            return tree
        pods = {o.pod_index for o in self.by_ref.values() if o.workload_id == workload_id}
        if len(pods) == 1:
            return Owner(workload_id, pods.pop())
        said = owner_from_environ(pid, self.proc)
        index = said.pod_index if said and said.workload_id == workload_id else None
        return Owner(workload_id, index if index in pods else None)
