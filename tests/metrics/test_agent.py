from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from clusters.agent.main import Agent, main, to_samples
from clusters.agent.nvml import Sampler
from clusters.agent.procmap import Owner, ProcessMap, pod_uid_from_cgroup
from clusters.agent.shipper import Shipper
from clusters.pod_users import UID_BASE
from tests.metrics.fake_nvml import FakeNvml
from tests.services import free_port


def test_the_sampler_converts_nvml_units_to_mib_and_watts():
    first, second = Sampler(FakeNvml()).read()
    assert (first.gpu_index, first.util_pct, first.mem_used_mib, first.mem_total_mib) == (
        0, 97.0, 58368, 81920
    )  # fmt: skip
    assert (first.power_w, first.temp_c) == (312.456, 64.0)
    assert [(p.pid, p.used_mib) for p in first.processes] == [(4242, 57344)]
    assert (second.util_pct, second.mem_used_mib, second.processes) == (0.0, 4, [])


def test_a_board_without_power_readings_still_reports_the_rest():
    reading = Sampler(FakeNvml(power_supported=False)).read()[0]
    assert reading.power_w is None and reading.util_pct == 97.0


def test_a_gpu_that_cannot_be_read_is_left_out_and_the_others_go_on(caplog):
    nvml = FakeNvml()
    nvml.gpus[0]["error"] = "GPU is lost"
    sampler = Sampler(nvml)
    for _ in range(2):
        assert [r.gpu_index for r in sampler.read()] == [1]
    assert caplog.text.count("GPU 0 cannot be read: GPU is lost") == 1
    nvml.gpus[0]["error"] = None
    assert [r.gpu_index for r in sampler.read()] == [0, 1]


def test_a_gpu_lost_before_the_agent_starts_is_left_out(capsys):
    nvml = FakeNvml()
    nvml.gpus[0]["handle_error"] = "GPU is lost"
    assert [r.gpu_index for r in Sampler(nvml).read()] == [1]
    nvml.gpus[1]["handle_error"] = "GPU is lost"
    assert main(["--token", "t", "--ticks", "1"], nvml=nvml) == 0
    assert "none of the 2 GPUs NVML lists can be opened" in capsys.readouterr().out


@pytest.mark.parametrize("nvml", [FakeNvml(init_error="Driver Not Loaded"), FakeNvml(gpus=[])])
def test_without_a_gpu_the_agent_says_so_and_exits_cleanly(nvml, capsys):
    assert main(["--token", "t", "--ticks", "1"], nvml=nvml) == 0
    assert "no GPU to watch" in capsys.readouterr().out


def test_a_process_is_mapped_through_its_environment_then_its_ancestors(tmp_path):
    env = {**os.environ, "GPUPOOL_WORKLOAD_ID": "31", "GPUPOOL_POD_INDEX": "2"}
    tagged = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    # A pod started as a shell whose child does the GPU work: the child maps via its parent.
    pod = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        child = _wait_for_child(pod.pid)
        procmap = ProcessMap()
        # The local backend's backend_ref is "<pid>:<start time>".
        procmap.update([{"workload_id": 8, "pod_index": 0, "backend_ref": f"{pod.pid}:1234.5"}])
        assert procmap.owner(tagged.pid) == Owner(31, 2)
        assert procmap.owner(child) == Owner(8, 0)
        assert procmap.owner(os.getpid()) is None
    finally:
        for proc in (tagged, pod):
            proc.kill()
            proc.wait()


def _wait_for_child(pid: int) -> int:
    for _ in range(200):
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children:
            return int(children[0])
        threading.Event().wait(0.01)
    raise AssertionError("the shell started no child")


@pytest.mark.parametrize(
    "cgroup",
    [
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f4c3b2a_1d2e_4f60_"
        "8a9b_0c1d2e3f4a5b.slice/cri-containerd-91ab.scope\n",
        "12:memory:/kubepods/burstable/pod0f4c3b2a-1d2e-4f60-8a9b-0c1d2e3f4a5b/91ab\n",
    ],
)
def test_the_pod_uid_is_read_from_cgroup_v1_and_v2_paths(cgroup, tmp_path):
    assert pod_uid_from_cgroup(cgroup) == "0f4c3b2a-1d2e-4f60-8a9b-0c1d2e3f4a5b"
    assert pod_uid_from_cgroup("0::/user.slice/session-3.scope\n") is None
    # A recorded /proc for pid 900 inside that pod, matched on the UID the kubernetes backend
    # records as backend_ref.
    (tmp_path / "900").mkdir()
    (tmp_path / "900" / "cgroup").write_text(cgroup)
    (tmp_path / "900" / "stat").write_text("900 (python) S 1 900 900 0")
    procmap = ProcessMap(proc=tmp_path)
    uid = "0f4c3b2a-1d2e-4f60-8a9b-0c1d2e3f4a5b"
    procmap.update([{"workload_id": 12, "pod_index": 3, "backend_ref": uid}])
    assert procmap.owner(900) == Owner(12, 3)


