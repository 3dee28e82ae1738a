"""The MIG layout the portal publishes for a Kubernetes node, and what the node reports back.

The portal (clusters/backends/kubernetes/mig.py) writes the layout it wants as one annotation
on the Node object, `gpupool.io/mig-layout`, a JSON string:

    {"id": "3f9c0a1b2d4e5f60",   # new for each changed layout: a report names the one it applied
     "owner": "<installation>/<cluster record>",
     "destroy": true,            # false where the node pool forbids repartitioning
     "gpus": {"6": [["3g.40gb", 4], ["1g.10gb", 0]], "7": []}}

The node's agent (clusters/agent/kubenode.py) reads it, makes its GPUs match through NVML
(clusters/agent/mig.py) and posts to the portal, with its node token:

    {"layout": "3f9c0a1b2d4e5f60", "mig_mode": [6, 7],
     "devices": {"6": {"4": "MIG-...", "0": "MIG-..."}}, "errors": ["GPU 7: ..."]}

Both sides read what they receive through the bounded decoders here: a value another hand
wrote (kubectl, a bug) is refused whole, never half applied. No Django: the agent imports it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from scheduling.engine.mig_profiles import MEMORY_SLICES

ANNOTATION = "gpupool.io/mig-layout"
MAX_GPUS = 64  # GPUs per node (NVML indices 0..63)
MAX_ERRORS = 16
ERROR_CHARS = 500
LAYOUT_CHARS = 64 * 1024  # far below the 256 KiB all of a node's annotations may take
_ID = re.compile(r"[0-9a-f]{8,32}")  # each matched whole
_PROFILE = re.compile(r"[1-7]g\.\d{1,4}gb")
_DEVICE = re.compile(r"MIG-[0-9A-Za-z-]{1,60}")


class LayoutInvalid(ValueError):
    """A layout or report that does not follow the format: refused whole."""


def layout_encode(layout_id: str, owner: str, gpus: dict[int, list], *, destroy: bool) -> str:
    body = {
        "id": layout_id,
        "owner": owner,
        "destroy": destroy,
        "gpus": {
            str(i): [[p, s] for p, s in sorted(v, key=lambda x: x[1])] for i, v in gpus.items()
        },
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def layout_decode(text: str) -> dict[str, Any]:
    """{"id", "owner", "destroy", "gpus": {index: [(profile, start)]}}; LayoutInvalid else."""
    if len(text) > LAYOUT_CHARS:
        raise LayoutInvalid(f"longer than {LAYOUT_CHARS} characters")
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise LayoutInvalid(f"not JSON: {exc}") from exc
    if not isinstance(body, dict) or not _ID.fullmatch(str(body.get("id", ""))):
        raise LayoutInvalid("no layout id")
    if not isinstance(body.get("destroy"), bool) or not isinstance(body.get("owner"), str):
        raise LayoutInvalid("destroy must be true or false, owner a string")
    gpus = {}
    for index, instances in _items(body.get("gpus"), "gpus"):
        if not isinstance(instances, list) or len(instances) > MEMORY_SLICES:
            raise LayoutInvalid(f"GPU {index}: at most {MEMORY_SLICES} instances")
        gpus[index] = [_instance(index, item) for item in instances]
    return {"id": body["id"], "owner": body["owner"][:200], "destroy": body["destroy"],
            "gpus": gpus}  # fmt: skip


def report_decode(body: Any) -> dict[str, Any]:
    """A node's report: {"layout", "mig_mode": [index], "devices": {index: {start: uuid}},
    "errors": [text]}; LayoutInvalid naming the field else."""
    if not isinstance(body, dict):
        raise LayoutInvalid("send an object")
    layout = body.get("layout", "")
    if layout != "" and not _ID.fullmatch(str(layout)):
        raise LayoutInvalid("layout: not a layout id")
    modes = body.get("mig_mode", [])
    if not isinstance(modes, list) or len(modes) > MAX_GPUS:
        raise LayoutInvalid(f"mig_mode: a list of at most {MAX_GPUS} GPU indices")
    mig_mode = sorted({_index(i, "mig_mode") for i in modes})
    devices: dict[int, dict[int, str]] = {}
    for index, found in _items(body.get("devices", {}), "devices"):
        starts = dict(_items(found, f"devices.{index}", bound=MEMORY_SLICES))
        if not all(isinstance(u, str) and _DEVICE.fullmatch(u) for u in starts.values()):
            raise LayoutInvalid(f"devices.{index}: a MIG device UUID is MIG-<uuid>")
        devices[index] = starts
    errors = body.get("errors", [])
    if not isinstance(errors, list) or len(errors) > MAX_ERRORS:
        raise LayoutInvalid(f"errors: a list of at most {MAX_ERRORS} texts")
    texts = [str(e)[:ERROR_CHARS] for e in errors if isinstance(e, str)]
    return {"layout": layout, "mig_mode": mig_mode, "devices": devices, "errors": texts}


def _index(value: Any, field: str, bound: int = MAX_GPUS) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = -1
    if isinstance(value, bool) or not 0 <= number < bound or str(number) != str(value):
        raise LayoutInvalid(f"{field}: {value!r} is not an index below {bound}")
    return number


def _items(value: Any, field: str, bound: int = MAX_GPUS) -> list[tuple[int, Any]]:
    if not isinstance(value, dict) or len(value) > bound:
        raise LayoutInvalid(f"{field}: an object of at most {bound} entries")
    return sorted((_index(k, field, bound), v) for k, v in value.items())


def _instance(index: int, item: Any) -> tuple[str, int]:
    if (
        not isinstance(item, list)
        or len(item) != 2
        or not isinstance(item[0], str)
        or not _PROFILE.fullmatch(item[0])
    ):
        raise LayoutInvalid(f"GPU {index}: an instance is [profile, start]")
    return item[0], _index(item[1], f"GPU {index} start", MEMORY_SLICES)
