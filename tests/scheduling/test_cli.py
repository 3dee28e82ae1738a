"""The gpupool CLI against a live test server: real HTTP, the real token endpoint."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from click.testing import CliRunner
from django.utils import timezone

from scheduling.cli import main
from scheduling.cycle import cycle_run
from scheduling.models import Workload, WorkloadPolicy, WorkloadState
from tests import factories as f
from tests.scheduling.conftest import outgrown
from workspaces.models import Environment, Workspace

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def gp(live_server, tmp_path, monkeypatch):
    """gp("list") runs the CLI in-process with its config in a temporary folder."""
    monkeypatch.setenv("GPUPOOL_CONFIG_DIR", str(tmp_path))
    monkeypatch.delenv("GPUPOOL_URL", raising=False)
    monkeypatch.delenv("GPUPOOL_TOKEN", raising=False)
    runner = CliRunner()

    def run(*args: str, ok: bool = True):
        result = runner.invoke(main, list(args), catch_exceptions=False)
        assert (result.exit_code == 0) is ok, result.output
        return result.output

    run.url = live_server.url
    run.config_dir = tmp_path
    return run


@pytest.fixture
def logged_in(gp, org):
    gp("login", "--url", gp.url, "--username", "rita", "--password", f.PASSWORD)
    return gp


def test_login_saves_the_token_and_a_wrong_password_fails_with_the_apis_message(gp, org):
    out = gp("login", "--url", gp.url, "--username", "rita", "--password", "nope", ok=False)
    assert "Unknown username or wrong password." in out
    out = gp("login", "--url", gp.url, "--username", "rita", "--password", f.PASSWORD)
    assert out.startswith(f"Logged in to {gp.url} as rita. The token expires at 20")
    config = json.loads((gp.config_dir / "config.json").read_text())
    assert config["username"] == "rita" and len(config["token"]) == 64
    assert oct((gp.config_dir / "config.json").stat().st_mode & 0o777) == "0o600"


def test_an_expired_token_says_to_log_in_again(logged_in, org):
    from knox.models import AuthToken

    AuthToken.objects.filter(user=org.researcher).update(expiry=timezone.now())
    out = logged_in("list", ok=False)
    assert "Invalid token." in out and "run `gpupool login` again" in out


def test_commands_before_login_say_how_to_log_in(gp, org):
    assert "run `gpupool login --url URL` first" in gp("list", ok=False)
    (gp.config_dir / "config.json").write_text("{not json")
    assert "Cannot read" in gp("list", ok=False)
    assert "Log in again." in gp("list", ok=False)
    gp("login", "--url", gp.url, "--username", "rita", "--password", f.PASSWORD)
    assert json.loads((gp.config_dir / "config.json").read_text())["username"] == "rita"


def test_project_list_and_set(logged_in):
    out = logged_in("project", "list")
    assert "ml-vision" in out and "nlp" not in out
    assert (
        logged_in("project", "set", "nlp", ok=False)
        .strip()
        .endswith("No project nlp among yours: ml-vision.")
    )
    logged_in("project", "set", "ml-vision")
    assert "*        ml-vision" in logged_in("project", "list")


def test_submit_each_kind_then_list_describe_stop_delete(logged_in, org, cluster):
    gp = logged_in
    gp("project", "set", "ml-vision")
    out = gp("submit", "training", "resnet", "--image", "img", "--gpus", "2", "-e", "A=1",
             "--checkpoint-dir", "/ckpt", "--", "python", "train.py", "--lr", "0.1")  # fmt: skip
    wl = Workload.objects.get(name="resnet")
    assert out.strip().splitlines() == [
        f"Submitted ml-vision/resnet (id {wl.pk}): pending.",
        "Warning: Only simulated pools can take it (a100): nothing will run.",
    ]
    assert (wl.command, wl.env, wl.gpus, wl.checkpoint_dir) == (
        ["python", "train.py", "--lr", "0.1"],
        {"A": "1"},
        2,
        "/ckpt",
    )
    gp(
        "submit",
        "distributed",
        "ddp",
        "--image",
        "img",
        "--gpus",
        "1",
        "--workers",
        "3",
        "--master",
    )
    gp("submit", "inference", "svc", "--image", "img", "--gpus", "0.5", "--replicas", "2",
       "--port", "8000")  # fmt: skip
    Environment.objects.create(name="lab", image="jupyter", command=["jupyter", "lab"])
    out = gp("submit", "workspace", "nb", "--gpus", "1", "--node-pool", "a100", "-e", "B=2")
    nb = Workspace.objects.get(workload__name="nb")
    assert out.strip() == (
        f"Submitted workspace ml-vision/nb (id {nb.workload_id}): pending. "
        f"Open it at {gp.url}/workspaces/{nb.workload_id}/lab/"
    )
    assert (nb.environment.name, nb.workload.image, nb.workload.env["B"]) == ("lab", "jupyter", "2")
    Environment.objects.create(name="vscode", image="code-server")
    out = gp("submit", "workspace", "nb2", "--node-pool", "a100", ok=False)
    assert "Choose --environment among: lab, vscode." in out
    out = gp("submit", "workspace", "nb2", "--environment", "nope", ok=False)
    assert "environment: Object with name=nope does not exist." in out
    kinds = dict(Workload.objects.values_list("name", "kind"))
    assert kinds == {
        "resnet": "training",
        "ddp": "distributed",
        "svc": "inference",
        "nb": "workspace",
    }
    svc = Workload.objects.get(name="svc")
    assert (svc.gpu_request, svc.pods, svc.spec["ports"]) == (
        "fraction",
        2,
        [{"name": "http", "port": 8000, "protocol": "http"}],
    )
    assert Workload.objects.get(name="nb").spec["ports"] == [
        {"name": "http", "port": 8888, "protocol": "http"}
    ]
    cycle_run()
    listing = gp("list")
    assert listing.splitlines()[0].split() == [
        "ID", "NAME", "PROJECT", "KIND", "STATE", "GPUS", "GPUS_ALLOCATED", "NODE"
    ]  # fmt: skip
    assert any(line.split()[1:7] == ["resnet", "ml-vision", "training", "admitted", "2", "2"]
               for line in listing.splitlines())  # fmt: skip
    # GPUS is the whole workload's, as the pages show it: 2 replicas of half a GPU, 1 GPU
    # on each of the distributed job's pods.
    assert any(line.split()[1:6] == ["svc", "ml-vision", "inference", "admitted", "1"]
               for line in listing.splitlines()), listing  # fmt: skip
    ddp = Workload.objects.get(name="ddp")
    assert ddp.pods > 1
    assert any(line.split()[1:4] == ["ddp", "ml-vision", "distributed"]
               and line.split()[5] == str(ddp.pods) for line in listing.splitlines())  # fmt: skip
    described = gp("describe", str(wl.pk))
    assert "Admitted" in described and "a100-node-" in described
    assert gp("stop", str(wl.pk)).strip() == "resnet: stopped."
    assert "resnet has already stopped." in gp("stop", str(wl.pk), ok=False)
    assert "pods of resnet are still stopping" in gp("delete", str(wl.pk), ok=False)
    out = gp("submit", "training", "too-big", "--image", "img", "--gpus", "16", ok=False)
    assert "gpus: No node of pool a100 can hold 16 GPUs for one pod" in out
    # Each pod fits a node, the gang does not fit the cluster: it waits.
    gp("submit", "distributed", "too-big", "--image", "img", "--gpus", "4", "--workers", "3")
    cycle_run()
    waiting = Workload.objects.get(name="too-big")
    assert waiting.state == WorkloadState.PENDING
    assert gp("delete", str(waiting.pk)).strip() == f"Deleted workload {waiting.pk}."
    assert not Workload.objects.filter(pk=waiting.pk).exists()


def test_refusals_exit_non_zero_with_the_field_messages(logged_in, org):
    out = logged_in("submit", "training", "Bad_Name", "--image", "img", "--project",
                    "ml-vision", ok=False)  # fmt: skip
    assert "name: Use 1 to 63 lower-case letters" in out
    out = logged_in("submit", "training", "x", "--image", "img", "--project", "nlp", ok=False)
    assert "project: No project nlp that you can see." in out
    assert "No workload 999999 that you can see." in logged_in("describe", "999999", ok=False)


def test_policy_refusals_exit_non_zero_naming_the_rule(logged_in, org):
    WorkloadPolicy.objects.create(project=org.project_a, max_gpus_per_workload=2)
    WorkloadPolicy.objects.create(department=org.dept_a, allowed_kinds=["training"])
    out = logged_in("submit", "training", "big", "--image", "img", "--gpus", "4",
                    "--project", "ml-vision", ok=False)  # fmt: skip
    assert "gpus: Refused by policy 'max GPUs per workload' of project ml-vision" in out
    out = logged_in("submit", "inference", "svc", "--image", "img", "--port", "80",
                    "--project", "ml-vision", ok=False)  # fmt: skip
    assert "kind: Refused by policy 'allowed kinds' of department vision: only training." in out
    assert not Workload.objects.exists()


def test_queue_and_logs(logged_in, org, cluster, submit):
    wl = outgrown(submit, org.researcher, org.project_a, "big", gpus=16)
    cycle_run()
    out = logged_in("queue")
    assert "ml-vision" in out and "Needs 16 GPUs in pool a100" in out
    assert "has not run on a cluster yet" in logged_in("logs", str(wl.pk), ok=False)


SCRIPT = shutil.which("gpupool") or (
    ".venv/bin/gpupool" if os.path.exists(".venv/bin/gpupool") else None
)


@pytest.mark.skipif(SCRIPT is None, reason="not installed: run pip install --no-deps -e .")
def test_the_installed_console_script_talks_to_the_server(gp, org, tmp_path):
    script = SCRIPT
    env = {**os.environ, "GPUPOOL_CONFIG_DIR": str(tmp_path / "cfg")}
    login = subprocess.run(
        [script, "login", "--url", gp.url, "--username", "rita", "--password", f.PASSWORD],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert login.returncode == 0, login.stderr
    bad = subprocess.run([script, "describe", "424242"], env=env, capture_output=True, text=True,
                         timeout=60, check=False)  # fmt: skip
    assert bad.returncode == 1 and "No workload 424242 that you can see." in bad.stderr


def test_gpu_amounts_show_at_most_two_decimals_without_trailing_zeros():
    from scheduling.cli import amount, table

    assert [amount(v) for v in ("2.00", 2, 0.5, "0.30000000000000004", 2 / 3, "1.005")] == [
        "2", "2", "0.5", "0.3", "0.67", "1.01"
    ]  # fmt: skip
    assert amount("n/a") == "n/a"
    assert table([{"gpus": "4.00", "name": "2.50"}], ["name", "gpus"]).splitlines()[1].split() == [
        "2.50", "4"
    ]  # fmt: skip


def test_an_elastic_range_is_submitted_listed_and_described(logged_in, org, cluster):
    gp = logged_in
    gp("project", "set", "ml-vision")
    gp("submit", "training", "el", "--image", "img", "--gpus", "1", "--min-pods", "2",
       "--max-pods", "6", "--", "python", "train.py")  # fmt: skip
    wl = Workload.objects.get(name="el")
    assert (wl.elastic, wl.min_pods, wl.pods, wl.handles_resize) == (True, 2, 6, False)
    out = gp("submit", "training", "bad", "--image", "img", "--gpus", "1", "--min-pods", "7",
             "--max-pods", "6", ok=False)  # fmt: skip
    assert "min_pods" in out and "The minimum (7) is more than the maximum (6)." in out
    gp("submit", "inference", "svc", "--image", "img", "--gpus", "1", "--port", "8000",
       "--min-replicas", "1", "--max-replicas", "2", "--scale-target", "60")  # fmt: skip
    svc = Workload.objects.get(name="svc")
    assert (svc.min_pods, svc.pods, svc.spec["scale_target"]) == (1, 2, 60.0)
    cycle_run()
    listed = gp("list")
    assert "0/2..6" not in listed and "6/2..6" in listed and "1/1..2" in listed
    assert "size:           6 (min 2, max 6)" in gp("describe", str(wl.pk))


def test_the_cli_says_whether_work_will_really_run_before_and_after(logged_in, org, cluster):
    """A submit without --node-pool once landed on a simulated pool and nothing said so
    (issue 28): the answer says where it may run, and describe says where it ran."""
    from clusters.models import Cluster, NodePool
    from tests.scheduling.conftest import make_nodes

    local = NodePool.objects.create(name="local")
    Cluster.objects.create(name="here", backend="local")
    make_nodes(local, 1, gpus=0, cluster_name="here")
    gp = logged_in
    gp("project", "set", "ml-vision")
    out = gp("submit", "training", "either", "--image", "img", "--gpus", "0")
    assert (
        "Note: It may land on a simulated pool (a100), where nothing runs, or on local, "
        "where it runs for real; --node-pool chooses." in out
    )
    out = gp("submit", "training", "real", "--image", "img", "--gpus", "0", "--node-pool", "local")
    assert "Runs for real, in local." in out and "Warning" not in out
    out = gp("submit", "training", "sim", "--image", "img", "--node-pool", "a100")
    assert (
        "Warning: Only simulated pools can take it (a100): nothing will run. Pools with "
        "real nodes: local (no GPUs) (--node-pool)." in out
    )
    # A GPU job cannot land on a pool without GPUs: it is not offered as a place to run.
    out = gp("submit", "training", "gpu-any", "--image", "img", "--gpus", "1")
    assert "Warning: Only simulated pools can take it (a100)" in out
    wl = Workload.objects.get(name="sim")
    wl.cluster = Cluster.objects.get(name="sim")
    wl.save()
    out = gp("describe", str(wl.pk))
    assert "runs:           Simulated (cluster sim): nothing runs; its log is a note" in out


def test_project_alone_shows_the_default(logged_in, org):
    gp = logged_in
    assert "No default project: `gpupool project set NAME`" in gp("project")
    gp("project", "set", "ml-vision")
    assert gp("project").strip() == "Default project: ml-vision."


def test_describe_says_what_an_admitted_workloads_pods_wait_for(logged_in, org, cluster):
    """What the cluster holds an admitted workload's pods back for (a native sharer
    waiting for its GPU's MPS daemon: clusters.reconcile._record_waits, tested against the
    in-suite API server in tests/clusters/test_native_fractions.py) is said by describe."""
    gp = logged_in
    gp("project", "set", "ml-vision")
    gp("submit", "training", "held", "--image", "img", "--gpus", "1")
    cycle_run()
    wl = Workload.objects.get(name="held")
    assert wl.state == WorkloadState.ADMITTED
    assert "why:" not in gp("describe", str(wl.pk))
    waits = "Waiting for the MPS daemon of GPU GPU-8f2c on node a100-node-0: upgrade it."
    Workload.objects.filter(pk=wl.pk).update(pending_reason=waits)
    assert f"why:            {waits}" in gp("describe", str(wl.pk))
