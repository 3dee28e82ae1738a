"""The MPS control daemon's life cycle (clusters.agent.mps) against a stand-in
`nvidia-cuda-mps-control` on PATH, and the stand-in's own strictness."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from clusters.agent.mps import PID_FILE, MpsDaemons, MpsError

FAKE = Path(__file__).with_name("fake_mps")
PATH = f"{FAKE}:{os.environ['PATH']}"
UUID = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"


@pytest.fixture
def short_tmp(tmp_path: Path):
    """A short folder: the daemon's socket paths must fit in 107 bytes, as on a real node."""
    with tempfile.TemporaryDirectory(dir="/tmp") as path:
        yield Path(path)


@pytest.fixture
def daemons(short_tmp: Path):
    found = MpsDaemons(short_tmp / "mps", path=PATH)
    yield found
    found.stop_all()


def control_log(daemons: MpsDaemons, key: str) -> str:
    return (daemons.log_dir(key) / "control.log").read_text()


def control(pipe: Path, logs: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    env = {"PATH": PATH, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    return subprocess.run(
        [str(FAKE / "nvidia-cuda-mps-control"), *args],
        input=stdin, capture_output=True, text=True, env=env, timeout=10, check=False,
    )  # fmt: skip


def test_a_shared_gpu_gets_a_daemon_of_its_own_that_sees_only_that_gpu(daemons):
    assert daemons.sync({UUID: UUID, "1": "1"}) == {}
    assert daemons.keys() == ["1", UUID]
    assert daemons.pid(UUID) != daemons.pid("1")
    assert f"Startup CUDA_VISIBLE_DEVICES={UUID}" in control_log(daemons, UUID)
    assert "Startup CUDA_VISIBLE_DEVICES=1" in control_log(daemons, "1")
    assert (daemons.pipe_dir(UUID) / "control").is_socket()


def test_sync_is_idempotent_while_the_daemon_runs(daemons):
    daemons.sync({UUID: UUID})
    pid = daemons.pid(UUID)
    daemons.sync({UUID: UUID})
    assert daemons.pid(UUID) == pid
    assert control_log(daemons, UUID).count("Startup") == 1


def test_a_daemon_that_died_is_started_again(daemons):
    daemons.sync({UUID: UUID})
    pid = daemons.pid(UUID)
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        if daemons.pid(UUID) is None:
            break
        subprocess.run(["sleep", "0.02"], check=True)
    assert daemons.pid(UUID) is None
    daemons.sync({UUID: UUID})
    assert daemons.pid(UUID) not in (None, pid)
    assert control_log(daemons, UUID).count("Startup") == 2


def test_a_gpu_no_longer_shared_has_its_daemon_told_to_quit_and_its_folder_removed(daemons):
    daemons.sync({UUID: UUID, "1": "1"})
    pid = daemons.pid(UUID)
    log_before = daemons.log_dir(UUID) / "control.log"
    daemons.sync({"1": "1"})
    assert daemons.keys() == ["1"]
    assert not log_before.exists()  # the folder went with the daemon
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    assert daemons.pid("1") is not None


def test_quit_is_what_stops_it(short_tmp, tmp_path):
    daemons = MpsDaemons(short_tmp / "mps", path=PATH)
    daemons.sync({"0": "0"})
    logs = daemons.log_dir("0")
    kept = tmp_path / "kept.log"
    # Keep the log: stop removes the folder after the daemon went.
    original = daemons.stop

    def stop_and_keep(key):
        pid = daemons.pid(key)
        assert pid is not None
        result = control(daemons.pipe_dir(key), logs, stdin="quit\n")
        kept.write_text((logs / "control.log").read_text())
        original(key)
        return result

    assert stop_and_keep("0").returncode == 0
    assert "Command quit" in kept.read_text()
    assert daemons.keys() == []


def test_a_missing_executable_is_an_error_not_a_silent_pass(tmp_path):
    daemons = MpsDaemons(tmp_path / "mps", path="/nonexistent")
    assert "not installed" in daemons.sync({"0": "0"})["0"]
    with pytest.raises(MpsError):
        daemons.start("0", "0")


def test_keys_that_are_not_plain_names_are_refused(daemons):
    with pytest.raises(ValueError):
        daemons.pipe_dir("../etc")


def test_a_pipe_directory_too_long_for_a_socket_is_refused_up_front(tmp_path):
    daemons = MpsDaemons(tmp_path / ("x" * 80), path=PATH)
    with pytest.raises(MpsError, match="too long"):
        daemons.start(UUID, UUID)


# --- the stand-in refuses what the real one refuses ------------------------------------------


def test_the_stand_in_refuses_a_missing_pipe_directory(tmp_path):
    (tmp_path / "log").mkdir()
    done = control(tmp_path / "nope", tmp_path / "log", "-d")
    assert done.returncode == 1 and "pipe directory" in done.stderr


def test_the_stand_in_refuses_a_missing_log_directory(tmp_path):
    (tmp_path / "pipe").mkdir()
    done = control(tmp_path / "pipe", tmp_path / "nolog", "-d")
    assert done.returncode == 1 and "log directory" in done.stderr


def test_the_stand_in_refuses_a_second_daemon_on_one_pipe(short_tmp):
    pipe, logs = short_tmp / "pipe", short_tmp / "log"
    pipe.mkdir(), logs.mkdir()
    assert control(pipe, logs, "-d").returncode == 0
    try:
        again = control(pipe, logs, "-d")
        assert again.returncode == 1 and "already running" in again.stderr
        assert (pipe / PID_FILE).read_text().strip().isdigit()
    finally:
        control(pipe, logs, stdin="quit\n")


def test_the_stand_in_client_fails_without_a_daemon_and_on_bad_options(tmp_path):
    (tmp_path / "pipe").mkdir()
    done = control(tmp_path / "pipe", tmp_path, stdin="get_server_list\n")
    assert done.returncode == 1 and "Cannot find MPS control daemon" in done.stderr
    assert control(tmp_path / "pipe", tmp_path, "-x").returncode == 1


def test_the_stand_in_records_each_command_and_names_unknown_ones(short_tmp):
    pipe, logs = short_tmp / "pipe", short_tmp / "log"
    pipe.mkdir(), logs.mkdir()
    assert control(pipe, logs, "-d").returncode == 0
    done = control(pipe, logs, stdin="get_server_list\nbogus\nquit\n")
    assert done.returncode == 0 and "Unrecognized command bogus" in done.stdout
    text = (logs / "control.log").read_text()
    assert "Command get_server_list" in text and "Command quit" in text and "Exit" in text
    assert not (pipe / PID_FILE).exists()