def _fake_process(proc: Path, pid: int, *, uid: int, parent: int = 1, env: str = "",
                  cgroup: str = "0::/user.slice\n") -> None:  # fmt: skip
    """A recorded /proc entry: its status (real uid), stat (parent), environ, cgroup."""
    folder = proc / str(pid)
    folder.mkdir()
    (folder / "status").write_text(f"Name:\tpython\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (folder / "stat").write_text(f"{pid} (python) S {parent} {pid} {pid} 0")
    (folder / "environ").write_bytes(env.replace(" ", "\0").encode())
    (folder / "cgroup").write_text(cgroup)


def test_a_sandboxed_pod_cannot_pass_its_gpu_use_off_as_another_workloads(tmp_path):
    # Workload 7's pod (its kernel uid UID_BASE + 7) sets workload 31's id in its
    # environment: its process is still workload 7's, with its own pod's index.
    _fake_process(tmp_path, 900, uid=UID_BASE + 7,
                  env="GPUPOOL_WORKLOAD_ID=31 GPUPOOL_POD_INDEX=2")  # fmt: skip
    procmap = ProcessMap(proc=tmp_path)
    procmap.update([
        {"workload_id": 7, "pod_index": 1, "backend_ref": "800:1.0"},
        {"workload_id": 31, "pod_index": 2, "backend_ref": "801:1.0"},
    ])  # fmt: skip
    assert procmap.owner(900) == Owner(7, 1)
    # With two pods of workload 7 here, its environment may pick one of them only.
    procmap.update([
        {"workload_id": 7, "pod_index": 0, "backend_ref": "800:1.0"},
        {"workload_id": 7, "pod_index": 2, "backend_ref": "802:1.0"},
    ])  # fmt: skip
    assert procmap.owner(900) == Owner(7, None)  # it names another workload's pod
    _fake_process(tmp_path, 901, uid=UID_BASE + 7, env="GPUPOOL_WORKLOAD_ID=7 GPUPOOL_POD_INDEX=2")
    assert procmap.owner(901) == Owner(7, 2)
    _fake_process(tmp_path, 902, uid=UID_BASE + 7, env="GPUPOOL_WORKLOAD_ID=7 GPUPOOL_POD_INDEX=5")
    assert procmap.owner(902) == Owner(7, None)  # no such pod of it here


def test_a_kubernetes_pod_or_a_child_of_a_pod_is_not_what_its_environment_says(tmp_path):
    pod_uid = "0f4c3b2a-1d2e-4f60-8a9b-0c1d2e3f4a5b"
    _fake_process(tmp_path, 900, uid=0, env="GPUPOOL_WORKLOAD_ID=31",
                  cgroup=f"0::/kubepods/burstable/pod{pod_uid}/91ab\n")  # fmt: skip
    _fake_process(tmp_path, 800, uid=0)  # an unsandboxed local pod's wrapper
    _fake_process(tmp_path, 950, uid=0, parent=800, env="GPUPOOL_WORKLOAD_ID=31")
    procmap = ProcessMap(proc=tmp_path)
    procmap.update([
        {"workload_id": 12, "pod_index": 3, "backend_ref": pod_uid},
        {"workload_id": 8, "pod_index": 0, "backend_ref": "800:1.0"},
    ])  # fmt: skip
    assert procmap.owner(900) == Owner(12, 3)
    assert procmap.owner(950) == Owner(8, 0)


def test_samples_carry_the_workload_of_the_gpus_largest_process():
    procmap = ProcessMap()
    procmap.owner = lambda pid: Owner(77, 0) if pid == 4242 else None
    samples = to_samples(Sampler(FakeNvml()).read(), procmap)
    assert (samples[0]["workload_id"], samples[0]["pod_index"]) == (77, 0)
    assert samples[0]["processes"] == [
        {"pid": 4242, "used_mib": 57344, "workload_id": 77, "pod_index": 0}
    ]
    assert samples[1]["workload_id"] is None


class Portal:
    """A stand-in portal on a fixed port that can be down (not listening) and come up."""

    def __init__(self):
        self.port = free_port()
        self.received: list[dict] = []
        self.server = None

    def up(self):
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                assert self.headers["Authorization"] == "Bearer secret"
                received.extend(body["samples"])
                self._reply(201, {"accepted": len(body["samples"])})

            def do_GET(self):
                self._reply(200, {"pods": []})

            def _reply(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self):
        if self.server:
            self.server.shutdown()
            self.server.server_close()


def test_while_the_portal_is_down_samples_wait_in_the_buffer_and_arrive_in_order():
    portal = Portal()
    nvml = FakeNvml()
    shipper = Shipper(f"http://127.0.0.1:{portal.port}", "secret", timeout_s=2, batch_size=3)
    agent = Agent(Sampler(nvml), shipper, sleep=lambda s: None)
    try:
        for util in (10, 20, 30):
            nvml.gpus[0]["util"] = util
            assert agent.tick() is False
        assert len(shipper.buffer) == 6 and portal.received == []

        portal.up()
        nvml.gpus[0]["util"] = 40
        assert agent.tick() is True
    finally:
        portal.down()
    assert [s["util_pct"] for s in portal.received if s["gpu_index"] == 0] == [10, 20, 30, 40]
    assert len(portal.received) == 8 and shipper.sent == 8 and len(shipper.buffer) == 0


def test_a_full_buffer_drops_the_oldest_samples_and_counts_them():
    shipper = Shipper("http://127.0.0.1:9", "t", capacity=4)
    shipper.add([{"n": i} for i in range(6)])
    assert [s["n"] for s in shipper.buffer] == [2, 3, 4, 5] and shipper.dropped == 2


class ScriptedShipper(Shipper):
    """A shipper whose portal answers from a function of the batch (no network)."""

    def __init__(self, answer):
        super().__init__("http://portal.invalid", "t", batch_size=8)
        self.answer, self.posts = answer, []

    def _post(self, batch):
        self.posts.append([s["n"] for s in batch])
        return self.answer(batch)


@pytest.mark.parametrize("status", [404, 405, 408, 302, 401, 429, 503, None])
def test_only_an_accepted_batch_leaves_the_buffer(status):
    answers = iter([status])
    shipper = ScriptedShipper(lambda batch: next(answers, 201))
    shipper.add([{"n": i} for i in range(5)])
    assert shipper.flush() is False
    assert len(shipper.buffer) == 5 and shipper.sent == 0
    assert shipper.flush() is True
    assert shipper.posts == [[0, 1, 2, 3, 4]] * 2 and shipper.sent == 5 and not shipper.buffer


def test_one_invalid_sample_is_dropped_alone_and_the_rest_of_its_batch_arrives():
    accepted = []

    def answer(batch):
        if any(s["n"] == 5 for s in batch):
            return 400
        accepted.extend(s["n"] for s in batch)
        return 201

    shipper = ScriptedShipper(answer)
    shipper.add([{"n": i} for i in range(11)])
    assert shipper.flush() is True
    assert accepted == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]
    assert shipper.rejected == 1 and shipper.sent == 10 and not shipper.buffer


