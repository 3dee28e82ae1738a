"""Check on a real GPU that MPS holds GPUPool's limits: run by hand on a GPU machine.

    python scripts/gpu/mps_check.py [--device GPU-UUID|INDEX] [--limits 2048 4096]

What it does, with GPUPool's own code (clusters.agent.mps, clusters.sharing):
1. starts an MPS control daemon for one GPU in a folder of its own (as the agent does);
2. starts two sharer processes with the limits GPUPool gives (2 GiB and 4 GiB of memory,
   each 50 % of the SMs), each allocating with cuMemAlloc through ctypes on libcuda (no
   CUDA toolkit or framework needed);
3. checks: both are MPS clients of that daemon's server; an allocation within the limit
   succeeds; one past it fails with CUDA_ERROR_OUT_OF_MEMORY in that process alone; the
   neighbour keeps running (it allocates, writes and synchronises afterwards);
4. stops the daemon (`quit`), and prints a JSON report; exit status 0 when all held.
It never changes the GPU's MIG mode, compute mode or clocks, and never resets it. It needs
the NVIDIA driver (libcuda.so.1, nvidia-cuda-mps-control) and a GPU of Volta or newer.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from clusters.agent.mps import MpsDaemons
from clusters.sharing import MpsLimits, mps_env

MIB = 1024 * 1024
CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2


# --- the sharer: a CUDA client driven over stdin ------------------------------------------
class Cuda:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.ptrs: list[int] = []
        self._check("cuInit", self.lib.cuInit(0))
        device = ctypes.c_int()
        self._check("cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(device), 0))
        self.ctx = ctypes.c_void_p()
        self._check("cuCtxCreate", self.lib.cuCtxCreate_v2(ctypes.byref(self.ctx), 0, device))

    @staticmethod
    def _check(what: str, rc: int) -> None:
        if rc != CUDA_SUCCESS:
            raise SystemExit(f"{what} failed with CUDA error {rc}")

    def alloc(self, mib: int) -> int:
        ptr = ctypes.c_uint64()
        rc = self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib * MIB))
        if rc == CUDA_SUCCESS:
            self.ptrs.append(ptr.value)
        return int(rc)

    def touch(self) -> int:
        """Write every allocation and wait for the GPU: the process still works."""
        for ptr in self.ptrs:
            rc = self.lib.cuMemsetD8_v2(ctypes.c_uint64(ptr), 0xAB, ctypes.c_size_t(MIB))
            if rc != CUDA_SUCCESS:
                return int(rc)
        return int(self.lib.cuCtxSynchronize())

    def mem_info(self) -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
        return free.value // MIB, total.value // MIB


def client() -> int:
    cuda = Cuda()
    free, total = cuda.mem_info()
    print(json.dumps({"ready": os.getpid(), "free_mib": free, "total_mib": total}), flush=True)
    for line in sys.stdin:
        word, *args = line.split()
        if word == "alloc":
            print(json.dumps({"alloc": int(args[0]), "rc": cuda.alloc(int(args[0]))}), flush=True)
        elif word == "touch":
            print(json.dumps({"touch": cuda.touch()}), flush=True)
        elif word == "quit":
            return 0
    return 0


# --- the driver ----------------------------------------------------------------------------
class Sharer:
    def __init__(self, limit_mib: int, env: dict[str, str]):
        self.limit_mib = limit_mib
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--client"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.hello = self._answer()

    def _answer(self) -> dict:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            raise SystemExit(f"the sharer with {self.limit_mib} MiB died: {self.proc.wait()}")
        return json.loads(line)

    def ask(self, command: str) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def alive(self) -> bool:
        return self.proc.poll() is None


def gpu_device(asked: str) -> str:
    if asked:
        return asked
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout  # fmt: skip
        return out.split()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "0"


def control(daemons: MpsDaemons, key: str, command: str) -> str:
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(daemons.pipe_dir(key))}
    done = subprocess.run(
        ["nvidia-cuda-mps-control"], input=command + "\n", capture_output=True, text=True,
        env=env, timeout=30, check=False,
    )  # fmt: skip
    return done.stdout.strip()


def run(device: str, limits: list[int]) -> dict:
    """1. daemon; 2. sharers; 3. within / past / neighbour; 4. stop."""
    root = Path(tempfile.mkdtemp(prefix="gp-mps-", dir="/tmp"))
    daemons = MpsDaemons(root)
    key = "check"
    report: dict = {"device": device, "limits_mib": limits, "checks": {}}
    checks = report["checks"]
    daemons.start(key, device)
    sharers: list[Sharer] = []
    try:
        for limit in limits:
            env = {**os.environ, **mps_env(MpsLimits(limit, 50), str(daemons.pipe_dir(key)))}
            env["CUDA_VISIBLE_DEVICES"] = device
            sharers.append(Sharer(limit, env))
        report["clients"] = [s.hello for s in sharers]  # what cuMemGetInfo said to each
        server = control(daemons, key, "get_server_list").split()
        clients = control(daemons, key, f"get_client_list {server[0]}").split() if server else []
        checks["both_are_mps_clients"] = sorted(clients) == sorted(
            str(s.hello["ready"]) for s in sharers
        )
        for s in sharers:  # within: half the limit
            checks[f"within_{s.limit_mib}_succeeds"] = s.ask(f"alloc {s.limit_mib // 2}")["rc"] == 0
        for index, s in enumerate(sharers):
            past = s.ask(f"alloc {s.limit_mib}")["rc"]  # half + the whole limit: past it
            checks[f"past_{s.limit_mib}_is_out_of_memory"] = past == CUDA_ERROR_OUT_OF_MEMORY
            for other in sharers[:index] + sharers[index + 1 :]:
                still = other.alive() and other.ask("touch")["touch"] == 0
                more = other.ask("alloc 64")["rc"] == 0
                checks[f"neighbour_{other.limit_mib}_runs_after_{s.limit_mib}_oom"] = still and more
            checks[f"sharer_{s.limit_mib}_itself_still_runs"] = s.ask("touch")["touch"] == 0
    finally:
        for s in sharers:
            if s.alive():  # quit has no answer to wait for
                assert s.proc.stdin is not None
                s.proc.stdin.write("quit\n")
                s.proc.stdin.flush()
                s.proc.wait(timeout=30)
        daemons.stop(key)
    checks["daemon_stopped"] = daemons.pid(key) is None
    report["ok"] = all(checks.values())
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="", help="GPU UUID or index (default: the first)")
    parser.add_argument("--limits", type=int, nargs="+", default=[2048, 4096])
    args = parser.parse_args(argv)
    if args.client:
        return client()
    started = time.monotonic()
    report = run(gpu_device(args.device), args.limits)
    report["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
