"""Resource limits for local pods: each pod in a cgroup of its own, limited to its request's
memory and CPU and to a number of processes; its processes are its cgroup's members. Tried
from inside real pods (what a pod declaring 0.5 CPU and 512 MiB did: fork 1,500 processes,
allocate 3 GiB, spin 4 CPUs, and keep another user's workload Terminating with a copied
token must fail).

These tests fail, not skip, where cgroups cannot be made, unless
GPUPOOL_TEST_ALLOW_NO_CGROUPS=1 says that this machine may go untested."""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import reverse
from rest_framework.test import APIClient

from clusters.backends import BackendError, PodPhase, PodSpec, cgroups
from clusters.backends import local as local_backend
from clusters.backends.local import LocalBackend
from clusters.reconcile import cluster_reconcile
from scheduling.models import WorkloadState
from tests.clusters.conftest import admit, make_cluster, make_node, make_workload
from tests.clusters.test_local_backend import wait_until
from tests.clusters.test_local_sandbox import spec as sandboxed_spec

PY = sys.executable
# Two processes, each spinning.
SPIN = "import os\nos.fork()\nprint('spinning', flush=True)\nwhile True: pass\n"
SLEEP = "import time; time.sleep(60)"


@pytest.fixture
def limits(settings):
    """The machine gives pods limits, or the test fails (an explicit opt-out aside)."""
    support = cgroups.probe(settings.VAR_DIR)
    if not support.available:
        if os.environ.get("GPUPOOL_TEST_ALLOW_NO_CGROUPS") == "1":
            pytest.skip(f"no cgroups here, allowed: {support.reason}")
        pytest.fail(f"this machine cannot make cgroups: {support.reason}")
    return support


@pytest.fixture
def backend(db, limits):
    return LocalBackend(make_cluster(config={"node_name": "here", "pids_max": 32}))


def spec(workload_id: int, code: str, **fields) -> PodSpec:
    """An admin's pod: it runs sandboxed where the machine can, and limited either way."""
    fields.setdefault("memory_mib", 512)
    return sandboxed_spec(workload_id, (PY, "-c", code), submitted_by_admin=True, **fields)


def record_of(backend: LocalBackend, name: str) -> dict:
    return json.loads((backend.state_dir / f"{name}.json").read_text())


def group_of(backend: LocalBackend, name: str) -> cgroups.Group:
    return cgroups.Group.from_dict(record_of(backend, name)["cgroup"])


def finished(backend: LocalBackend, name: str, timeout: float = 30):
    return wait_until(
        lambda: (s := backend.pod_statuses()[name]).phase in (PodPhase.SUCCEEDED, PodPhase.FAILED)
        and s,
        timeout=timeout,
    )


def stop(backend: LocalBackend, *names: str) -> None:
    for name in names:
        status = backend.pod_statuses().get(name)
        if status is not None:
            wait_until(lambda s=status: backend.delete_pod(s, grace_period_s=0))


def test_a_pod_past_its_memory_limit_is_killed_for_it_and_another_pod_lives_on(org, limits):
    """The workload fails as OOMKilled, saying its limit; a neighbour keeps running."""
    cluster = make_cluster(config={"node_name": "here"})
    node = make_node(cluster, "here")
    # 400 MiB, 8 at a time, each page touched; it would end well without its limit.
    grow = "x = [b'\\1' * (8 << 20) for _ in range(50)]\nprint('all there')\n"
    hog = make_workload(org.project_a, org.researcher, "hog", command=[PY, "-c", grow])
    hog.memory_mib = 96
    hog.save(update_fields=["memory_mib"])
    neighbour = make_workload(org.project_b, org.outsider, "calm", command=[PY, "-c", SLEEP])
    neighbour.memory_mib = 96
    neighbour.save(update_fields=["memory_mib"])
    admit(hog, node)
    admit(neighbour, node)
    backend = LocalBackend(cluster)
    try:

        def hog_failed():
            cluster_reconcile(cluster)
            hog.refresh_from_db()
            return hog.state == WorkloadState.FAILED

        wait_until(hog_failed, timeout=60)
        event = hog.events.filter(reason=cgroups.MEMORY_OOM_REASON).get()
        assert "killed for exceeding its memory limit of 96 MiB" in event.message
        neighbour.refresh_from_db()
        assert neighbour.state in (WorkloadState.ADMITTED, WorkloadState.RUNNING)
        assert backend.pod_statuses()[f"gp-{neighbour.pk}-0"].phase == PodPhase.RUNNING
    finally:
        stop(backend, f"gp-{hog.pk}-0", f"gp-{neighbour.pk}-0")


