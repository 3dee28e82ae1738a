"""Demo data of the workspaces app: the environment catalogue (JupyterLab, an SSH server) and
a platform idle policy."""

from __future__ import annotations

import shutil
import sys
from decimal import Decimal
from pathlib import Path
from typing import TextIO

from clusters.models import NodePool
from portal.models import Project
from workspaces.models import Environment, IdlePolicy, ToolKind, WorkspaceTemplate


def _jupyter_executable() -> str:
    """The demo runs pods on the local backend, which ignores the image: point at the
    jupyter of this Python environment, which need not be on the workers' PATH."""
    beside = Path(sys.executable).with_name("jupyter")
    return str(beside) if beside.exists() else (shutil.which("jupyter") or "jupyter")


SSH_ENVIRONMENT = "SSH server"


def seed(stdout: TextIO) -> None:
    environment, created = Environment.objects.get_or_create(
        name="JupyterLab",
        defaults={
            "description": "JupyterLab with Python 3 and the scientific stack.",
            "image": "quay.io/jupyter/scipy-notebook:2025-06-02",
            "command": [_jupyter_executable(), "lab"],
            "port": 8888,
            "tool_kind": ToolKind.JUPYTERLAB,
            "default_gpus": Decimal("0"),
            "default_cpu": Decimal("1"),
            "default_memory_mib": 4096,
        },
    )
    Environment.objects.get_or_create(
        name=SSH_ENVIRONMENT,
        defaults={
            "description": "A shell over SSH with your profile's keys: for a terminal, PyCharm "
            "or VS Code Remote-SSH (`gpupool ssh`). Image: deploy/images/ssh.",
            "image": "gpupool/ssh-workspace:1",
            "command": [],
            "port": 2222,
            "tool_kind": ToolKind.SSH,
            "default_gpus": Decimal("0"),
            "default_cpu": Decimal("1"),
            "default_memory_mib": 4096,
        },
    )
    IdlePolicy.objects.get_or_create(
        department=None, project=None, defaults={"warn_after_min": 60, "stop_after_min": 120}
    )
    _templates(environment)
    verb = "Created" if created else "Kept"
    stdout.write(f"{verb} workspace environment {environment.name}.\n")


def _templates(environment: Environment) -> None:
    """A one-click CPU notebook on this machine (the demo's local pool) for each project."""
    pool = NodePool.objects.filter(name="local").first()
    if pool is None:
        return
    for project in Project.objects.all():
        WorkspaceTemplate.objects.get_or_create(
            project=project,
            name="CPU notebook on this machine",
            defaults={"environment": environment, "cpu": Decimal("1"), "memory_mib": 4096,
                      "node_pool": pool},
        )  # fmt: skip
