"""Resource limits for local pods: one cgroup per pod, with its request's memory, CPU and
process count as limits (what the kubelet does on a Kubernetes node).

cgroup v2 where the unified hierarchy has the memory, cpu and pids controllers (systemd
machines): `memory.max` (and `memory.swap.max` 0, `memory.oom.group` 1: an OOM kill takes
the whole pod, as Kubernetes does), `cpu.max`, `pids.max`. Otherwise cgroup v1, one folder
per controller's hierarchy: `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes`
where swap is accounted), `cpu.cfs_quota_us`/`cpu.cfs_period_us`, `pids.max`, and a
cpuacct folder for the usage. Each installation's pods are under a parent group of its own
(`gpupool-<digest of var/>`), so two clones on one machine never meet.

A pod's group also says which processes are the pod's (`Group.pids`): its members, whatever
their environment. The wrapper (local_wrapper.py) enters the group before it starts the
pod's command, so no child escapes it. Needs root and mounted controllers; where either is
missing `probe` says why, and pods run without limits (the pages say so).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from scheduling import bounds

MOUNTINFO = Path("/proc/self/mountinfo")
V1_CONTROLLERS = ("memory", "cpu", "pids")  # cpuacct too where it is mounted apart (usage)
V2_CONTROLLERS = ("memory", "cpu", "pids")
CPU_PERIOD_US = 100_000
# A pod's processes and threads unless the cluster's config says otherwise (`pids_max`).
PIDS_MAX_DEFAULT = 1024
PIDS_MAX_BOUNDS = (int(bounds.PIDS_MAX.low), int(bounds.PIDS_MAX.high))
PROBE_TTL_S = 300.0
NO_CONTROLLERS = "this machine has no cgroup controllers"
# A pod the kernel killed for its cgroup's memory limit, as Kubernetes says it.
MEMORY_OOM_REASON = "OOMKilled"


class CgroupError(Exception):
    """A pod's group could not be made or limited; the message says why."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What a pod may use. 0 memory or CPU: no limit on it (a request of 0 CPU)."""

    memory_mib: int
    cpus: float
    pids: int

    def as_dict(self) -> dict[str, float | int]:
        return {"memory_mib": self.memory_mib, "cpus": self.cpus, "pids": self.pids}


@dataclass(frozen=True, slots=True)
class Support:
    """Whether pods get limits here, under which cgroup version; `reason` says why not."""

    available: bool
    version: int = 0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """Where pods' groups go: one folder per v1 controller (by name), or the v2 one ("")."""

    version: int
    roots: dict[str, Path]


def limits_of(
    memory_mib: int, cpus: float, config: dict | None, pids_max: int | None = None
) -> Limits:
    """A pod's limits from its request: memory, CPU, and the processes it asked for
    (`pids_max`) up to the cluster's `pids_max`, its admin's ceiling (both bounded)."""
    low, high = PIDS_MAX_BOUNDS
    wanted = (config or {}).get("pids_max", PIDS_MAX_DEFAULT)
    pids = wanted if isinstance(wanted, int) and not isinstance(wanted, bool) else PIDS_MAX_DEFAULT
    if isinstance(pids_max, int) and not isinstance(pids_max, bool):
        pids = min(pids, pids_max)
    return Limits(max(0, int(memory_mib)), max(0.0, float(cpus)), min(max(pids, low), high))


def find_hierarchy() -> Hierarchy | None:
    """v2 if its root offers every controller pods need, else v1 if each is mounted."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    try:
        lines = MOUNTINFO.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if " - " not in line:
            continue
        mount_point = Path(fields[4])
        fstype, _, options = line.split(" - ", 1)[1].split()[:3]
        if fstype == "cgroup2" and v2 is None:
            v2 = mount_point
        elif fstype == "cgroup":
            for option in options.split(","):
                if option in (*V1_CONTROLLERS, "cpuacct"):
                    v1.setdefault(option, mount_point)
    if v2 is not None and set(V2_CONTROLLERS) <= set(_read(v2 / "cgroup.controllers").split()):
        return Hierarchy(2, {"": v2})
    if set(V1_CONTROLLERS) <= set(v1):
        # cpuacct mounted with cpu (cpu,cpuacct) shares its folder: one group serves both.
        if v1.get("cpuacct") == v1["cpu"]:
            del v1["cpuacct"]
        return Hierarchy(1, v1)
    return None


def parent_name(var_dir: Path | str) -> str:
    """The installation's parent group: one per var/, as its socket folder."""
    return "gpupool-" + hashlib.sha256(str(var_dir).encode()).hexdigest()[:12]


