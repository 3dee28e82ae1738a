"""This machine as a one-node cluster: each pod is a real process in its own process group.

Like JupyterHub's LocalProcessSpawner. A pod's record lives in a small JSON file under
var/local/<cluster>/pods/, so a restarted worker finds its processes again by pid and
start time (a reused pid has another start time). Each process runs under a tiny
wrapper that writes the exit code to a file, because only the process's parent can
wait() for it and the parent may be a worker that has since restarted.

Tenants are isolated (`sandbox`): each pod runs in a bubblewrap sandbox as a user of its
own, with an environment built only from its workload's and GPUPool's variables, in its
gang's network namespace (only a loopback of the gang's own). A tool that serves a port listens
on a unix socket only the portal can reach, or on a TCP port of that loopback that a relay
(clusters/backends/relay.py) serves to the portal as a unix socket. A machine that cannot
sandbox runs only platform admins' pods, on this machine's network.

Each pod runs in a cgroup of its own (`cgroups`) limited to its request's memory and CPU
and to the cluster's `pids_max` processes; its members are the pod's processes, whatever
their environment says. A machine without cgroups runs pods unlimited, and says so.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from django.conf import settings

from clusters.agent.mps import MpsDaemons, MpsError
from clusters.agent.procmap import real_uid
from clusters.backends import (
    Backend,
    BackendError,
    MigKey,
    MigLayout,
    NodeInfo,
    PodPhase,
    PodSpec,
    PodSpecInvalid,
    PodStatus,
    ReconcileReport,
    as_enforced,
    cgroups,
    expand_vars,
    mps_device,
    sandbox,
)
from clusters.backends.localgpus import local_gpus, local_mig_sync
from clusters.backends.relay import start_time as _proc_start_time
from clusters.pod_users import pod_uid
from clusters.sharing import client_visible_devices, mps_env

log = logging.getLogger(__name__)

WRAPPER = str(Path(__file__).with_name("local_wrapper.py"))
RELAY = str(Path(__file__).with_name("relay.py"))
# Popen objects of processes this worker started, so that they are reaped (no zombies).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
# How long a record written just before a spawn may lack its process before it is dropped.
SPAWN_GRACE_S = 10
# The only variables a pod gets besides its workload's and GPUPool's own: never the worker's
# (SECRET_KEY, DATABASE_URL, mail passwords).
SOCKET_NAME = "tool.sock"
SOCKETS_RUN_DIR = Path("/run/gpupool")
MPS_RUN_DIR = SOCKETS_RUN_DIR  # the MPS pipe folders, for the same reason (short paths)
# The worker probes at least every inventory sync (60 s): older, it may be gone.
ISOLATION_REPORT_TTL_S = 600
BASE_ENV = {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONUNBUFFERED": "1"}
# A sandboxed pod's declared ports, on its gang's own loopback: pod i's port n is
# NETNS_PORTS[0] + i * (PORTS_MAX + 1) + n (modulo the range), apart from the rendezvous
# ports (clusters.podspecs.LOCAL_PORTS: 29500 to 39499) and from its peers' in the
# namespace; n = PORTS_MAX is its way to report checkpoints (relay.py's door).
NETNS_PORTS = (40000, 25000)
PORTS_MAX = 100  # scheduling.bounds.PORTS_MAX
CHECKPOINT_URL = "GPUPOOL_CHECKPOINT_URL"  # scheduling.checkpoints


def _alive(pid: int, start_time: str) -> bool:
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        _CHILDREN.pop(pid, None)
        return False
    return _proc_start_time(pid) == start_time


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalBackend(Backend):
    @property
    def state_dir(self) -> Path:
        path = Path(settings.VAR_DIR) / "local" / self.cluster.name / "pods"
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def node_name(self) -> str:
        return self.cluster.config.get("node_name") or socket.gethostname()

    def workload_dir(self, workload_id: int) -> Path:
        path = Path(settings.VAR_DIR) / "workloads" / str(workload_id)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def isolation(self) -> sandbox.Isolation:
        """Whether this machine sandboxes pods; `sandbox: false` in the config turns it off.
        Kept in var/ for the pages: the web process may run as another user than the
        worker that starts the pods, and only the worker's answer counts."""
        isolation = self._probe()
        limits = self.limits_support()
        report = {
            "available": isolation.available,
            "reason": isolation.reason,
            "at": time.time(),
            "for": self._report_for(),
            "limits": {"available": limits.available, "version": limits.version,
                       "reason": limits.reason},
        }  # fmt: skip
        _write_atomic(self._isolation_path, json.dumps(report))
        return isolation

    def limits_support(self) -> cgroups.Support:
        """Whether this process can give pods cgroup limits here (cgroups.probe)."""
        return cgroups.probe(settings.VAR_DIR)

    def reported_limits(self) -> cgroups.Support:
        """The worker's last answer on limits (beside its isolation's), or this process's."""
        report = self._isolation_report()
        if report is None or not isinstance(report.get("limits"), dict):
            return self.limits_support()
        limits = report["limits"]
        return cgroups.Support(bool(limits["available"]), int(limits["version"]),
                               str(limits["reason"]))  # fmt: skip

    def _report_for(self) -> list:
        """What a report answers for: this cluster record and its sandbox settings. A
        report left by a cluster of the same name, or before the admin changed them, is
        not this cluster's answer."""
        return [self.cluster.pk, self._sandbox_enabled, self._egress]

    def _isolation_report(self) -> dict | None:
        """The worker's report for this cluster as it is configured now, unless it is
        older than ISOLATION_REPORT_TTL_S."""
        try:
            report = json.loads(self._isolation_path.read_text())
        except (OSError, ValueError):
            return None
        fresh = (
            isinstance(report, dict)
            and report.get("for") == self._report_for()
            and time.time() - report.get("at", 0) <= ISOLATION_REPORT_TTL_S
        )
        return report if fresh else None

    def reported_isolation(self) -> sandbox.Isolation:
        """The worker's last answer (it probes on every inventory sync and pod start), or,
        when it has given none lately, this process's own."""
        if not self._sandbox_enabled:
            return self._probe()
        report = self._isolation_report()
        if report is None:
            return self._probe()
        return sandbox.Isolation(bool(report["available"]), str(report["reason"]))

    def _probe(self) -> sandbox.Isolation:
        """This process's answer. Egress turned on needs slirp4netns: without it, pods
        are not run with less than the admin chose, nor without isolation."""
        isolation = sandbox.probe(enabled=self._sandbox_enabled)
        if isolation.available and self._egress and shutil.which("slirp4netns") is None:
            return sandbox.Isolation(False, sandbox.NO_EGRESS)
        return isolation

    @property
    def _sandbox_enabled(self) -> bool:
        return self.cluster.config.get("sandbox", True) is not False

    @property
    def _egress(self) -> bool:
        """`egress: true` in the config: pods reach the network outside (not this machine's
        loopback); off by default."""
        return self.cluster.config.get("egress", False) is True

    @property
    def _isolation_path(self) -> Path:
        return self.state_dir.parent / "isolation.json"

    # --- MPS ------------------------------------------------------------------------------
    @property
    def mps(self) -> MpsDaemons:
        """This cluster's MPS daemons: under /run where the worker may write there (a pipe's
        socket path must be short), one folder per var/; else under var/."""
        base = self.state_dir.parent / "mps"
        if os.access(MPS_RUN_DIR.parent, os.W_OK):
            digest = hashlib.sha256(str(base).encode()).hexdigest()[:12]
            base = MPS_RUN_DIR / f"mps-{digest}"
        return MpsDaemons(
            base, executable=self.cluster.config.get("mps_control", "nvidia-cuda-mps-control")
        )

    def _ensure_mps(self, spec: PodSpec) -> None:
        """A sharer starts only once its GPU's MPS daemon runs: without it, its limits would
        not hold. No daemon can run here at all: the pod fails, saying why."""
        if spec.mps is None:
            return
        device = mps_device(spec)
        if self.mps.pid(device) is not None:
            return
        try:
            self.mps.start(device, device)
        except MpsError as exc:
            if "not installed" in str(exc):
                raise PodSpecInvalid(f"its GPU share cannot be enforced here: {exc}") from exc
            raise BackendError(f"the MPS daemon of GPU {device}: {exc}") from exc

    def reconcile(self, desired: list[PodSpec], **kwargs: Any) -> ReconcileReport:
        """As every backend, then the MPS daemons: one for each GPU a pod of this cluster
        still shares (started again if it died), none for the others."""
        report = super().reconcile(desired, **kwargs)
        enforced = [as_enforced(s, self.cluster.config) for s in desired]
        wanted = {mps_device(s): mps_device(s) for s in enforced if s.mps is not None}
        for path in sorted(self.state_dir.glob("*.json")):
            record = self._read(path) or {}
            if record.get("mps_device"):
                wanted[record["mps_device"]] = record["mps_device"]
        for device, error in self.mps.sync(wanted).items():
            report.errors.append(f"MPS daemon of GPU {device}: {error}")
        return report

    # --- inventory -------------------------------------------------------------------------
    def test_connection(self) -> str:
        gpus = local_gpus()
        return f"Local machine {self.node_name}: {os.cpu_count()} CPUs, {len(gpus)} GPUs"

    def mig_sync(self, wanted: MigLayout) -> tuple[dict[MigKey, str], list[str]]:
        """This machine's MIG-mode GPUs, through NVML (clusters/agent/mig.py)."""
        return local_mig_sync(wanted)

    def list_inventory(self) -> list[NodeInfo]:
        self.isolation()  # the worker's answer, for the clusters page
        labels = {self.cluster.node_pool_label: self.cluster.config.get("pool", "local")}
        labels.update(self.cluster.config.get("labels", {}))
        return [
            NodeInfo(
                name=self.node_name,
                labels=labels,
                cpu_cores=float(os.cpu_count() or 1),
                memory_mib=_memory_mib(),
                schedulable=True,
                gpus=tuple(local_gpus()),
            )
        ]

    # --- pods ------------------------------------------------------------------------------
    def _record_path(self, name: str) -> Path:
        return self.state_dir / f"{name}.json"

    def _read(self, path: Path) -> dict | None:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def _write(self, record: dict) -> None:
        _write_atomic(self._record_path(record["name"]), json.dumps(record))

    def pod_statuses(self) -> dict[str, PodStatus]:
        statuses = {}
        for path in sorted(self.state_dir.glob("*.json")):
            record = self._resolve(self._read(path))
            if record is not None:
                statuses[record["name"]] = self._status(record)
        return statuses

    def _status(self, record: dict) -> PodStatus:
        status = PodStatus(
            name=record["name"],
            namespace=record["namespace"],
            workload_id=record["workload_id"],
            pod_index=record["pod_index"],
            endpoint=record.get("endpoint", ""),
            ports=dict(record.get("ports") or {}),
            # Empty while the process is being started: nothing to find again yet.
            backend_ref="" if record["pid"] is None else f"{record['pid']}:{record['start_time']}",
            node_name=self.node_name,
            terminating=bool(record.get("terminating_since")),
        )
        if record["pid"] is None:
            return status  # being started: Pending
        if _alive(record["pid"], record["start_time"]):
            status.phase = PodPhase.RUNNING
            return status
        code = _read_exit_code(Path(record["exit_file"]))
        if code is None:
            # Killed with the wrapper (SIGKILL, a reboot): no exit code was written.
            status.phase, status.exit_code = PodPhase.FAILED, 137
            status.message = "The process was killed."
        else:
            status.exit_code = code
            status.phase = PodPhase.SUCCEEDED if code == 0 else PodPhase.FAILED
        if self._oom_kills_once_ended(record) and status.phase == PodPhase.FAILED:
            memory = (record.get("limits") or {}).get("memory_mib", 0)
            status.reason = cgroups.MEMORY_OOM_REASON
            status.message = (
                f"Pod {record['pod_index']} was killed for exceeding its memory limit of "
                f"{memory} MiB ({cgroups.MEMORY_OOM_REASON})."
            )
        return status

    def _oom_kills_once_ended(self, record: dict) -> int:
        """A finished pod's count of processes its memory limit killed. Its cgroup goes once
        nothing is left in it; the count stays in its record."""
        if record.get("oom_kills") is not None:
            return int(record["oom_kills"])
        group = _group(record)
        if group is None:
            return 0
        kills = group.oom_kills()
        if group.exists() and not group.pids() and group.remove():
            record["oom_kills"] = kills
            self._write(record)
        return kills

    def ensure_pod(self, spec: PodSpec) -> PodStatus:
        record = self._resolve(self._read(self._record_path(spec.name)))
        if record is None:
            with self._spawn_claim(spec.name) as claimed:
                if not claimed:  # another pass of this cluster is starting it right now
                    return PodStatus(spec.name, spec.namespace, spec.workload_id, spec.pod_index)
                record = self._resolve(self._read(self._record_path(spec.name)))
                if record is None:
                    return self._status(self._spawn(spec))
        status = self._status(record)
        if status.phase == PodPhase.RUNNING:
            self._ensure_relays(record)  # a relay that died (killed, OOM) is started again
        return status

    @contextlib.contextmanager
    def _spawn_claim(self, name: str) -> Iterator[bool]:
        """Whether this pass may start the pod: one claim file per pod name, made
        exclusively, so that two passes of one cluster at once (two worker children) never
        both start it. A claim left by a crash is taken over after SPAWN_GRACE_S."""
        path = self.state_dir / f"{name}.claim"
        for _ in range(2):
            try:
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            except FileExistsError:
                with contextlib.suppress(FileNotFoundError):
                    if time.time() - path.stat().st_mtime > SPAWN_GRACE_S:
                        path.unlink()
                        continue
                yield False
                return
            try:
                yield True
            finally:
                path.unlink(missing_ok=True)
            return
        yield False

    def _resolve(self, record: dict | None) -> dict | None:
        """A record without a pid was written just before a spawn that a crash interrupted:
        find the process in its cgroup (or, without one, by the token in its environment),
        so it is never started twice. No such process and no exit code after a while: it
        never started; forget it."""
        if record is None or record["pid"] is not None:
            return record
        pid = _session_leader(_members(record))
        if pid is not None:
            record.update(pid=pid, start_time=_proc_start_time(pid) or "gone")
        elif _read_exit_code(Path(record["exit_file"])) is not None:
            record.update(pid=0, start_time="gone")  # it ran, and finished
        elif time.time() - record["written_at"] > SPAWN_GRACE_S:
            self._record_path(record["name"]).unlink(missing_ok=True)
            return None
        else:
            return record  # being spawned by another worker right now
        self._write(record)
        return record

    def _spawn(self, spec: PodSpec) -> dict:
        """Start the pod's process: 1. sandbox or refusal, 2. environment and ports,
        3. command, 4. record it, 5. start it."""
        spec = as_enforced(spec, self.cluster.config)
        isolation = self.isolation()
        if not isolation.available and not spec.submitted_by_admin:
            raise PodSpecInvalid(
                f"this machine cannot isolate pods ({isolation.reason}), so it runs only "
                "platform administrators' work"
            )
        workdir = self.workload_dir(spec.workload_id)
        self._ensure_mps(spec)
        socket_dir = self._socket_dir(spec.name)
        socket_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        env, endpoint, ports = self._environment(spec, socket_dir, sandboxed=isolation.available)
        command = [expand_vars(part, env) for part in (*spec.command, *spec.args)]
        if not command:
            raise PodSpecInvalid("it has no command to run on the local machine")
        argv = self._argv(spec, command, socket_dir, sandboxed=isolation.available)
        group, no_limits = self._new_group(spec.name)
        relay, door = self._forwards(spec, ports) if isolation.available else ([], [])
        exit_file = self.state_dir / f"{spec.name}.exit"  # the portal's, out of the pod's reach
        exit_file.unlink(missing_ok=True)
        record = {
            "name": spec.name,
            "namespace": spec.namespace,
            "workload_id": spec.workload_id,
            "pod_index": spec.pod_index,
            "pid": None,
            "start_time": None,
            "token": env["GPUPOOL_POD_TOKEN"],
            "written_at": time.time(),
            "exit_file": str(exit_file),
            "log": str(workdir / f"pod-{spec.pod_index}.log"),
            "endpoint": endpoint,
            "ports": ports,
            "command": command,
            "argv": argv,
            "terminating_since": None,
            "sandboxed": isolation.available,
            # What the relays forward (relay.py), in the gang's namespace and out of it.
            "relay": relay,
            "door": door,
            # Its GPU's MPS daemon runs while this record lasts (the pod may still be
            # shutting down): a GPU leaves MPS mode only once its last sharer is gone.
            "mps_device": mps_device(spec) if spec.mps is not None else None,
            # Its cgroup (cgroups.py): its limits, and which processes are the pod's.
            "cgroup": group.as_dict() if group else None,
            "limits": (
                cgroups.limits_of(
                    spec.memory_mib, spec.cpu, self.cluster.config, spec.pids_max
                ).as_dict()
                if group
                else None
            ),
            "no_limits": no_limits,
        }
        self._write(record)  # first: a crash between spawn and record must not lose it
        return self._start(record, env, workdir)

    def _new_group(self, name: str) -> tuple[cgroups.Group | None, str]:
        """The pod's cgroup-to-be, one per pod under the installation's parent; or none,
        and why (the machine has no controllers, the worker is not root)."""
        support = self.limits_support()
        hierarchy = cgroups.find_hierarchy() if support.available else None
        if hierarchy is None:
            return None, support.reason or cgroups.NO_CONTROLLERS
        parent = cgroups.parent_name(settings.VAR_DIR)
        return cgroups.Group.under(hierarchy, parent, f"c{self.cluster.pk}-{name}"), ""

    def _argv(
        self, spec: PodSpec, command: list[str], socket_dir: Path, *, sandboxed: bool
    ) -> list[str]:
        """The command as it runs: in a sandbox, as the pod's own user, where the machine
        can. Its data volumes are checked either way."""
        mounts = (*self._data_mounts(spec), sandbox.Mount(str(socket_dir), sandbox.SOCKET_DIR))
        if spec.mps is not None:
            pipe = str(self.mps.pipe_dir(mps_device(spec)))
            mounts = (*mounts, sandbox.Mount(pipe, pipe))
        if not sandboxed:
            return command
        workdir = self.workload_dir(spec.workload_id)
        uid, gid = pod_uid(spec.workload_id), sandbox.project_gid(spec.project_id)
        mounts = (*mounts, self._passwd_mount(spec.name, uid, gid, workdir))
        if self._egress:
            mounts = (*mounts, self._resolv_mount())
        _own(workdir, uid, gid, 0o700)
        # The pod's user creates its socket; the portal's group (var/'s) connects to it.
        _own(socket_dir, uid, self._portal_gid, 0o2770)
        return sandbox.in_netns(self._netns_path(spec.workload_id), sandbox.wrap(
            command, uid=uid, gid=gid, workdir=workdir, mounts=mounts, host_ipc=bool(spec.mps)
        ))  # fmt: skip

    @property
    def _portal_gid(self) -> int:
        return Path(settings.VAR_DIR).stat().st_gid

    def _netns_path(self, workload_id: int) -> Path:
        """Where the network namespace of a workload's pods (its gang) is kept."""
        return self.state_dir.parent / "netns" / str(workload_id)

    def _forwards(self, spec: PodSpec, ports: dict[str, str]) -> tuple[list[str], list[str]]:
        """What the pod's relays forward (relay.py): in its namespace, each port's socket to
        the port, and its checkpoint door's port to the door's socket; out of it, that
        socket to the portal. The sockets' folder is made for the portal's group alone
        (root's: the pod neither sees nor replaces a socket there)."""
        relay = [
            f"{ports[port.name].removeprefix('unix:')}>tcp:{netns_port(spec.pod_index, number)}"
            for number, port in enumerate(spec.ports)
        ]
        door = []
        if CHECKPOINT_URL in spec.env:
            socket_path = self._ports_dir(spec.name) / "portal.sock"
            relay.append(f"tcp:{netns_port(spec.pod_index, PORTS_MAX)}>unix:{socket_path}")
            door.append(f"unix:{socket_path}>door:{spec.env[CHECKPOINT_URL]}")
        if relay:
            folder = self._ports_dir(spec.name)
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            _own(folder, os.geteuid(), self._portal_gid, 0o2750)  # sockets take the group
        return relay, door

    def _ensure_relays(self, record: dict) -> list[subprocess.Popen[bytes]]:
        """The pod's relays, started unless they run: in its namespace (`relay`) and out
        of it (`door`), each returned once it listens. Each serves until the pod's wrapper
        is gone; they are told which process that is on stdin (`_watch`), so that they may
        start before the pod (no pid in the record yet): what the pod dials is there from
        its first step."""
        started = []
        for kind in ("relay", "door"):
            pid, since = record.get(f"{kind}_pid"), record.get(f"{kind}_start")
            if not record.get(kind) or (pid and _alive(pid, since)):
                continue
            argv = [sys.executable, "-I", RELAY, "-", *record[kind]]
            if kind == "relay":
                argv = sandbox.in_netns(self._netns_path(record["workload_id"]), argv)
            with _open_log(Path(record["log"])) as out:
                try:
                    proc = subprocess.Popen(
                        argv,
                        env={},
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=out,  # a relay that fails says so in the pod's log
                        start_new_session=True,
                    )
                except OSError as exc:
                    log.warning("cannot start the %s of %s: %s", kind, record["name"], exc)
                    continue
            _CHILDREN[proc.pid] = proc
            assert proc.stdout is not None
            with proc.stdout:
                if proc.stdout.readline() != b"ready\n":  # b"": it failed (its log says why)
                    log.warning("the %s of %s did not start", kind, record["name"])
            record.update({f"{kind}_pid": proc.pid, f"{kind}_start": _proc_start_time(proc.pid)})
            started.append(proc)
        if started:
            self._write(record)
        if started and record["pid"] is not None:
            _watch(started, f"{record['pid']}:{record['start_time']}")
        return started

    def _start(self, record: dict, env: dict[str, str], workdir: Path) -> dict:
        wrapper = [sys.executable, "-I", WRAPPER]
        if record["sandboxed"]:
            wrapper.append("--sandboxed")
        group = _group(record)
        try:
            if record["sandboxed"]:
                # After the record: a namespace is removed only where no record names its gang.
                sandbox.netns_create(self._netns_path(record["workload_id"]), egress=self._egress)
            if group is not None:
                group.create(cgroups.Limits(**record["limits"]))
                # The wrapper enters it before the pod's command starts: nothing escapes it.
                wrapper += [arg for path in group.procs_files() for arg in ("--cgroup", path)]
        except sandbox.NetnsError as exc:
            self._abandon(record, group)
            raise BackendError(f"cannot make the pod's network namespace: {exc}") from exc
        except cgroups.CgroupError as exc:
            self._abandon(record, group)
            raise BackendError(str(exc)) from exc
        relays = self._ensure_relays(record)  # listening before the pod's first step
        with _open_log(Path(record["log"])) as out:
            try:
                proc = subprocess.Popen(
                    [*wrapper, record["exit_file"], *record["argv"]],
                    cwd=workdir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: stop signals reach all
                )
            except OSError as exc:
                _watch(relays, "")  # nothing to watch: they go
                self._abandon(record, group)
                raise BackendError(f"cannot start {shlex.join(record['command'])}: {exc}") from exc
        _CHILDREN[proc.pid] = proc
        record.update(pid=proc.pid, start_time=_proc_start_time(proc.pid) or "gone")
        self._write(record)
        _watch(relays, f"{record['pid']}:{record['start_time']}")
        how = "sandboxed" if record["sandboxed"] else "NOT sandboxed"
        command = shlex.join(record["command"])
        log.info("started %s as pid %s, %s: %s", record["name"], proc.pid, how, command)
        return record

    def _abandon(self, record: dict, group: cgroups.Group | None) -> None:
        """A start that failed leaves nothing: its record, its cgroup, and its gang's
        namespace unless another pod of the gang has a record."""
        self._record_path(record["name"]).unlink(missing_ok=True)
        if group is not None:
            group.remove()
        self._drop_netns(record["workload_id"])

    def _passwd_mount(self, name: str, uid: int, gid: int, workdir: Path) -> sandbox.Mount:
        """The machine's /etc/passwd plus a line naming the pod's user, bound read-only over
        /etc/passwd in the sandbox: sshd, ssh-keygen and `whoami` look the user up by uid.
        Written by the portal, out of the pod's reach."""
        path = self.state_dir / f"{name}.passwd"
        _write_atomic(path, sandbox.passwd_text(uid, gid, str(workdir)))
        path.chmod(0o644)
        return sandbox.Mount(str(path), "/etc/passwd", read_only=True)

    def _resolv_mount(self) -> sandbox.Mount:
        """DNS through slirp4netns's forwarder: the machine's resolver may be on its own
        loopback (systemd-resolved), out of the pod's reach."""
        path = self.state_dir.parent / "resolv.conf"
        _write_atomic(path, f"nameserver {sandbox.EGRESS_DNS}\n")
        path.chmod(0o644)
        return sandbox.Mount(str(path), "/etc/resolv.conf", read_only=True)

    def _socket_dir(self, name: str) -> Path:
        """The pod's socket folder: only the pod's user and the portal's group enter it.

        Under /run when the worker may write there: a socket's path must fit in 107 bytes,
        which a deep var/ would not leave. One folder per var/ (a digest of its path), so
        that two portals on one machine never meet."""
        return self._sockets_base / name

    def _ports_dir(self, name: str) -> Path:
        """The relay's sockets for the pod's ports (a pod's name has no dot)."""
        return self._sockets_base / f"{name}.ports"

    @property
    def _sockets_base(self) -> Path:
        base = self.state_dir.parent / "sockets"
        if os.access(SOCKETS_RUN_DIR.parent, os.W_OK):
            digest = hashlib.sha256(str(base).encode()).hexdigest()[:12]
            base = SOCKETS_RUN_DIR / digest
            SOCKETS_RUN_DIR.mkdir(mode=0o755, exist_ok=True)
        return base

    def _data_mounts(self, spec: PodSpec) -> tuple[sandbox.Mount, ...]:
        """Volumes that name a directory of this machine (a workspace's data volume), and an
        absolute checkpoint directory, each inside one of the cluster's data-volume roots:
        anything else is refused. (A relative checkpoint directory is in the work folder.)"""
        mounts = []
        for volume in spec.volumes:
            if not volume.claim.startswith("/"):
                raise PodSpecInvalid(f"volume {volume.name}: a PVC needs a Kubernetes cluster")
            path = self._under_roots(f"volume {volume.name}", volume.claim)
            mounts.append(sandbox.Mount(path, volume.mount_path, volume.read_only))
        if spec.checkpoint_dir.startswith("/"):
            path = self._under_roots("the checkpoint directory", spec.checkpoint_dir)
            mounts.append(sandbox.Mount(path, spec.checkpoint_dir))
        return tuple(mounts)

    def _under_roots(self, what: str, directory: str) -> str:
        path = Path(os.path.realpath(directory))
        roots = [Path(root) for root in self.cluster.data_volume_roots]
        if not path.is_dir() or not any(path.is_relative_to(root) for root in roots):
            raise PodSpecInvalid(
                f"{what}: {directory} is not a directory under this cluster's data-volume roots"
            )
        return str(path)

    def _environment(
        self, spec: PodSpec, socket_dir: Path, *, sandboxed: bool
    ) -> tuple[dict[str, str], str, dict[str, str]]:
        """Built from nothing: the workload's variables, GPUPool's, a PATH and a locale.
        Also returns the pod's endpoint (its tool's) and where each port answers."""
        workdir = self.workload_dir(spec.workload_id)
        env = {
            **BASE_ENV,
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(workdir),
        }
        env.update({k: str(v) for k, v in spec.env.items()})
        gpus = spec.gpu_indices if spec.shared_gpu_index is None else (spec.shared_gpu_index,)
        # An empty CUDA_VISIBLE_DEVICES hides every GPU from a CPU-only pod. Indices are
        # NVML's, which follow the PCI bus order; CUDA's default order (fastest first) may not.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpus)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        if spec.mig_device:
            env["CUDA_VISIBLE_DEVICES"] = spec.mig_device  # the MIG instance, by its UUID
        if spec.mps is not None:
            # The daemon sees only this GPU; the sharer names it so that the server agrees.
            device = mps_device(spec)
            env["CUDA_VISIBLE_DEVICES"] = client_visible_devices(device)
            env.update(mps_env(spec.mps, str(self.mps.pipe_dir(device))))
        env["GPUPOOL_POD_TOKEN"] = secrets.token_hex(12)
        # Sandboxed: the gang's own loopback, which the relay reaches; else this machine's.
        env["GPUPOOL_BIND_HOST"] = "127.0.0.1"
        endpoint = ""
        ports: dict[str, str] = {}
        for number, port in enumerate(spec.ports):
            if sandboxed:
                listen = netns_port(spec.pod_index, number)
                ports[port.name] = f"unix:{self._ports_dir(spec.name) / port.name}.sock"
            else:
                listen = _free_port()
                ports[port.name] = f"127.0.0.1:{listen}"
            env[f"GPUPOOL_PORT_{port.name.upper().replace('-', '_')}"] = str(listen)
            if number == 0:
                env["GPUPOOL_PORT"] = str(listen)
                endpoint = ports[port.name]
        if sandboxed and CHECKPOINT_URL in env:  # the portal, by the pod's door (relay.py)
            path = urlsplit(env[CHECKPOINT_URL]).path
            env[CHECKPOINT_URL] = f"http://127.0.0.1:{netns_port(spec.pod_index, PORTS_MAX)}{path}"
        if spec.ports:
            # A tool that listens here is reached by the portal alone (see _socket_dir).
            inside = sandbox.SOCKET_DIR if sandboxed else str(socket_dir)
            env["GPUPOOL_SOCKET"] = f"{inside}/{SOCKET_NAME}"
            if any("$(GPUPOOL_SOCKET)" in part for part in (*spec.command, *spec.args)):
                endpoint = f"unix:{socket_dir / SOCKET_NAME}"
        return env, endpoint, ports

    def delete_pod(self, status: PodStatus, *, grace_period_s: int) -> bool:
        """SIGTERM the pod's processes, SIGKILL them once the grace period is over.

        The pod's processes are its process group while the wrapper lives, and every
        process in its cgroup: also what the command left running after it exited, or
        started in a session of its own (a daemon holding a GPU). Nothing outside it is
        ever signalled, whatever its environment says. (A pod without a cgroup, on a
        machine that has none: the processes that carry its token in their environment.)
        The cgroup goes with the last of them."""
        path = self._record_path(status.name)
        record = self._resolve(self._read(path))
        if record is None:
            self._drop_netns(status.workload_id)  # a spawn that never happened made one
            return True
        if record["pid"] is None:
            return False  # still being started: stop it on the next pass
        pid, start = record["pid"], record["start_time"]
        if _alive(pid, start) or _members(record):
            if not record.get("terminating_since"):
                record["terminating_since"] = time.time()
                record["signalled"] = _signal_pod(pid, start, record, signal.SIGTERM)
                self._write(record)
            else:
                self._signal_late_comers(record)
            if time.time() - record["terminating_since"] >= grace_period_s:
                _signal_pod(pid, start, record, signal.SIGKILL)
            if not _wait_gone(pid, start, record, timeout=0.5):
                return False
        if (group := _group(record)) is not None and not group.remove():
            return False  # a process that just left it: the next pass
        for kind in ("relay", "door"):
            pid, started = record.get(f"{kind}_pid"), record.get(f"{kind}_start")
            if pid and _alive(pid, started):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)  # it would go within a second
        path.unlink(missing_ok=True)
        Path(record["exit_file"]).unlink(missing_ok=True)
        self._record_path(status.name).with_suffix(".passwd").unlink(missing_ok=True)
        shutil.rmtree(self._socket_dir(status.name), ignore_errors=True)
        shutil.rmtree(self._ports_dir(status.name), ignore_errors=True)
        self._drop_netns(record["workload_id"])
        return True

    def _drop_netns(self, workload_id: int) -> None:
        """The gang's namespace goes with its last pod."""
        for path in self.state_dir.glob("*.json"):
            if (self._read(path) or {}).get("workload_id") == workload_id:
                return
        sandbox.netns_remove(self._netns_path(workload_id))

    def _signal_late_comers(self, record: dict) -> None:
        """SIGTERM what started after the first one: a pod stopped while its sandbox was
        being built gets its command only then (a fork loses the signals its parent had
        pending), and the command must not wait out the grace period for its SIGKILL."""
        signalled = set(record.get("signalled") or ())
        late = [pid for pid in _members(record) if pid not in signalled]
        for pid in late:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        if late:
            record["signalled"] = sorted(signalled | set(late))
            self._write(record)

    def stop_all(self, *, grace_period_s: int) -> int:
        """Stop every pod of this cluster and wait until each is gone: SIGTERM, SIGKILL after
        the grace period. For shutting the portal down (the demo); a worker restart keeps
        them instead. With their records gone, the next reconcile requeues their workloads
        as lost pods, so they start again when the portal does. Returns how many stopped."""
        pending = self.pod_statuses()
        count = len(pending)
        while pending:
            for name, status in list(pending.items()):
                if self.delete_pod(status, grace_period_s=grace_period_s):
                    del pending[name]
            if pending:
                time.sleep(0.2)
        return count

    def pod_limits(self, name: str) -> dict[str, Any] | None:
        """What the pod runs under, for its workload's page: its cgroup's limits
        (`limited`), or why it has none; None when no such pod is here."""
        record = self._read(self._record_path(name))
        if record is None:
            return None
        if record.get("cgroup") and record.get("limits"):
            return {"limited": True, "version": record["cgroup"]["version"], **record["limits"]}
        return {"limited": False, "reason": record.get("no_limits") or cgroups.NO_CONTROLLERS}

    def pod_logs(self, name: str, namespace: str, *, tail_lines: int = 500) -> str:
        # Named gp-<workload>-<pod>; the log outlives the pod's record.
        _, workload_id, pod_index = name.rsplit("-", 2)
        log_path = Path(settings.VAR_DIR) / "workloads" / workload_id / f"pod-{pod_index}.log"
        return _tail(log_path, tail_lines)


