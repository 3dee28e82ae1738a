"""What the workspace page shows: the idle warning with its button, and no way in for
people the tool is not shared with."""

from __future__ import annotations

from django.utils import timezone

from scheduling.models import Workload
from tests.workspaces.helpers import make_running_workspace
from workspaces.models import IdlePolicy, IdleState


def _warned(org):
    IdlePolicy.objects.create(project=org.project_a, warn_after_min=10, stop_after_min=30)
    workspace = make_running_workspace(owner=org.researcher, project=org.project_a)
    workspace.idle_state, workspace.warned_at = IdleState.WARNED, timezone.now()
    workspace.save()
    return workspace


def test_the_owner_sees_the_idle_warning_with_a_keep_running_button(client_as, org):
    workspace = _warned(org)
    page = client_as(org.researcher).get(f"/workspaces/{workspace.workload_id}/").content.decode()
    assert "will be stopped after 30 idle minutes" in page
    assert f'action="/workspaces/{workspace.workload_id}/keep-running/"' in page


def test_a_viewer_of_the_project_sees_the_warning_but_cannot_open_or_keep_it(client_as, org):
    from tests import factories as f

    viewer = f.make_user("vera")
    f.make_membership(viewer, role=f.Role.VIEWER, project=org.project_a)
    workspace = _warned(org)
    page = client_as(viewer).get(f"/workspaces/{workspace.workload_id}/").content.decode()
    assert "will be stopped" in page
    assert "keep-running" not in page and 'id="open-lab"' not in page
    assert "Only the owner" in page
    refused = client_as(viewer).post(f"/workspaces/{workspace.workload_id}/keep-running/")
    assert refused.status_code == 403


def test_a_pending_workspace_shows_why_it_waits(client_as, org):
    workspace = make_running_workspace(owner=org.researcher, project=org.project_a)
    workload = workspace.workload
    workload.state, workload.pending_reason = "pending", "Project ml-vision is at its GPU limit."
    workload.save()
    workload.allocations.all().delete()
    page = client_as(org.researcher).get(f"/workspaces/{workspace.workload_id}/status/")
    assert "at its GPU limit" in page.content.decode()


def test_gpu_samples_over_the_threshold_in_the_window_count_as_use(org):
    from datetime import timedelta

    from clusters.metrics.models import GpuSample
    from workspaces.culling import gpu_busy

    policy = IdlePolicy.objects.create(project=org.project_a, warn_after_min=10, stop_after_min=30)
    workspace = make_running_workspace(owner=org.researcher, project=org.project_a)
    now = timezone.now()

    def sample(minutes_ago: int, util: float) -> None:
        GpuSample.objects.create(ts=now - timedelta(minutes=minutes_ago), node_id=1, gpu_index=0,
                                 util_pct=util, workload_id=workspace.workload_id)  # fmt: skip

    sample(minutes_ago=2, util=3)  # under the 5 % threshold
    sample(minutes_ago=20, util=90)  # busy, but before the window
    assert not gpu_busy(workspace, now=now, policy=policy)
    sample(minutes_ago=5, util=40)
    assert gpu_busy(workspace, now=now, policy=policy)


def test_the_beat_task_checks_running_workspaces_once_at_a_time(org):
    from portal.leases import lease
    from workspaces.tasks import LEASE, cull_idle_workspaces

    make_running_workspace(owner=org.researcher, project=org.project_a)  # no policy: skipped
    assert cull_idle_workspaces.delay().get() == {"skip": 1}
    with lease(LEASE, 60) as held:
        assert held
        assert cull_idle_workspaces.delay().get() is None  # another run holds the lease
    assert cull_idle_workspaces.delay().get() == {"skip": 1}


def test_the_workspace_page_shows_memory_in_gib_and_gpu_samples_in_readable_units(client_as, org):
    from clusters.metrics.models import GpuSample
    from scheduling.models import Workload

    workspace = make_running_workspace(owner=org.researcher, project=org.project_a)
    Workload.objects.filter(pk=workspace.workload_id).update(memory_mib=6144, gpu_memory_mib=20480)
    GpuSample.objects.create(
        node_id=workspace.workload.allocations.get().node_id, gpu_index=0, ts=timezone.now(),
        util_pct=50,
        mem_used_mib=30720, mem_total_mib=81920, workload_id=workspace.workload_id,
    )  # fmt: skip
    page = client_as(org.researcher).get(f"/workspaces/{workspace.workload_id}/").content.decode()
    assert "20 GiB GPU memory" in page and "6 GiB memory" in page
    assert "30 GiB / 80 GiB" in page


def test_the_open_button_of_a_tool_without_jupyters_api_appears_once_it_answers(client_as, org):
    """TensorBoard or VS Code server have no /api/status: any answer at the base URL
    (here a real HTTP server's 404) means the tool is up; a Jupyter kind still needs 200."""
    import subprocess
    import sys

    from tests.workspaces.helpers import free_port, kill_group, wait_until
    from workspaces.jupyter import tool_answers
    from workspaces.models import Environment, ToolKind

    port = free_port()
    workspace = make_running_workspace(
        owner=org.researcher, project=org.project_a, endpoint=f"127.0.0.1:{port}"
    )
    workspace.environment = Environment.objects.create(
        name="TensorBoard", image="tb", command=["tensorboard"], tool_kind=ToolKind.TENSORBOARD
    )
    workspace.save()
    page = f"/workspaces/{workspace.workload_id}/status/"
    assert not tool_answers(workspace)  # nothing listens yet
    assert 'id="open-lab"' not in client_as(org.researcher).get(page).content.decode()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        wait_until(lambda: tool_answers(workspace), 30, "the tool to answer")
        assert "Open TensorBoard" in client_as(org.researcher).get(page).content.decode()
        workspace.environment.tool_kind = ToolKind.JUPYTERLAB
        assert not tool_answers(workspace)  # a 404 at /api/status is no Jupyter
    finally:
        kill_group(server.pid)
        server.wait(timeout=10)


def test_the_list_marks_only_running_workspaces_as_idle(client_as, org):
    workspace = _warned(org)
    badge = '<span class="badge state-pending">idle</span>'
    assert badge in client_as(org.researcher).get("/workspaces/").content.decode()
    workspace.workload.state = "stopped"  # stopped by its owner while warned
    workspace.workload.save()
    assert badge not in client_as(org.researcher).get("/workspaces/").content.decode()


def test_the_refreshed_status_carries_the_buttons_that_fit_the_state(client_as, org):
    # The page polls this fragment: a workspace culled while its page is open must swap
    # "Stop workspace" for "Launch again" without a reload.
    workspace = make_running_workspace(owner=org.researcher, project=org.project_a)
    url = f"/workspaces/{workspace.workload_id}/status/"
    page = client_as(org.researcher).get(url).content.decode()
    assert "Stop workspace" in page and 'id="launch-again"' not in page
    Workload.objects.filter(pk=workspace.workload_id).update(state="stopped")
    page = client_as(org.researcher).get(url).content.decode()
    assert "Stop workspace" not in page and 'id="launch-again"' in page
    assert client_as(org.outsider).get(url).status_code in (403, 404)