FORK_LOOP = """
import errno, json, os, time
forked, error = 0, None
while forked < 500:
    try:
        pid = os.fork()
    except OSError as exc:
        error = exc.errno
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    forked += 1
print(json.dumps({"forked": forked, "error": error}), flush=True)
"""


def test_a_fork_loop_stops_at_the_pods_process_limit(backend):
    backend.ensure_pod(spec(1, FORK_LOOP))
    try:
        status = finished(backend, "gp-1-0")
        output = backend.pod_logs("gp-1-0", "ns")
        assert status.phase == PodPhase.SUCCEEDED, output
        report = json.loads(output.strip().splitlines()[-1])
        # pids_max 32 counts the wrapper, the sandbox's own processes and the loop itself.
        assert report == {"forked": report["forked"], "error": errno.EAGAIN}
        assert report["forked"] < 32
    finally:
        stop(backend, "gp-1-0")


def test_a_cpu_bound_pod_uses_no_more_than_its_cpus(backend):
    """Two spinning processes would take what CPU the machine has; a quota of 0.1 CPU
    holds them to about that (asserted with a wide margin from the group's own usage, not
    a wall-clock budget). A small quota, so that it shows even on a loaded machine, where
    an unlimited spinner may get only a fraction of a core."""
    backend.ensure_pod(spec(1, SPIN, cpu=0.1))
    group = group_of(backend, "gp-1-0")
    try:
        wait_until(lambda: "spinning" in backend.pod_logs("gp-1-0", "ns"))
        used, since = group.cpu_usage_s(), time.monotonic()
        time.sleep(3)
        rate = (group.cpu_usage_s() - used) / (time.monotonic() - since)
        assert rate < 0.3
        assert group.throttled_periods() > 0  # it ran out of its quota
    finally:
        stop(backend, "gp-1-0")


def test_a_process_that_copies_another_pods_token_is_not_that_pod(backend):
    """bob's pod runs a process with alice's GPUPOOL_POD_TOKEN in its environment: stopping
    alice's pod neither waits for it nor signals it."""
    backend.ensure_pod(spec(1, SLEEP))
    token = record_of(backend, "gp-1-0")["token"]
    copier = (
        "import os, sys\n"
        f"os.execve(sys.executable, [sys.executable, '-c', {SLEEP!r}],"
        f" {{'GPUPOOL_POD_TOKEN': {token!r}}})\n"
    )
    backend.ensure_pod(spec(2, copier))
    bob = group_of(backend, "gp-2-0")
    try:
        wait_until(lambda: any(_has_token(pid, token) for pid in bob.pids()))
        alice = backend.pod_statuses()["gp-1-0"]
        wait_until(lambda: backend.delete_pod(alice, grace_period_s=30), timeout=5)
        assert backend.pod_statuses()["gp-2-0"].phase == PodPhase.RUNNING
        assert any(_has_token(pid, token) for pid in bob.pids())  # never signalled
    finally:
        stop(backend, "gp-1-0", "gp-2-0")


def _has_token(pid: int, token: str) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"GPUPOOL_POD_TOKEN={token}".encode() in environ


def test_a_pods_processes_are_its_cgroups_and_the_cgroup_goes_when_the_pod_ends(backend):
    backend.ensure_pod(spec(1, "print('done')"))
    group = group_of(backend, "gp-1-0")
    status = finished(backend, "gp-1-0")
    assert status.phase == PodPhase.SUCCEEDED
    assert not group.exists()  # gone once nothing is left in it
    assert backend.delete_pod(status, grace_period_s=0)
    parent = Path(group.procs_files()[0]).parent.parent
    assert parent.name == cgroups.parent_name(settings.VAR_DIR)
    assert not parent.exists()  # the installation's group goes with its last pod