def test_a_portal_lost_while_splitting_keeps_what_it_did_not_settle():
    answers = iter([400, 201, 400, None])  # [0..7] refused, [0..3] in, [4..7] refused, away
    shipper = ScriptedShipper(lambda batch: next(answers))
    shipper.add([{"n": i} for i in range(8)])
    assert shipper.flush() is False
    assert [s["n"] for s in shipper.buffer] == [4, 5, 6, 7] and shipper.sent == 4


def test_sigterm_stops_the_agent_cleanly_after_a_last_flush():
    portal = Portal()
    portal.up()
    code = (
        "import sys; from clusters.agent.main import main; "
        "from tests.metrics.fake_nvml import FakeNvml; "
        f"sys.exit(main(['--token', 'secret', '--portal', 'http://127.0.0.1:{portal.port}', "
        "'--interval', '60'], nvml=FakeNvml()))"
    )
    root = Path(__file__).resolve().parents[2]
    agent = subprocess.Popen([sys.executable, "-c", code], cwd=root, stderr=subprocess.PIPE)
    try:
        for _ in range(200):
            if len(portal.received) == 2 or agent.poll() is not None:
                break
            threading.Event().wait(0.05)
        assert len(portal.received) == 2  # the first round arrived; now it sleeps 60 s
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=10) == 0
        assert "stopped; 2 samples sent, 0 still buffered" in agent.stderr.read().decode()
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        portal.down()