def _watch(relays: list[subprocess.Popen[bytes]], watch: str) -> None:
    """Tell relays started before their pod which process is it (`pid:start`; "": none)."""
    for relay in relays:
        assert relay.stdin is not None
        with contextlib.suppress(OSError), relay.stdin:
            relay.stdin.write(f"{watch}\n".encode())


def netns_port(pod_index: int, number: int) -> int:
    """The port a sandboxed pod's declared port `number` listens on in its namespace."""
    first, size = NETNS_PORTS
    return first + (pod_index * (PORTS_MAX + 1) + number) % size


def _pids_with_token(token: str) -> list[int]:
    """Live processes whose environment carries this pod's token (a zombie has none)."""
    needle = f"GPUPOOL_POD_TOKEN={token}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _find_by_token(token: str) -> int | None:
    """The session leader (the wrapper) whose environment carries this pod's token."""
    return _session_leader(_pids_with_token(token))


def _session_leader(pids: list[int]) -> int | None:
    """The session leader among these processes: the pod's wrapper."""
    for pid in pids:
        with contextlib.suppress(OSError):
            if os.getsid(pid) == pid:
                return pid
    return None


def _group(record: dict) -> cgroups.Group | None:
    data = record.get("cgroup")
    return cgroups.Group.from_dict(data) if data else None