def test_a_stopped_pods_cgroup_goes_with_it(backend):
    status = backend.ensure_pod(spec(1, SLEEP))
    group = group_of(backend, "gp-1-0")
    wait_until(lambda: group.pids())
    wait_until(lambda: backend.delete_pod(status, grace_period_s=0))
    assert not group.exists()


# The workload's pids_max (None: the cluster's), the cluster's, and what the pod runs under:
# the workload's, up to the cluster's (its admin's ceiling).
PIDS = {"cluster's": (None, None, 1024), "fewer": (64, None, 64), "above": (4096, 2048, 2048)}


@pytest.mark.parametrize("case", PIDS)
def test_the_workload_page_shows_the_limits_the_pod_runs_under(org, client_as, limits, case):
    asked, ceiling, pids = PIDS[case]
    cluster = make_cluster(
        config={"node_name": "here", **({"pids_max": ceiling} if ceiling else {})}
    )
    node = make_node(cluster, "here")
    workload = make_workload(org.project_a, org.researcher, "nb", command=[PY, "-c", SLEEP])
    workload.cpu, workload.memory_mib, workload.pids_max = 0.5, 512, asked
    workload.save(update_fields=["cpu", "memory_mib", "pids_max"])
    admit(workload, node)
    cluster_reconcile(cluster)
    try:
        page = client_as(org.researcher).get(f"/workloads/{workload.pk}/").content.decode()
        assert f"0.5 CPU · 512 MiB memory · {pids} processes" in page
        assert f"cgroup v{limits.version}" in page
        api = APIClient()
        api.force_authenticate(org.researcher)
        body = api.get(reverse("api-workload", args=[workload.pk])).json()
        assert body["pids_max"] == asked
        assert body["allocations"][0]["pod_limits"] == {
            "limited": True, "version": limits.version, "memory_mib": 512, "cpus": 0.5,
            "pids": pids,
        }  # fmt: skip
        group = group_of(LocalBackend(cluster), f"gp-{workload.pk}-0")
        assert (group._folder("pids") / "pids.max").read_text().strip() == str(pids)  # the kernel's
        LocalBackend(cluster).list_inventory()  # the worker's answer, for the clusters page
        page = client_as(org.platform_admin).get("/clusters/").content.decode()
        assert "limits enforced" in page and "no limits" not in page
    finally:
        stop(LocalBackend(cluster), f"gp-{workload.pk}-0")


def test_without_cgroup_controllers_pods_run_unlimited_and_every_page_says_so(
    org, client_as, monkeypatch, tmp_path
):
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("22 1 0:21 / /proc rw - proc proc rw\n")
    monkeypatch.setattr(cgroups, "MOUNTINFO", mountinfo)
    monkeypatch.setattr(cgroups, "_probed", {})
    cluster = make_cluster(config={"node_name": "here"})
    node = make_node(cluster, "here")
    workload = make_workload(org.project_a, org.researcher, "nb", command=[PY, "-c", SLEEP])
    admit(workload, node)
    cluster_reconcile(cluster)  # the pod starts, without limits
    backend = LocalBackend(cluster)
    try:
        assert backend.pod_statuses()[f"gp-{workload.pk}-0"].phase == PodPhase.RUNNING
        page = client_as(org.researcher).get(f"/workloads/{workload.pk}/").content.decode()
        assert "no limits: this machine has no cgroup controllers" in page
        backend.list_inventory()  # the worker's answer, for the clusters page
        page = client_as(org.platform_admin).get("/clusters/").content.decode()
        assert "no limits" in page and "this machine has no cgroup controllers" in page
    finally:
        stop(backend, f"gp-{workload.pk}-0")


