"""Demo workloads on the simulated cluster: some run, one borrows, some wait.

Idempotent: a workload is submitted only if its project has none of that name yet.
Needs portal.demo (users, projects) and clusters.demo (the simulated a100 pool) first.
"""

from __future__ import annotations

from typing import Any, TextIO

from portal.models import Department, Project, User
from scheduling.models import Workload, WorkloadPolicy
from scheduling.services import workload_submit

TRAIN_IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"
DEMO: list[tuple[str, str, str, str, dict[str, Any]]] = [
    ("alice", "ml-vision", "resnet50", "training",
     {"gpus": 4, "checkpoint_dir": "/ckpt/resnet50", "duration_s": 3600}),
    ("alice", "ml-vision", "vit-ddp", "distributed",
     {"gpus": 8, "workers": 2, "topology_level": "gpupool.io/rack", "duration_s": 7200,
      "checkpoint_dir": "/ckpt/vit"}),
    ("alice", "ml-vision", "lr-sweep", "hpo",
     {"gpus": 1, "duration_s": 900,
      "search": {"method": "grid", "parameters": {"lr": [0.1, 0.03, 0.01, 0.003]},
                 "parallelism": 2}}),
    ("bob", "nlp-llm", "llm-serve", "inference",
     {"gpu_request": "fraction", "gpus": "0.5", "replicas": 2, "ports": [8000]}),
    ("bob", "nlp-llm", "llm-finetune", "training",
     {"gpus": 8, "checkpoint_dir": "/ckpt/llm", "duration_s": 5400}),
    # Dynamic MIG on the h100 pool (clusters/demo.py): instances cut on demand; the sweep's
    # trials end after a few minutes and the next ones reuse their 1g.10gb instances.
    ("alice", "ml-vision", "eval-mig", "training",
     {"gpu_request": "mig", "mig_profile": "3g.40gb", "duration_s": 3600,
      "node_pools": ["h100"]}),
    ("bob", "nlp-llm", "embed-mig", "training",
     {"gpu_request": "mig", "mig_profile": "auto", "gpu_memory_mib": 9000,
      "duration_s": 5400, "node_pools": ["h100"]}),
    ("alice", "ml-vision", "tok-sweep-mig", "hpo",
     {"gpu_request": "mig", "mig_profile": "1g.10gb", "duration_s": 240,
      "search": {"method": "grid", "parameters": {"vocab": [8000, 16000, 32000, 64000]},
                 "parallelism": 2},
      "node_pools": ["h100"]}),
]  # fmt: skip


def seed(stdout: TextIO) -> None:
    _policy()
    created = 0
    for username, project_name, name, kind, spec in DEMO:
        project = Project.objects.filter(name=project_name).first()
        user = User.objects.filter(username=username).first()
        if project is None or user is None:
            stdout.write(f"Skipped demo workload {name}: no {project_name} or {username}.\n")
            continue
        if Workload.objects.filter(project=project, name=name).exists():
            continue
        workload_submit(
            actor=user,
            project=project,
            kind=kind,
            name=name,
            image=TRAIN_IMAGE,
            command=["python", "train.py"] if kind != "inference" else ["python", "serve.py"],
            **{"node_pools": ["a100"], **spec},
        )
        created += 1
    stdout.write(f"Demo workloads: {created} submitted; the cycle places them.\n")


def _policy() -> None:
    """Vision caps a single workload at 16 GPUs and a day of runtime."""
    vision = Department.objects.filter(name="Vision").first()
    if vision is not None:
        WorkloadPolicy.objects.get_or_create(
            department=vision,
            defaults={"max_gpus_per_workload": 16, "max_runtime_s": 86400},
        )
