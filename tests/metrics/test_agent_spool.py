"""The agent's spool: buffered samples survive a restart of the agent."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

from clusters.agent.shipper import Shipper
from clusters.agent.spool import Spool
from tests.metrics.test_agent import Portal

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_spool_gives_back_what_it_kept_and_skips_unreadable_lines(tmp_path, caplog):
    spool = Spool(tmp_path / "agent" / "spool.jsonl")
    assert spool.load() == []
    spool.save([{"n": 1}, {"n": 2}])
    assert Spool(spool.path).load() == [{"n": 1}, {"n": 2}]
    with spool.path.open("a") as out:
        out.write('{"n": 3\n[4]\n{"n": 5}\n')
    assert Spool(spool.path).load() == [{"n": 1}, {"n": 2}, {"n": 5}]
    assert "skipped 2 unreadable lines" in caplog.text
    assert not spool.path.with_name("spool.jsonl.partial").exists()


def test_the_spool_is_written_at_most_once_a_minute_unless_the_agent_stops(tmp_path):
    clock = Clock()
    spool = Spool(tmp_path / "spool.jsonl", every_s=60, clock=clock)
    spool.save([{"n": 1}])
    spool.save([{"n": 1}, {"n": 2}])
    assert Spool(spool.path).load() == [{"n": 1}]
    clock.now = 60
    spool.save([{"n": 1}, {"n": 2}])
    assert Spool(spool.path).load() == [{"n": 1}, {"n": 2}]
    spool.save([{"n": 3}], now=True)
    assert Spool(spool.path).load() == [{"n": 3}]


def test_a_new_shipper_sends_what_the_last_one_kept_first_then_removes_the_spool(tmp_path):
    portal = Portal()
    url = f"http://127.0.0.1:{portal.port}"
    path = tmp_path / "spool.jsonl"
    first = Shipper(url, "secret", timeout_s=2, spool=Spool(path))
    first.add([{"n": 1}, {"n": 2}])
    assert first.flush() is False and path.exists()  # the portal is away
    first.add([{"n": 3}])
    first.keep()

    second = Shipper(url, "secret", timeout_s=2, spool=Spool(path))
    second.restore()
    second.add([{"n": 4}])
    portal.up()
    try:
        assert second.flush() is True
    finally:
        portal.down()
    assert [s["n"] for s in portal.received] == [1, 2, 3, 4]
    assert not path.exists()


def test_an_agent_stopped_while_the_portal_is_away_hands_its_samples_to_the_next_run(tmp_path):
    portal = Portal()
    spool = tmp_path / "spool.jsonl"

    def agent(*extra: str) -> subprocess.Popen:
        code = (
            "import sys; from clusters.agent.main import main; "
            "from tests.metrics.fake_nvml import FakeNvml; "
            "sys.exit(main(sys.argv[1:], nvml=FakeNvml()))"
        )
        args = ["--token", "secret", "--portal", f"http://127.0.0.1:{portal.port}"]
        args += ["--spool", str(spool), *extra]
        return subprocess.Popen(
            [sys.executable, "-c", code, *args], cwd=ROOT, stderr=subprocess.PIPE
        )

    away = agent("--interval", "0.2")
    try:
        for _ in range(200):
            if spool.exists() or away.poll() is not None:
                break
            threading.Event().wait(0.05)
        away.send_signal(signal.SIGTERM)
        assert away.wait(timeout=10) == 0
        log = away.stderr.read().decode()
    finally:
        if away.poll() is None:
            away.kill()
            away.wait()
    kept = len(Spool(spool).load())
    assert kept >= 2 and kept % 2 == 0, log  # two GPUs per round
    assert f"{kept} samples kept in {spool}" in log

    portal.up()
    try:
        back = agent("--ticks", "1")
        assert back.wait(timeout=30) == 0, back.stderr.read().decode()
    finally:
        portal.down()
    assert len(portal.received) == kept + 2
    stamps = [s["ts"] for s in portal.received]
    assert stamps == sorted(stamps)  # the earlier run's samples first
    assert not spool.exists()
