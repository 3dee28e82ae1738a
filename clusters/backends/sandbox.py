"""Tenant isolation for local pods: bubblewrap, then an unprivileged user of the pod's own.

Why bubblewrap (Debian's `bubblewrap`, Flatpak's sandbox) and not bare `unshare`: it builds
the pod's filesystem from nothing, out of explicit binds, in one small audited program. A pod
sees /usr, the Python it runs on (read-only), a few files of /etc, its own folder, its data
volume and a socket folder; nothing else of this machine: not the portal's var/ (database,
credentials, other pods' folders and logs), not its settings or virtualenv for writing. It
gets a PID namespace with a /proc of its own, so no other process's environment
(/proc/<pid>/environ) can be read, and private IPC, UTS, /tmp and /dev.

Its network is its gang's own: one network namespace per workload (`netns_create`), kept
by a bind mount while the workload has pods, shared by its pods (peers meet on 127.0.0.1
for rendezvous), with only a loopback of its own: no route to this machine's loopback (the
portal, PostgreSQL, Redis, other pods' ports) nor anywhere else. Its declared ports are
reached by the portal alone, through unix sockets a relay serves from inside the namespace
(clusters/backends/relay.py). Egress is the cluster admin's choice (`egress: true` in the
local cluster's config): slirp4netns then gives the namespace a way out through a user-mode
NAT (`egress_start`), with this machine's loopback still out of reach.

The worker runs bwrap as root *without* a user namespace: a user namespace would map the
pod back onto root outside, and root-owned 0600 files would be its own. Instead the pod drops
to a kernel uid of its own (`UID_BASE + workload id`, no passwd entry needed, like systemd's
DynamicUser) and its project's gid with `setpriv`, clearing every capability and the
bounding set: outside the sandbox too it is nobody the machine knows. Files it writes are its
own; a data volume is shared inside a project through the project's group.

Sandboxing needs root (to switch users and make network namespaces), `bwrap`, and
`setpriv`, `unshare` and `nsenter` (util-linux). Where one is missing the local cluster
says so and runs only platform admins' work, never others' unisolated (`probe`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from clusters.backends.relay import start_time
from clusters.pod_users import UID_BASE

GID_BASE = 1_500_000_000  # + project id: one group per project (shared data volumes)
# Inside the sandbox: where the pod finds its socket folder (the host path stays hidden).
SOCKET_DIR = "/run/gpupool"
# What of /etc a program needs to run (loader, users, DNS, TLS roots, time zone, MIME).
ETC_FILES = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "ssl", "ca-certificates",
    "resolv.conf", "hosts", "host.conf", "nsswitch.conf", "gai.conf", "passwd", "group",
    "localtime", "timezone", "mime.types", "protocols", "services", "os-release", "python3",
    "matplotlibrc", "fonts",
)  # fmt: skip
PROBE_TTL_S = 300.0
REQUIRED = (("bwrap", "bubblewrap"), ("setpriv", "util-linux"), ("unshare", "util-linux"),
            ("nsenter", "util-linux"), ("umount", "mount"))  # fmt: skip
# Run by `unshare --net`, in the new namespace: its loopback up (it starts down), with
# ioctl(SIOCSIFFLAGS) as `ip link set lo up` does, so that iproute2 is not needed.
LOOPBACK_UP = (
    "import fcntl, socket, struct\n"
    "GET, SET, UP = 0x8913, 0x8914, 0x1\n"
    "with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:\n"
    "    got = fcntl.ioctl(s, GET, struct.pack('16sH22x', b'lo', 0))\n"
    "    flags = struct.unpack('16sH', got[:18])[1]\n"
    "    fcntl.ioctl(s, SET, struct.pack('16sH22x', b'lo', flags | UP))\n"
)
# The first thing run inside: bwrap ignores stop signals, blocked (the wrapper's
# --sandboxed), so that SIGTERM to the pod's group reaches the command while bwrap lives on
# to report its exit; the command gets them back at their defaults, and one sent before it
# started (queued while blocked) is delivered now.
EXEC_WITH_DEFAULT_SIGNALS = (
    "import os, signal, sys\n"
    "stops = (signal.SIGTERM, signal.SIGINT)\n"
    "for stop in stops: signal.signal(stop, signal.SIG_DFL)\n"
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)\n"
    "try: os.execvp(sys.argv[1], sys.argv[1:])\n"
    "except OSError as exc:\n"
    "    print(f'gpupool: cannot run {sys.argv[1]}: {exc}', file=sys.stderr, flush=True)\n"
    "    os._exit(127)\n"
)


@dataclass(frozen=True, slots=True)
class Isolation:
    """Whether this machine can sandbox local pods; `reason` says why not, for a person."""

    available: bool
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Mount:
    source: str
    target: str
    read_only: bool = False


_probed: tuple[float, Isolation] | None = None
_probe_lock = threading.Lock()


def probe(*, enabled: bool = True) -> Isolation:
    """Can pods be sandboxed here? Tried for real (a sandbox that runs `true` as an
    unprivileged user), remembered for a few minutes. `enabled`: the cluster's config."""
    global _probed  # noqa: PLW0603 - one answer per process, refreshed after PROBE_TTL_S
    if not enabled:
        return Isolation(False, "sandboxing is turned off in the cluster's configuration")
    with _probe_lock:
        if _probed is None or time.monotonic() - _probed[0] > PROBE_TTL_S:
            _probed = (time.monotonic(), _try_sandbox())
        return _probed[1]


