"""What a stored workload row must hold for pods to be made of it.

A submit is cleaned by scheduling/specs.py, but a row may hold whatever another database
writer left (a hand edit, a script, an older version): `env` as a JSON list, `spec.ports`
as a string, a text in an allocation's number. The cycle quarantines such a row before it
is admitted (adapters), and a reconcile pass fails only its workload (clusters.podspecs):
one check, used by both, so neither stops for everyone.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from portal.tolerant import unreadable_columns

_JSON = {dict: "an object", list: "a list", str: "a text", bool: "a boolean"}


def json_kind(value: Any) -> str:
    """What a JSON value is, in words: 'a list', 'a number'."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return "a number"
    return _JSON.get(type(value), type(value).__name__)


def _shaped(value: Any, field: str, shape: type) -> str:
    """'' when `value` is empty or of `shape`, else why not."""
    if value in (None, "", [], {}) or isinstance(value, shape):
        return ""
    return f"{field} is {json_kind(value)}, not {json_kind(shape())}"


def _port(i: int, port: Any) -> str:
    if not isinstance(port, dict):
        return f"spec.ports[{i}] is {json_kind(port)}, not an object"
    number = port.get("port")
    if not isinstance(number, int) or isinstance(number, bool) or not 0 < number < 65536:
        return f"spec.ports[{i}] has no port number (1..65535)"
    return ""


def _volume(i: int, volume: Any) -> str:
    if not isinstance(volume, dict):
        return f"spec.volumes[{i}] is {json_kind(volume)}, not an object"
    if not all(isinstance(volume.get(key), str) for key in ("claim", "mount_path")):
        return f"spec.volumes[{i}] needs a claim and a mount_path"
    return ""


def _items(spec: dict[str, Any], field: str, check: Callable[[int, Any], str]) -> list[str]:
    value = spec.get(field)
    shape = _shaped(value, f"spec.{field}", list)
    if shape or not value:
        return [shape] if shape else []
    return [problem for i, item in enumerate(value) if (problem := check(i, item))]


def _spec(spec: dict[str, Any]) -> list[str]:
    problems = _items(spec, "ports", _port) + _items(spec, "volumes", _volume)
    duration = spec.get("duration_s")
    if duration is not None and not (json_kind(duration) == "a number" and math.isfinite(duration)):
        problems.append(f"spec.duration_s is {json_kind(duration)}, not a finite number")
    native = spec.get("native")
    if _shaped(native, "spec.native", dict) or _shaped(
        (native or {}).get("pods"), "spec.native.pods", list
    ):
        problems.append("spec.native is not a record of pods")
    return problems


def stored_spec_problem(workload: Any) -> str:
    """Why pods cannot be made of this row's program and spec (naming the field), or ''."""
    problems = [
        _shaped(workload.env, "env", dict),
        _shaped(workload.command, "command", list),
        _shaped(workload.args, "args", list),
        _shaped(workload.spec, "spec", dict),
    ]
    if isinstance(workload.spec, dict):
        problems += _spec(workload.spec)
    return "; ".join(p for p in problems if p)


def _index_list(value: object) -> bool:
    return isinstance(value, list) and all(type(i) is int and i >= 0 for i in value)


def addresses_problem(ports: object) -> str:
    """Why an allocation's `ports` (port name -> the address it answers at, as the backend
    reported it) cannot be dialled, or ''."""
    if not isinstance(ports, dict):
        return f"ports is {json_kind(ports)}, not an object"
    if not all(isinstance(address, str) for address in ports.values()):
        return "ports has an address that is not a text"
    return ""


def allocation_problem(alloc: Any) -> str:
    """Why this allocation row (a PodAllocation) cannot be read as a placement, naming its
    columns, or '': a text SQLite held in a number (portal.tolerant), GPU indices that are
    no list of indices, port addresses that are no object of texts. The cycle fails its
    workload; reconcile makes no pod of it."""
    problems = [f"{name} is not a number in the database" for name in unreadable_columns(alloc)]
    problems += [
        f"{name} is not a list of GPU indices"
        for name in ("gpu_indices", "releasing_gpu_indices")
        if not _index_list(getattr(alloc, name))
    ]
    problems += [problem] if (problem := addresses_problem(alloc.ports)) else []
    return f"its allocation {alloc.pk}: {', '.join(problems)}" if problems else ""
