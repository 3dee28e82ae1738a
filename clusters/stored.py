"""What a stored Cluster row must hold for its backend to be made of it (issue 27, bad rows).

The forms and the API write `config` and `topology_labels` checked, but a row may hold what
another database writer left: a list where the config's object belongs, a topology label
that is a number, `retries: "four"`. Every backend reads its config when it is made, so such
a row used to raise in each of that cluster's passes and on pages that ask a cluster about
itself (the clusters page, a researcher's submit asking which pools can isolate). One check
here: `get_backend` refuses to make the backend (BackendUnreachable: that cluster's passes
and syncs skip it, and its last error says why, on the clusters page); the pages answer
for it that it cannot run pods; other clusters go on.
"""

from __future__ import annotations

import math
from typing import Any

from scheduling.stored import json_kind

NUMBER_MAX = 10**9  # seconds, counts: past it a timedelta or an int() of it overflows
BIND_WORKERS_MAX = 64  # Bindings in flight at once: each holds a thread and a connection

# Cluster.config's keys by the JSON kind each must hold (clusters/README.md lists them).
NUMBERS = (
    "grace_period_s", "retries", "backoff_s", "timeout_s", "connect_timeout_s", "workers",
    "resync_s", "watch_wait_s", "watch_timeout_s", "watch_idle_s", "pids_max",
    "stop_delay_s", "sample_interval_s",
)  # fmt: skip
TEXTS = (
    "mps_root", "mps_control", "pin", "system_namespace", "reservation_image",
    "reservation_priority_class", "scheduler_name", "node_name", "pool", "publish_ports",
    "ingress_class", "ingress_domain",
)  # fmt: skip
BOOLEANS = ("mps", "watch", "sandbox", "egress")
LISTS = ("groups", "nodes", "down_nodes")


def _number(value: Any) -> bool:
    return json_kind(value) == "a number" and math.isfinite(value) and 0 <= value <= NUMBER_MAX


def _texts(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _config_problems(config: dict[str, Any]) -> list[str]:
    problems = [
        f"config.{key} is not a number from 0 to {NUMBER_MAX}"
        for key in NUMBERS
        if key in config and not _number(config[key])
    ]
    problems += [
        f"config.{key} is {json_kind(config[key])}, not {json_kind(shape())}"
        for keys, shape in ((TEXTS, str), (BOOLEANS, bool), (LISTS, list))
        for key in keys
        if key in config and not isinstance(config[key], shape)
    ]
    bind_workers = config.get("bind_workers", BIND_WORKERS_MAX)
    if not (_number(bind_workers) and isinstance(bind_workers, int)) or not (
        1 <= bind_workers <= BIND_WORKERS_MAX
    ):
        problems.append(f"config.bind_workers is not a whole number from 1 to {BIND_WORKERS_MAX}")
    run_as_user = config.get("run_as_user")
    if run_as_user is not None and not (_number(run_as_user) and isinstance(run_as_user, int)):
        problems.append("config.run_as_user is not a user id")
    labels = config.get("labels", {})
    if not (isinstance(labels, dict) and all(isinstance(v, str) for v in labels.values())):
        problems.append("config.labels is not an object of texts")
    return problems


def _description_problem(config: dict[str, Any]) -> str:
    """A simulated cluster's nodes, as its backend reads them."""
    from clusters.backends.simulated import description_nodes  # noqa: PLC0415 - imports models

    try:
        # One node of a group stands for all of it (the others differ by name and spread
        # label alone): the check costs per group, not per node (90 ms at 1,000 nodes).
        groups = [{**g, "count": min(int(g["count"]), 1)} for g in config.get("groups") or []]
        description_nodes({**config, "groups": groups})
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, ZeroDivisionError) as exc:
        return f"config's nodes cannot be read ({type(exc).__name__})"
    return ""


def config_of(cluster: Any) -> dict[str, Any]:
    """The cluster's config, or {} where the row holds no object: what a page shows and an
    admin's save starts from (the save writes a checked record)."""
    return cluster.config if isinstance(cluster.config, dict) else {}


def texts_of(value: Any) -> list[str]:
    """A list of texts as stored, or [] (topology_labels, data_volume_roots), for a form."""
    return value if _texts(value) else []


def cluster_problem(cluster: Any) -> str:
    """Why no backend can be made of this row (naming its fields), or ''."""
    problems = []
    if not _texts(cluster.topology_labels):
        problems.append("topology_labels is not a list of label names")
    if not _texts(cluster.data_volume_roots):
        problems.append("data_volume_roots is not a list of folders")
    if not isinstance(cluster.config, dict):
        problems.append(f"config is {json_kind(cluster.config)}, not an object")
    else:
        problems += _config_problems(cluster.config)
        if cluster.backend == "simulated" and not problems:
            problems.append(_description_problem(cluster.config))
    return "; ".join(p for p in problems if p)