def _members(record: dict) -> list[int]:
    """The pod's live processes: its cgroup's members; a pod without a cgroup (none on
    this machine), those with its token in their environment, and for a sandboxed pod only
    those that run as its workload's user (clusters/pod_users.py): a pod may copy another's
    token into its environment, never its uid, so it can pass itself off as no pod but
    one of its own workload's (its wrapper and bwrap run as the worker's user, which no pod
    can be)."""
    group = _group(record)
    if group is not None:
        return group.pids()
    pids = _pids_with_token(record["token"])
    if record.get("sandboxed"):  # its wrapper runs as the worker's user, then the pod as its own
        users = {pod_uid(int(record["workload_id"])), os.geteuid()}
        pids = [pid for pid in pids if real_uid(pid) in users]
    return pids


def _signal_pod(pid: int, start_time: str, record: dict, sig: signal.Signals) -> list[int]:
    """The wrapper's group while the wrapper lives (its pid cannot name another group
    then), and each of the pod's processes (`_members`). Returns those processes."""
    holders = _members(record)
    if _alive(pid, start_time):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
    for other in holders:
        with contextlib.suppress(ProcessLookupError):
            os.kill(other, sig)
    return holders


def _wait_gone(pid: int, start_time: str, record: dict, *, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid, start_time) or _members(record):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # atomic: a reader never sees half a file


