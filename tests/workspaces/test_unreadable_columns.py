"""A text in a workspaces number or date (issue 27, bad rows): SQLite keeps what another
writer puts in an environment's port, a template's GPUs, an idle policy's minutes or a
workspace's warned_at. Such a value loads as its stand-in (portal.tolerant), so the pages
answer; culling leaves a workspace it cannot judge alone, saying why, instead of reading
"stop after -1 minutes" or "warned in 1970" as a reason to stop it, and culls the others."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from scheduling.models import WorkloadState
from tests.planted import plant_text
from tests.workspaces.helpers import make_running_workspace
from workspaces.culling import workspace_cull_check, workspaces_cull
from workspaces.models import Environment, IdlePolicy, WorkspaceTemplate

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "sqlite", reason="PostgreSQL refuses the text"),
]

PLANTED = {
    "policy-stop": ("policy", {"stop_after_min": "abc"}),
    "policy-warn": ("policy", {"warn_after_min": "soon"}),
    "policy-threshold": ("policy", {"gpu_util_threshold_pct": "x"}),
    "warned_at": ("workspace", {"warned_at": "2026-13-45 10:00:00", "idle_state": "warned"}),
    "kept_alive_at": ("workspace", {"kept_alive_at": "yesterday"}),
}


@pytest.mark.parametrize("case", PLANTED)
def test_culling_leaves_a_workspace_it_cannot_judge_alone_and_culls_the_others(org, case):
    row, columns = PLANTED[case]
    bad = make_running_workspace(owner=org.researcher, project=org.project_a, name="bad")
    other = make_running_workspace(owner=org.outsider, project=org.project_b, name="other")
    rows = {
        "policy": IdlePolicy.objects.create(
            project=org.project_a, warn_after_min=10, stop_after_min=30
        ),
        "workspace": bad,
    }
    IdlePolicy.objects.create(project=org.project_b, warn_after_min=10, stop_after_min=30)
    assert "text" in plant_text(rows[row], **columns)
    now = timezone.now() + timedelta(hours=5)  # both tools silent since their start

    assert workspaces_cull(now=now) == {"skip": 1, "warn": 1}

    decision = workspace_cull_check(type(bad).objects.get(pk=bad.pk), now=now)
    assert decision.action == "skip" and next(iter(columns)) in decision.reason, decision
    bad.workload.refresh_from_db()
    assert bad.workload.state == WorkloadState.RUNNING
    other.refresh_from_db()
    assert other.idle_state == "warned"


def test_a_text_in_an_environment_or_template_breaks_no_page(org, client_as):
    lab = Environment.objects.create(name="Lab", image="lab", command=["jupyter", "lab"])
    template = WorkspaceTemplate.objects.create(project=org.project_a, name="t", environment=lab)
    IdlePolicy.objects.create(project=org.project_a, warn_after_min=10, stop_after_min=30)
    plant_text(lab, port="abc", default_cpu="abc", default_gpus="NaN", default_memory_mib="x")
    plant_text(template, gpus="abc", cpu="x", memory_mib="abc", gpu_memory_mib="x")
    plant_text(IdlePolicy.objects.get(), stop_after_min="abc")

    admin = client_as(org.platform_admin)
    for name in ("environments", "templates", "idle_policies", "list"):
        assert admin.get(reverse(f"workspaces:{name}")).status_code == 200, name
    launch = client_as(org.researcher).get(reverse("workspaces:launch"))
    assert launch.status_code == 200
