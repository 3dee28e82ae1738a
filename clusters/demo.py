"""Demo clusters: a simulated one (4 nodes x 8 A100 in pool a100, two racks; 2 nodes x 8
H100 in pool h100 whose last 4 GPUs each run in MIG mode) and this machine.

Idempotent: clusters are fetched by name, and inventory sync matches nodes by name; a
simulated cluster seeded before the MIG nodes existed gets them added.
"""

from __future__ import annotations

import re
from typing import TextIO

from clusters.backends import BackendError
from clusters.inventory import inventory_sync
from clusters.models import Backend, Cluster

POOL_LABEL = "gpupool.io/node-pool"
RACK_LABEL = "gpupool.io/rack"
MIG_POOL = "h100"
# Dynamic MIG (docs/mig.md): the demo's MIG workloads (scheduling/demo.py) get instances cut
# on these GPUs, kept when they end and reused by the next of the same shape.
MIG_GROUP = {
    "prefix": "hgx",
    "count": 2,
    "gpus": 8,
    "gpu_model": "NVIDIA H100 80GB HBM3",
    "gpu_memory_mib": 81920,
    "mig_gpus": 4,
    "cpu_cores": 112,
    "memory_mib": 2048 * 1024,
    "labels": {POOL_LABEL: MIG_POOL},
    "spread": {RACK_LABEL: ["rack-3"]},
}
SIMULATED = {
    "groups": [
        {
            "prefix": "dgx",
            "count": 4,
            "gpus": 8,
            "gpu_model": "NVIDIA A100-SXM4-80GB",
            "gpu_memory_mib": 81920,
            "cpu_cores": 128,
            "memory_mib": 1024 * 1024,
            "labels": {POOL_LABEL: "a100"},
            "spread": {RACK_LABEL: ["rack-1", "rack-2"]},
        },
        MIG_GROUP,
    ],
    "stop_delay_s": 2,
    "sample_interval_s": 10,
}


def simulated_summary() -> str:
    """The simulated cluster in words, from SIMULATED itself: the README says exactly this
    (tests/portal/test_demo.py keeps the two together; they once disagreed)."""
    groups, nodes, gpus = [], 0, 0
    for group in SIMULATED["groups"]:
        model = re.search(r"[A-Z]\d{3}", group["gpu_model"]).group()
        pool = group["labels"][POOL_LABEL]
        text = f"{group['count']} nodes x {group['gpus']} {model} in pool {pool}"
        racks = len(group.get("spread", {}).get(RACK_LABEL, []))
        if racks > 1:
            text += f" ({racks} racks)"
        if group.get("mig_gpus"):
            text += f", {group['mig_gpus']} GPUs of each in MIG mode"
        groups.append(text)
        nodes += group["count"]
        gpus += group["count"] * group["gpus"]
    return f"{' and '.join(groups)}: {nodes} nodes, {gpus} GPUs"


def seed(stdout: TextIO) -> None:
    Cluster.objects.get_or_create(
        name="sim",
        defaults={
            "backend": Backend.SIMULATED,
            "node_pool_label": POOL_LABEL,
            "topology_labels": [RACK_LABEL],
            "config": SIMULATED,
        },
    )
    Cluster.objects.get_or_create(
        name="local",
        defaults={
            "backend": Backend.LOCAL,
            "node_pool_label": POOL_LABEL,
            "config": {"pool": "local", "grace_period_s": 10},
        },
    )
    every_start(stdout)


def every_start(stdout: TextIO) -> None:
    """Each start: the demo's clusters that are still there, their inventories read."""
    for cluster in Cluster.objects.filter(name__in=("sim", "local")).order_by("name"):
        _add_mig_nodes(cluster)
        try:
            result = inventory_sync(cluster)
        except BackendError as exc:
            stdout.write(f"Cluster {cluster.name}: inventory failed: {exc}\n")
            continue
        nodes = f"{result.nodes} node{'s' if result.nodes != 1 else ''}"
        gpus = f"{result.gpus} GPU{'s' if result.gpus != 1 else ''}"
        stdout.write(f"Cluster {cluster.name} ({cluster.backend}): {nodes}, {gpus}.\n")


def _add_mig_nodes(cluster: Cluster) -> None:
    """A demo seeded before the MIG nodes existed gets them; one edited by hand keeps its
    own description if it has a MIG group already."""
    groups = list((cluster.config or {}).get("groups") or [])
    if cluster.backend != Backend.SIMULATED or any(g.get("mig_gpus") for g in groups):
        return
    if any(g.get("prefix") == MIG_GROUP["prefix"] for g in groups):
        return
    cluster.config = {**cluster.config, "groups": [*groups, MIG_GROUP]}
    cluster.save(update_fields=["config"])
