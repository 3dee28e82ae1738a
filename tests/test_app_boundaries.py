"""Scheduling decides, clusters apply and report back: the imports between the two apps go
one way each, through named doors, with no late import hiding a circle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What scheduling (outside its pure engine) may use of clusters: the inventory and reads.
SCHEDULING_MAY_USE = {
    "clusters.models",
    "clusters.selectors",
    # A manifest a user submits ("From YAML") is an object for the cluster, created as it is
    # (checked there); the cluster's intake then queues it like one made with kubectl.
    "clusters.manifest_submit",
}
# What clusters may use of scheduling: its tables, the lifecycle (the one entry that takes
# pod facts back), policies and bounds (to read decisions and limits), and its signals.
CLUSTERS_MAY_USE = {
    "scheduling.models",
    "scheduling.lifecycle",
    "scheduling.policies",
    "scheduling.bounds",
    "scheduling.signals",
    # Pods made in a cluster outside GPUPool that name its scheduler come in through this
    # door, with the checks of any submit (clusters/native.py).
    "scheduling.intake",
    # What a pod is told so that it can report its checkpoints (the address, its token).
    "scheduling.checkpoints",
    # Whether a workload's stored row can be made into pods: one check, which the cycle's
    # quarantine and the reconcile's pod specs both ask (issue 27, bad rows).
    "scheduling.stored",
    # The MIG profile table (data, and the lookups over it) is shared with the node side,
    # which makes the instances the engine chose: one table, no copy of NVIDIA's rules.
    "scheduling.engine.mig",
    "scheduling.engine.mig_profiles",
}


def imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (late imports inside functions too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


# The control plane's benchmark drives both apps as a worker and a cluster do (the cycle
# and reconcile tasks, inventory sync, the simulated backend), to measure them end to end:
# a harness, like the tests, not a way for one app to reach into the other.
# Benchmarks of the whole path (they drive the cycle and the reconcile as the beat does).
HARNESSES = {"bench_controlplane", "bench_native", "bench_reconcile"}


def modules(app: str, *, skip: str = "") -> list[Path]:
    return [
        p
        for p in sorted((ROOT / app).rglob("*.py"))
        if "migrations" not in p.parts
        and not HARNESSES & {part.removesuffix(".py") for part in p.parts}
        and not (skip and skip in p.relative_to(ROOT).parts)
    ]


def crossings(app: str, other: str, allowed: set[str], *, skip: str = "") -> list[str]:
    bad = []
    for path in modules(app, skip=skip):
        for name in imports(path):
            if name.split(".")[0] != other or name == other:
                continue
            if not any(name == door or name.startswith(door + ".") for door in allowed):
                # `from clusters.models import Node` reads as clusters.models.Node: allowed.
                bad.append(f"{path.relative_to(ROOT)}: {name}")
    return bad


def test_scheduling_uses_only_the_inventory_and_reads_of_clusters():
    assert crossings("scheduling", "clusters", SCHEDULING_MAY_USE, skip="engine") == []


def test_clusters_uses_scheduling_only_through_its_named_doors():
    assert crossings("clusters", "scheduling", CLUSTERS_MAY_USE) == []


def test_only_the_app_config_imports_the_scheduling_tasks():
    importers = [
        str(path.relative_to(ROOT))
        for app in ("scheduling", "clusters", "workspaces", "portal")
        for path in modules(app)
        if any(n == "scheduling.tasks" or n.startswith("scheduling.tasks.") for n in imports(path))
    ]
    assert importers == ["scheduling/apps.py"]


@pytest.mark.parametrize(
    "module",
    ["scheduling.lifecycle", "scheduling.signals", "scheduling.checkpoints", "scheduling.intake"],
)
def test_the_doors_import_nothing_of_clusters(module):
    path = ROOT / (module.replace(".", "/") + ".py")
    assert not any(name.split(".")[0] == "clusters" for name in imports(path))


def test_the_harness_exemption_covers_the_benchmark_alone():
    exempt = {
        str(p.relative_to(ROOT))
        for app in ("scheduling", "clusters")
        for p in sorted((ROOT / app).rglob("*.py"))
        if p not in modules(app) and "migrations" not in p.parts
    }
    assert exempt and all(any(h in path for h in HARNESSES) for path in exempt)


def test_the_checker_sees_a_late_import(tmp_path):
    sample = tmp_path / "late.py"
    sample.write_text("def f():\n    from clusters.tasks import reconcile_cluster\n")
    assert "clusters.tasks" in imports(sample)
