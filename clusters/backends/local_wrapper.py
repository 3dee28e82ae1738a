"""Runs one local pod's command and writes its exit code to a file: `wrapper EXIT_FILE CMD...`.

Only a process's parent can wait() for it, and the worker that started a pod may have
restarted since; this wrapper stays the parent. Stop signals go to the whole process group:
the wrapper outlives them to record the code. TERM and INT are blocked across fork, so a
signal that arrives before the command starts kills the command at once, instead of being
swallowed by the wrapper and letting the command start anyway.
"""

import os
import signal
import sys

STOP = {signal.SIGTERM, signal.SIGINT}


def main(argv: list[str]) -> int:
    exit_file, command = argv[1], argv[2:]
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP)
    pid = os.fork()
    if pid == 0:
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
