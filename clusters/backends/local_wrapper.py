"""Runs one local pod's command and writes its exit code to a file:
`wrapper [--sandboxed] [--cgroup PROCS_FILE]... EXIT_FILE CMD...`.

Only a process's parent can wait() for it, and the worker that started a pod may have
restarted since; this wrapper stays the parent. Stop signals go to the whole process group:
the wrapper outlives them to record the code. TERM and INT are blocked across fork, so a
signal that arrives before the command starts kills the command at once, instead of being
swallowed by the wrapper and letting the command start anyway.

--sandboxed: CMD is bubblewrap, which would die of a SIGTERM to the group and take the
sandbox with it (SIGKILL) before the command could checkpoint: it runs with TERM and INT
ignored and still blocked. Linux queues a blocked signal even when it is ignored, so one
that reaches the command's process before its program runs waits for it: inside, the
sandbox sets them back to their defaults and unblocks them
(`sandbox.EXEC_WITH_DEFAULT_SIGNALS`), and it arrives. (One sent before that process
exists is lost with the fork: the backend signals such late comers on its next pass.)

--cgroup: the pod's cgroup (clusters/backends/cgroups.py), entered by writing this process's
pid to each hierarchy's cgroup.procs before the fork, so that the command and all it starts
are in it and under its limits; the pod runs nowhere else (a failure ends it with 126). The
wrapper itself is never the OOM killer's choice (oom_score_adj -1000: it must live to write
the exit code); the command gets the default back.
"""

import os
import signal
import sys

STOP = {signal.SIGTERM, signal.SIGINT}


def main(argv: list[str]) -> int:
    args = argv[1:]
    sandboxed = args[0] == "--sandboxed"
    args = args[sandboxed:]
    cgroups = []
    while args[0] == "--cgroup":
        cgroups.append(args[1])
        args = args[2:]
    exit_file, command = args[0], args[1:]
    if cgroups:
        try:
            _enter(cgroups)
        except OSError as exc:
            print(f"gpupool: cannot enter the pod's cgroup: {exc}", file=sys.stderr, flush=True)
            return _record(exit_file, 126)
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP)
    pid = os.fork()
    if pid == 0:
        if cgroups:
            _oom_score_adj("0")
        if sandboxed:
            for sig in STOP:
                signal.signal(sig, signal.SIG_IGN)
        else:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP)
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            print(f"gpupool: cannot run {command[0]}: {exc}", file=sys.stderr, flush=True)
            os._exit(127)
    for sig in STOP:
        signal.signal(sig, lambda *_: None)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    code = 128 - code if code < 0 else code  # killed by signal N -> 128 + N, like a shell
    return _record(exit_file, code)


def _enter(procs_files: list[str]) -> None:
    _oom_score_adj("-1000")
    for path in procs_files:
        with open(path, "w") as handle:
            handle.write(f"{os.getpid()}\n")


def _oom_score_adj(value: str) -> None:
    try:
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write(value)
    except OSError:
        pass  # not root: the kernel's default choice stands


def _record(exit_file: str, code: int) -> int:
    with open(exit_file, "w") as handle:
        handle.write(f"{code}\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
