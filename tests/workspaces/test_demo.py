from __future__ import annotations

import io

from clusters.models import NodePool
from workspaces import demo
from workspaces.models import Environment, IdlePolicy, WorkspaceTemplate


def test_the_demo_seed_makes_jupyterlab_and_ssh_environments_and_is_idempotent(org):
    NodePool.objects.create(name="local")
    for _ in range(2):
        demo.seed(io.StringIO())
    environment = Environment.objects.get(name="JupyterLab")
    assert environment.tool_kind == "jupyterlab" and environment.command[-1] == "lab"
    ssh = Environment.objects.get(name=demo.SSH_ENVIRONMENT)
    assert (ssh.tool_kind, ssh.command) == ("ssh", [])
    assert Environment.objects.count() == 2
    assert IdlePolicy.objects.count() == 1
    assert WorkspaceTemplate.objects.count() == 3  # one per project of the org
