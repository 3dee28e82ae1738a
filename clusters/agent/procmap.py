"""Which workload a GPU process belongs to.

In order: the process's environment (the local backend sets GPUPOOL_WORKLOAD_ID), its
process tree and group (the local backend records each pod's pid as backend_ref), then
the pod UID in its cgroup path (Kubernetes; matched against backend_ref too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

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
        found = owner_from_environ(pid, self.proc)
        if found:
            return found
        for candidate in ancestors(pid, self.proc):
            if str(candidate) in self.by_ref:
                return self.by_ref[str(candidate)]
        cgroup = _read(self.proc / str(pid) / "cgroup")
        uid = pod_uid_from_cgroup(cgroup.decode(errors="replace")) if cgroup else None
        return self.by_ref.get(uid) if uid else None