def test_v2_is_chosen_where_the_unified_hierarchy_has_the_controllers(monkeypatch, tmp_path):
    """A stand-in for a systemd machine's /sys/fs/cgroup (a cgroup2 mount with memory, cpu
    and pids), checked for what the kernel reads: the files and values written."""
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        f"30 1 0:26 / {root} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
        "31 1 0:27 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    )
    monkeypatch.setattr(cgroups, "MOUNTINFO", mountinfo)
    hierarchy = cgroups.find_hierarchy()
    assert hierarchy == cgroups.Hierarchy(2, {"": root})
    group = cgroups.Group.under(hierarchy, "gpupool-x", "c1-gp-1-0")
    group.create(cgroups.Limits(memory_mib=512, cpus=0.5, pids=1024))
    folder = root / "gpupool-x" / "c1-gp-1-0"
    assert (folder / "memory.max").read_text() == str(512 << 20)
    assert (folder / "memory.swap.max").read_text() == "0"
    assert (folder / "cpu.max").read_text() == "50000 100000"
    assert (folder / "pids.max").read_text() == "1024"
    assert (root / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    assert group.procs_files() == [str(folder / "cgroup.procs")]


def test_v1_is_chosen_without_a_unified_hierarchys_controllers_and_cpuacct_may_share_cpus(
    monkeypatch, tmp_path
):
    """As on this project's machines: a cgroup2 mount with no controllers, and v1 ones (here
    cpu and cpuacct mounted together, as many distributions do)."""
    unified = tmp_path / "unified"
    unified.mkdir()
    (unified / "cgroup.controllers").write_text("\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        f"30 1 0:26 / {unified} rw - cgroup2 cgroup2 rw\n"
        "31 1 0:27 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "32 1 0:28 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
        "33 1 0:29 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
    )
    monkeypatch.setattr(cgroups, "MOUNTINFO", mountinfo)
    assert cgroups.find_hierarchy() == cgroups.Hierarchy(
        1,
        {
            "memory": Path("/sys/fs/cgroup/memory"),
            "cpu": Path("/sys/fs/cgroup/cpu,cpuacct"),
            "pids": Path("/sys/fs/cgroup/pids"),
        },
    )
    mountinfo.write_text("31 1 0:27 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n")
    assert cgroups.find_hierarchy() is None  # no cpu or pids controller: no limits


def test_a_bad_pids_max_in_the_config_is_bounded():
    assert cgroups.limits_of(512, 0.5, {"pids_max": 10**9}).pids == 1_048_576
    assert cgroups.limits_of(512, 0.5, {"pids_max": 1}).pids == 16
    assert cgroups.limits_of(512, 0.5, {"pids_max": "lots"}).pids == 1024
    assert cgroups.limits_of(512, 0.5, None) == cgroups.Limits(512, 0.5, 1024)


def test_a_record_without_a_pid_is_found_again_by_its_cgroup(backend, monkeypatch):
    """A worker that crashed between writing the record and the spawn: the process is found
    in the pod's cgroup and never started twice."""
    status = backend.ensure_pod(spec(1, SLEEP))
    record = record_of(backend, "gp-1-0")
    wrapper = record["pid"]
    wait_until(lambda: wrapper in group_of(backend, "gp-1-0").pids())  # it entered its group
    record.update(pid=None, start_time=None, token="not-in-any-environment")
    (backend.state_dir / "gp-1-0.json").write_text(json.dumps(record))
    monkeypatch.setattr(local_backend, "_CHILDREN", {})
    try:
        again = backend.ensure_pod(spec(1, SLEEP))
        assert again.phase == PodPhase.RUNNING
        assert again.backend_ref == status.backend_ref
        assert status.backend_ref.startswith(f"{wrapper}:")
    finally:
        record.update(pid=wrapper, start_time=status.backend_ref.partition(":")[2])
        (backend.state_dir / "gp-1-0.json").write_text(json.dumps(record))
        stop(backend, "gp-1-0")


def test_a_pod_whose_cgroup_cannot_be_made_does_not_start_and_leaves_nothing(backend, monkeypatch):
    """A knob the kernel refuses (a read-only controller): the pod is not run unlimited; the
    reconcile tries again later, with no record, group or namespace left behind."""

    def refuse(group, limits):
        raise PermissionError(13, "Permission denied", "memory.limit_in_bytes")

    monkeypatch.setattr(cgroups.Group, "_write_limits", refuse)
    with pytest.raises(BackendError, match="cannot make the pod's cgroup"):
        backend.ensure_pod(spec(1, SLEEP))
    assert backend.pod_statuses() == {}
    parent = Path(settings.VAR_DIR)  # anything of this test's installation under the cgroups
    name = cgroups.parent_name(parent)
    assert not any(Path("/sys/fs/cgroup").glob(f"*/{name}"))
    assert not any(Path("/sys/fs/cgroup").glob(name))
    assert not backend._netns_path(1).exists()