def _own(path: Path, uid: int, gid: int, mode: int) -> None:
    os.chown(path, uid, gid)
    path.chmod(mode)


def _open_log(path: Path) -> BinaryIO:
    """The pod's log, appended to as the portal (root): never through a link the pod's user
    put in its folder, never a FIFO (it would hang the worker), never a file that user owns
    or linked (it would learn what root wrote). Anything else there is replaced."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    for _ in range(2):
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENXIO):
                raise BackendError(f"cannot open the pod's log {path}: {exc}") from exc
        else:
            if _portal_file(fd):
                os.set_blocking(fd, True)
                return os.fdopen(fd, "ab")
            os.close(fd)
        path.unlink(missing_ok=True)  # what the pod's user put there: start a fresh log
    raise BackendError(f"cannot open the pod's log {path}: something keeps replacing it")


def _portal_file(fd: int) -> bool:
    info = os.fstat(fd)
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and info.st_nlink == 1


def _read_exit_code(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _tail(path: Path, lines: int) -> str:
    try:
        # No link the pod put in its folder leads the portal into another file.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        with open(fd, "rb") as handle:
            if not _portal_file(fd):
                return ""
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 256 * 1024))
            data = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def _memory_mib() -> int:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0
    return int(pages * size // (1024 * 1024))