class Group:
    """One pod's cgroup, in one folder (v2) or one per controller (v1)."""

    def __init__(self, version: int, folders: dict[str, str]):
        self.version = version
        self.folders = {name: Path(path) for name, path in folders.items()}

    @classmethod
    def under(cls, hierarchy: Hierarchy, parent: str, name: str) -> Group:
        folders = {key: str(root / parent / name) for key, root in hierarchy.roots.items()}
        return cls(hierarchy.version, folders)

    def as_dict(self) -> dict:
        return {"version": self.version, "folders": {k: str(v) for k, v in self.folders.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> Group:
        return cls(int(data["version"]), dict(data["folders"]))

    def _folder(self, controller: str) -> Path:
        return self.folders[""] if self.version == 2 else self.folders[controller]

    def create(self, limits: Limits) -> None:
        """Make the group (and its parent) and write its limits. Raises CgroupError."""
        try:
            for folder in self.folders.values():
                if self.version == 2:
                    _enable_controllers(folder.parent.parent)
                    folder.parent.mkdir(exist_ok=True)
                    _enable_controllers(folder.parent)
                folder.mkdir(parents=True, exist_ok=True)
            self._write_limits(limits)
        except OSError as exc:
            self.remove()
            where = self.procs_files()[0]
            raise CgroupError(f"cannot make the pod's cgroup {where}: {exc}") from exc

    def _write_limits(self, limits: Limits) -> None:
        memory = limits.memory_mib * 1024 * 1024
        quota = max(1000, round(limits.cpus * CPU_PERIOD_US)) if limits.cpus > 0 else 0
        mem, cpu, pids = (self._folder(c) for c in ("memory", "cpu", "pids"))
        if self.version == 2:
            if memory:
                (mem / "memory.max").write_text(str(memory))
                _write_if_there(mem / "memory.swap.max", "0")
                _write_if_there(mem / "memory.oom.group", "1")
            (cpu / "cpu.max").write_text(f"{quota or 'max'} {CPU_PERIOD_US}")
        else:
            if memory:
                (mem / "memory.limit_in_bytes").write_text(str(memory))
                # Swap accounted (swapaccount=1): memory and swap together, the same bound.
                _write_if_there(mem / "memory.memsw.limit_in_bytes", str(memory))
            (cpu / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (cpu / "cpu.cfs_quota_us").write_text(str(quota or -1))
        (pids / "pids.max").write_text(str(limits.pids))

    def procs_files(self) -> list[str]:
        """Where a process writes its pid to enter the group (every hierarchy's)."""
        return [str(folder / "cgroup.procs") for folder in self.folders.values()]

    def pids(self) -> list[int]:
        """The group's processes now (none once it is gone). One hierarchy answers for all:
        a process enters each at once and its children inherit them."""
        text = _read(self._folder("pids") / "cgroup.procs")
        return [int(pid) for pid in text.split() if pid.isdigit() and int(pid) != os.getpid()]

    def exists(self) -> bool:
        return self._folder("pids").is_dir()

    def oom_kills(self) -> int:
        """Processes the kernel killed for the group's memory limit."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        return _counter(_read(self._folder("memory") / name), "oom_kill")

    def cpu_usage_s(self) -> float:
        """CPU seconds the group's processes used."""
        if self.version == 2:
            return _counter(_read(self.folders[""] / "cpu.stat"), "usage_usec") / 1e6
        folder = self.folders.get("cpuacct", self.folders["cpu"])
        text = _read(folder / "cpuacct.usage").strip()
        return int(text) / 1e9 if text.isdigit() else 0.0

    def throttled_periods(self) -> int:
        """CPU periods in which the group ran out of its quota."""
        return _counter(_read(self._folder("cpu") / "cpu.stat"), "nr_throttled")

    def remove(self) -> bool:
        """Remove the group once it holds no process; False while one is left. The
        installation's parent goes with its last pod."""
        gone = True
        for folder in self.folders.values():
            try:
                folder.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                gone = False
                continue
            with contextlib.suppress(OSError):
                folder.parent.rmdir()  # busy while another pod of this installation runs
        return gone


def installation_remove(var_dir: Path | str) -> bool:
    """Remove the installation's empty groups (pods whose records went without them, as a
    test's var/ does) and its parent; a group with a process left stays. Whether all went."""
    hierarchy = find_hierarchy()
    parents = [
        root / parent_name(var_dir) for root in (hierarchy.roots.values() if hierarchy else ())
    ]
    for parent in parents:
        for folder in parent.glob("*/") if parent.is_dir() else ():
            with contextlib.suppress(OSError):
                folder.rmdir()
        with contextlib.suppress(OSError):
            parent.rmdir()
    return not any(parent.exists() for parent in parents)


def _enable_controllers(folder: Path) -> None:
    """v2: let `folder`'s children have the controllers pods need."""
    have = set(_read(folder / "cgroup.subtree_control").split())
    missing = [c for c in V2_CONTROLLERS if c not in have]
    if missing:
        (folder / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in missing))


def _write_if_there(path: Path, value: str) -> None:
    """A knob that some kernels lack (swap not accounted, no oom.group): skipped there."""
    with contextlib.suppress(FileNotFoundError, PermissionError):
        path.write_text(value)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _counter(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


_probed: dict[str, tuple[float, Support]] = {}
_probe_lock = threading.Lock()


def probe(var_dir: Path | str) -> Support:
    """Can pods get limits here? Tried for real (a group made under the installation's
    parent, limited, removed), remembered for a few minutes."""
    key = str(var_dir)
    with _probe_lock:
        cached = _probed.get(key)
        if cached is None or time.monotonic() - cached[0] > PROBE_TTL_S:
            cached = _probed[key] = (time.monotonic(), _try(key))
        return cached[1]


def _try(var_dir: str) -> Support:
    hierarchy = find_hierarchy()
    if hierarchy is None:
        return Support(False, 0, NO_CONTROLLERS)
    if os.geteuid() != 0:
        return Support(False, hierarchy.version, "the worker does not run as root, so it "
                       "cannot make cgroups")  # fmt: skip
    group = Group.under(hierarchy, parent_name(var_dir), f"probe-{os.getpid()}")
    try:
        group.create(Limits(64, 0.1, 16))
    except CgroupError as exc:
        return Support(False, hierarchy.version, str(exc))
    group.remove()
    return Support(True, hierarchy.version)
