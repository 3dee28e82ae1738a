"""One CUDA MPS control daemon per shared GPU: started, watched, restarted, stopped.

Each shared GPU gets a folder of its own under `root`: `<key>/pipe` (the daemon's
CUDA_MPS_PIPE_DIRECTORY, which the sharers of that GPU are pointed at) and `<key>/log`
(CUDA_MPS_LOG_DIRECTORY). The daemon sees only its GPU (CUDA_VISIBLE_DEVICES = the GPU's
UUID, or its index where no UUID is known). `sync` is level-triggered: called with the
shared GPUs wanted now, it starts what is missing or died, and stops (`echo quit |
nvidia-cuda-mps-control`) the daemons of GPUs that nobody shares any more. The caller
passes every GPU that still has a sharer, a pod shutting down included: a GPU leaves MPS
mode only once its last sharer is gone.

Used by the local backend (its worker starts the daemons on this machine) and by the node
agent on Kubernetes (the DaemonSet: deploy/agent/daemonset.yaml). No Django here.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("gpupool.mps")

CONTROL = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"  # the daemon writes it into its pipe directory
KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # a GPU UUID or index: a safe folder
START_WAIT_S = 5.0
# The daemon's sockets live in its pipe directory, and a socket's path must fit in 107 bytes.
MAX_PIPE_DIR = 80
COMMAND_TIMEOUT_S = 10.0


class MpsError(Exception):
    """A daemon could not be started (no executable, refused, never came up)."""


@dataclass(frozen=True, slots=True)
class DaemonState:
    key: str
    device: str
    pid: int | None


class MpsDaemons:
    """The daemons under `root`, one per key (a shared GPU's UUID or index)."""

    def __init__(self, root: Path, executable: str = CONTROL, path: str | None = None):
        self.root = Path(root)
        self.executable = executable
        self.path = path if path is not None else os.environ.get("PATH", "/usr/bin:/bin")

    def pipe_dir(self, key: str) -> Path:
        return self.root / _checked(key) / "pipe"

    def log_dir(self, key: str) -> Path:
        return self.root / _checked(key) / "log"

    def pid(self, key: str) -> int | None:
        """The running daemon's pid, from the file it keeps in its pipe directory."""
        try:
            pid = int((self.pipe_dir(key) / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def keys(self) -> list[str]:
        """The GPUs that have a folder here (a daemon now or earlier)."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and KEY.fullmatch(p.name))

    def sync(self, wanted: Mapping[str, str]) -> dict[str, str]:
        """1. start a daemon for each wanted key ({key: device}) that has none running
        (never started, or died); 2. stop the daemons of keys no longer wanted.
        Returns {key: error} for the daemons that could not be started."""
        errors = {}
        for key, device in sorted(wanted.items()):
            if self.pid(key) is None:
                try:
                    self.start(key, device)
                except MpsError as exc:
                    log.error("MPS daemon for GPU %s: %s", key, exc)
                    errors[key] = str(exc)
        for key in self.keys():
            if key not in wanted:
                self.stop(key)
        return errors

    def _env(self, key: str, device: str) -> dict[str, str]:
        return {
            "PATH": self.path,
            "CUDA_VISIBLE_DEVICES": device,
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # an index means NVML's (PCI bus) order
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(key)),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir(key)),
        }

    def start(self, key: str, device: str) -> int:
        """Start the daemon (`-d`: it forks into the background and the command returns);
        wait until it has written its pid file. Returns its pid."""
        found = shutil.which(self.executable, path=self.path)
        if found is None:
            raise MpsError(f"{self.executable} is not installed on this node (NVIDIA driver)")
        if len(str(self.pipe_dir(key))) > MAX_PIPE_DIR:
            raise MpsError(f"the pipe directory {self.pipe_dir(key)} is too long for a socket")
        for folder in (self.pipe_dir(key), self.log_dir(key)):
            folder.mkdir(mode=0o755, parents=True, exist_ok=True)
        # Sharers run as other users: they must reach the pipe (the daemon checks who asks).
        self.pipe_dir(key).chmod(0o777)
        (self.pipe_dir(key) / PID_FILE).unlink(missing_ok=True)  # a dead daemon's
        done = self._run([found, "-d"], key, device, stdin="")
        if done.returncode != 0:
            raise MpsError(f"{found} -d exited with {done.returncode}: {done.stderr.strip()}")
        deadline = time.monotonic() + START_WAIT_S
        while (pid := self.pid(key)) is None:
            if time.monotonic() > deadline:
                raise MpsError(f"the daemon did not come up within {START_WAIT_S:.0f} s")
            time.sleep(0.05)
        log.info("MPS daemon for GPU %s (device %s) runs as pid %s", key, device, pid)
        return pid

    def stop(self, key: str) -> None:
        """`quit` to the daemon; if it does not go, SIGTERM. Then its folder goes too."""
        pid = self.pid(key)
        if pid is not None:
            found = shutil.which(self.executable, path=self.path)
            if found is not None:
                done = self._run([found], key, "", stdin="quit\n")
                if done.returncode != 0:
                    log.warning("MPS quit for GPU %s: %s", key, done.stderr.strip())
            if not _wait_gone(pid, 5.0):
                os.kill(pid, signal.SIGTERM)
                _wait_gone(pid, 5.0)
            log.info("MPS daemon for GPU %s stopped", key)
        shutil.rmtree(self.root / _checked(key), ignore_errors=True)

    def stop_all(self) -> None:
        for key in self.keys():
            self.stop(key)

    def _run(self, argv: list[str], key: str, device: str, *, stdin: str) -> _Done:
        try:
            done = subprocess.run(
                argv,
                input=stdin,
                capture_output=True,
                text=True,
                env=self._env(key, device),
                timeout=COMMAND_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return _Done(1, str(exc))
        return _Done(done.returncode, done.stderr or done.stdout)


@dataclass(frozen=True, slots=True)
class _Done:
    returncode: int
    stderr: str


def _checked(key: str) -> str:
    if not KEY.fullmatch(key):
        raise ValueError(f"not a GPU key: {key!r}")
    return key


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2 :].split()[0] != "Z"


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