def _try_sandbox() -> Isolation:
    if os.geteuid() != 0:
        return Isolation(False, "the worker does not run as root, so it cannot run pods as "
                                "users of their own")  # fmt: skip
    for program, package in REQUIRED:
        if shutil.which(program) is None:
            return Isolation(False, f"{program} is not installed (Debian package {package})")
    with tempfile.TemporaryDirectory(prefix="gpupool-probe-") as folder:
        netns = Path(folder) / "netns"
        try:
            netns_create(netns)
        except NetnsError as exc:
            return Isolation(False, f"no network namespace of its own for a pod: {exc}")
        try:
            argv = in_netns(netns, wrap(["true"], uid=UID_BASE, gid=GID_BASE, workdir=None,
                                        mounts=()))  # fmt: skip
            done = subprocess.run(argv, capture_output=True, timeout=30, check=False, env={})
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Isolation(False, f"bubblewrap did not run: {exc}")
        finally:
            netns_remove(netns)
    if done.returncode != 0:
        error = done.stderr.decode("utf-8", "replace").strip()[:300]
        return Isolation(False, f"bubblewrap failed on this machine: {error}")
    return Isolation(True)


class NetnsError(Exception):
    """A network namespace could not be made; the message says why."""


def netns_create(path: Path, *, egress: bool = False) -> None:
    """A network namespace kept by a bind mount at `path` (made if missing, reused if it is
    there): its loopback up, no other interface unless `egress` (`egress_start`). Raises
    NetnsError."""
    if netns_exists(path):
        if egress:
            egress_start(path)
        return
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.touch(mode=0o600)
    argv = ["unshare", f"--net={path}", "--", sys.executable, "-I", "-c", LOOPBACK_UP]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=30, check=False, env={})
    except (OSError, subprocess.TimeoutExpired) as exc:
        done = subprocess.CompletedProcess(argv, 1, b"", str(exc).encode())
    if done.returncode != 0:
        netns_remove(path)
        raise NetnsError(done.stderr.decode("utf-8", "replace").strip()[:300])
    if egress:
        egress_start(path)


# What slirp4netns gives the namespace: tap0 10.0.2.100/24, its DNS forwarder at 10.0.2.3.
EGRESS_DNS = "10.0.2.3"
NO_EGRESS = ("egress is turned on in the cluster's configuration, and slirp4netns, which it "
             "needs, is not installed (Debian package slirp4netns)")  # fmt: skip


def egress_start(path: Path) -> None:
    """slirp4netns for the namespace at `path`, unless it runs: a tap device and a NAT in
    user mode, with the machine's loopback (10.0.2.2) turned off, sandboxed and under
    seccomp. Its pid and start time are kept beside the namespace (`netns_remove` stops
    it). Raises NetnsError."""
    if _egress_pid(path) is not None:
        return
    ready_r, ready_w = os.pipe()
    argv = ["slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback",
            "--enable-sandbox", "--enable-seccomp", f"--ready-fd={ready_w}",
            "--netns-type=path", str(path), "tap0"]  # fmt: skip
    try:
        proc = subprocess.Popen(
            argv, pass_fds=(ready_w,), env={}, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    except OSError as exc:
        raise NetnsError(f"slirp4netns did not start: {exc}") from exc
    finally:
        os.close(ready_w)
    with os.fdopen(ready_r, "rb") as ready:
        configured = ready.read(1) == b"1"  # b"" when it exited first
    if not configured:
        proc.kill()
        proc.wait()
        raise NetnsError("slirp4netns could not configure the namespace's way out")
    _egress_file(path).write_text(f"{proc.pid}:{start_time(proc.pid)}")


def _egress_file(path: Path) -> Path:
    return path.with_name(f"{path.name}.egress")


def _egress_pid(path: Path) -> int | None:
    """The namespace's slirp4netns, when it still runs."""
    try:
        pid, _, started = _egress_file(path).read_text().partition(":")
        return int(pid) if start_time(int(pid)) == started else None
    except (OSError, ValueError):
        return None


def netns_exists(path: Path) -> bool:
    """Whether a namespace is mounted at `path` (nsfs: another device than its folder's).
    After a reboot the file may be left without one."""
    try:
        return path.stat().st_dev != path.parent.stat().st_dev
    except OSError:
        return False


def netns_remove(path: Path) -> None:
    """Forget the namespace at `path`: it goes once no process is left in it (its
    slirp4netns, if any, is stopped)."""
    if (pid := _egress_pid(path)) is not None:
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)  # a child of this worker: reaped, no zombie
    _egress_file(path).unlink(missing_ok=True)
    if netns_exists(path):
        subprocess.run(["umount", str(path)], capture_output=True, timeout=30, check=False)
    path.unlink(missing_ok=True)


