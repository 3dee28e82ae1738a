"""Tenant isolation for local pods: bubblewrap, then an unprivileged user of the pod's own.

Why bubblewrap (Debian's `bubblewrap`, Flatpak's sandbox) and not bare `unshare`: it builds
the pod's filesystem from nothing, out of explicit binds, in one small audited program. A pod
sees /usr, the Python it runs on (read-only), a few files of /etc, its own folder, its data
volume and a socket folder; nothing else of this machine: not the portal's var/ (database,
credentials, other pods' folders and logs), not its settings or virtualenv for writing. It
gets a PID namespace with a /proc of its own, so no other process's environment
(/proc/<pid>/environ) can be read, and private IPC, UTS, /tmp and /dev.

The worker runs bwrap as root *without* a user namespace: a user namespace would map the
pod back onto root outside, and root-owned 0600 files would be its own. Instead the pod drops
to a kernel uid of its own (`UID_BASE + workload id`, no passwd entry needed, like systemd's
DynamicUser) and its project's gid with `setpriv`, clearing every capability and the
bounding set: outside the sandbox too it is nobody the machine knows. Files it writes are its
own; a data volume is shared inside a project through the project's group.

Sandboxing needs root (to switch users), `bwrap` and `setpriv` (util-linux). Where one is
missing the local cluster says so and runs only platform admins' work, never others'
unisolated (`probe`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

UID_BASE = 1_000_000_000  # + workload id: one user per workload
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
    for program, package in (("bwrap", "bubblewrap"), ("setpriv", "util-linux")):
        if shutil.which(program) is None:
            return Isolation(False, f"{program} is not installed (Debian package {package})")
    argv = wrap(["true"], uid=UID_BASE, gid=GID_BASE, workdir=None, mounts=())
    try:
        done = subprocess.run(argv, capture_output=True, timeout=30, check=False, env={})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Isolation(False, f"bubblewrap did not run: {exc}")
    if done.returncode != 0:
        error = done.stderr.decode("utf-8", "replace").strip()[:300]
        return Isolation(False, f"bubblewrap failed on this machine: {error}")
    return Isolation(True)


def pod_uid(workload_id: int) -> int:
    return UID_BASE + workload_id


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
    made: set[str] = set()
    argv += _system_binds(made)
    shm = ["--bind", "/dev/shm", "/dev/shm"] if host_ipc else ["--tmpfs", "/dev/shm"]
    argv += ["--proc", "/proc", "--dev", "/dev", *shm,
             "--perms", "1777", "--tmpfs", "/tmp"]  # fmt: skip
    made.add("/tmp")
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
