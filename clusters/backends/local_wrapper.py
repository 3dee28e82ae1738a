"""Runs one local pod's command and writes its exit code to a file:
`wrapper [--sandboxed] EXIT_FILE CMD...`.

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
"""

import os
import signal
import sys

STOP = {signal.SIGTERM, signal.SIGINT}


def main(argv: list[str]) -> int:
    sandboxed = argv[1] == "--sandboxed"
    exit_file, command = argv[1 + sandboxed], argv[2 + sandboxed :]
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP)
    pid = os.fork()
    if pid == 0:
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
    with open(exit_file, "w") as handle:
        handle.write(f"{code}\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