def in_netns(path: Path, argv: list[str]) -> list[str]:
    """`argv` run in the namespace at `path` (nsenter execs it: no process in between)."""
    return ["nsenter", f"--net={path}", "--", *argv]


def project_gid(project_id: int) -> int:
    return GID_BASE + project_id


POD_USER = "gpupool"  # the pod's user's name inside its sandbox (clusters.backends.sshd)


def passwd_text(uid: int, gid: int, home: str) -> str:
    """The machine's passwd with the pod's user added under POD_USER (its uid has no entry
    outside: see the module's docstring)."""
    try:
        lines = [
            line
            for line in Path("/etc/passwd").read_text().splitlines()
            if line and not line.startswith(f"{POD_USER}:")
        ]
    except OSError:
        lines = ["root:x:0:0:root:/root:/bin/sh"]
    return "\n".join([*lines, f"{POD_USER}:x:{uid}:{gid}:GPUPool pod:{home}:/bin/sh", ""])


def wrap(
    command: list[str],
    *,
    uid: int,
    gid: int,
    workdir: Path | None,
    mounts: tuple[Mount, ...],
    host_ipc: bool = False,
) -> list[str]:
    """The command line that runs `command` sandboxed as uid:gid in `workdir` (also its
    HOME, bound at the same path), with `mounts` (data volume, socket folder) on top. The
    environment passes through unchanged: the backend builds it clean.
    `host_ipc`: an MPS client shares the machine's IPC namespace and /dev/shm with its GPU's
    MPS server, as NVIDIA's MPS requires (docs/gpu-sharing.md: what that costs)."""
    ipc = [] if host_ipc else ["--unshare-ipc"]
    argv = ["bwrap", "--die-with-parent", "--unshare-pid", *ipc, "--unshare-uts",
            "--unshare-cgroup-try", "--hostname", "gpupool-pod"]  # fmt: skip
    # The private /tmp first: bwrap mounts in order, and a project cloned under /tmp has
    # its virtualenv there, which the binds after it must lay over the tmpfs, not under.
    shm = ["--bind", "/dev/shm", "/dev/shm"] if host_ipc else ["--tmpfs", "/dev/shm"]
    argv += ["--proc", "/proc", "--dev", "/dev", *shm,
             "--perms", "1777", "--tmpfs", "/tmp"]  # fmt: skip
    made: set[str] = {"/tmp"}
    argv += _system_binds(made)
    argv += _gpu_binds()
    if workdir is not None:
        argv += _bind("--bind", str(workdir), str(workdir), made)
        argv += ["--chdir", str(workdir)]
    for mount in mounts:
        kind = "--ro-bind" if mount.read_only else "--bind"
        argv += _bind(kind, mount.source, mount.target, made)
    # Only what setpriv needs to switch users, and to enter the pod's own (0700) folder;
    # setpriv then drops every capability, the bounding set too.
    argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
             "--cap-add", "CAP_SETPCAP", "--cap-add", "CAP_DAC_READ_SEARCH", "--",
             "setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
             "--inh-caps=-all", "--bounding-set=-all", "--",
             sys.executable, "-I", "-c", EXEC_WITH_DEFAULT_SIGNALS, *command]  # fmt: skip
    return argv


def _bind(kind: str, source: str, target: str, made: set[str]) -> list[str]:
    """A bind, after the folders above its target: bwrap would make those 0700 and root's,
    which the pod's user could not pass through."""
    argv = []
    for parent in reversed(Path(target).parents):
        if str(parent) != "/" and str(parent) not in made:
            argv += ["--perms", "0755", "--dir", str(parent)]
            made.add(str(parent))
    made.add(target)
    return [*argv, kind, source, target]


def _system_binds(made: set[str]) -> list[str]:
    """/usr and the merged-/usr links, the Python interpreter and virtualenv, /etc's needs."""
    argv = _bind("--ro-bind", "/usr", "/usr", made)
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            argv += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            argv += ["--ro-bind", str(path), str(path)]
    for prefix in sorted({sys.prefix, sys.base_prefix, sys.exec_prefix}):
        if not prefix.startswith("/usr/"):
            argv += _bind("--ro-bind", prefix, prefix, made)
    argv += ["--perms", "0755", "--dir", "/etc"]
    for name in ETC_FILES:
        argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return argv


def _gpu_binds() -> list[str]:
    """NVIDIA's device nodes and the driver's /proc and /sys entries, when there are any:
    CUDA_VISIBLE_DEVICES chooses among them as without the sandbox."""
    argv = []
    for device in sorted(Path("/dev").glob("nvidia*")):
        argv += ["--dev-bind", str(device), str(device)]
    if argv:
        argv += ["--ro-bind-try", "/proc/driver/nvidia", "/proc/driver/nvidia",
                 "--ro-bind", "/sys", "/sys"]  # fmt: skip
    return argv
