"""Turn a submission's loose input (form, API, CLI) into Workload fields, field by field.

Each `_clean_*` function reads the raw spec and writes into `out` (model field values) or
records messages in `errors` under the input's field name, so that a form or the API can
show every problem at once next to the field that caused it.
"""

from __future__ import annotations

import re
import shlex
from decimal import Decimal
from typing import Any

from clusters.models import NodePool
from portal.models import K8S_NAME_RE
from scheduling import bounds
from scheduling.bounds import Bound
from scheduling.engine.mig import AUTO
from scheduling.fits import fit_errors, mig_errors
from scheduling.kept import kept
from scheduling.models import GpuRequestKind, PriorityClass, WorkloadKind
from scheduling.sweeps import clean_search

# Names are matched whole (fullmatch): `$` would also let a trailing newline through.
K8S_NAME = re.compile(K8S_NAME_RE)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A Kubernetes port name (IANA service name): 1 to 15 characters.
PORT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?")
PORT_NAME_HELP = "Use 1 to 15 lower-case letters, digits or '-'."
NAME_HELP = "Use 1 to 63 lower-case letters, digits or '-', starting and ending with one."

DEFAULT_CLASS = {
    WorkloadKind.WORKSPACE: PriorityClass.BUILD,
    WorkloadKind.TRAINING: PriorityClass.TRAIN,
    WorkloadKind.DISTRIBUTED: PriorityClass.TRAIN,
    WorkloadKind.HPO: PriorityClass.TRAIN,
    WorkloadKind.INFERENCE: PriorityClass.INFERENCE,
}
# Interactive work outranks batch work inside a project (as Run:ai's build > train).
CLASS_PRIORITY = {PriorityClass.TRAIN: 50, PriorityClass.BUILD: 100, PriorityClass.INFERENCE: 125}
DEFAULT_PREEMPTIBLE_CLASSES = (PriorityClass.TRAIN,)

# Spec keys kept in Workload.spec rather than in a column.
EXTRA_KEYS = {
    "ports",
    "ssh",
    "duration_s",
    "workers",
    "master",
    "replicas",
    "search",
    "run_as_root",
}
# HTTP ports are reached through the portal's proxy at /workloads/<id>/ports/<name>/; TCP
# ports only inside the cluster (or as the admin publishes them). SSH is a TCP port of its
# own, reached through the portal's tunnel (`gpupool ssh`), never published.
PORT_PROTOCOLS = ("http", "tcp")
SSH_PORT_NAME = "ssh"
SSH_CONTAINER_PORT = 2222
# An elastic range: pods (training, distributed) or replicas (inference), min .. max.
RANGE_KEYS = {"max_pods", "min_replicas", "max_replicas", "handles_resize"}
# A GPU range for single-pod training: min_gpus .. max_gpus whole GPUs on one node.
GPU_RANGE_KEYS = {"min_gpus", "max_gpus"}
# Scale-up on load of an elastic service (scheduling/autoscale.py).
SCALE_KEYS = {"scale_metric", "scale_target", "scale_target_requests", "scale_cooldown_s"}
SCALE_METRICS = ("gpu_utilization",)  # what scale_target is in
SCALE_TARGET = Bound.of(1, 100, unit="percent")
SCALE_TARGET_REQUESTS = bounds.SCALE_TARGET_REQUESTS
RANGE_FIELDS = {WorkloadKind.INFERENCE: ("min_replicas", "max_replicas")}
ELASTIC_KINDS = (WorkloadKind.TRAINING, WorkloadKind.DISTRIBUTED, WorkloadKind.INFERENCE)
COLUMN_KEYS = {
    "image",
    "command",
    "args",
    "env",
    "gpu_request",
    "gpus",
    "gpu_memory_mib",
    "mig_profile",
    "cpu",
    "memory_mib",
    "pids_max",
    "pods",
    "min_pods",
    "node_pools",
    "gpu_model",
    "topology_level",
    "topology_required",
    "priority_class",
    "preemptible",
    "max_runtime_s",
    "checkpoint_dir",
    "checkpoint_interval_s",
}
SPEC_KEYS = COLUMN_KEYS | EXTRA_KEYS | RANGE_KEYS | GPU_RANGE_KEYS | SCALE_KEYS | {"params"}
# How much text a field may carry (bounds.text_size) before anything parses it; any field
# not named here: bounds.FIELD_TEXT_MAX.
TEXT_MAX = {
    "command": bounds.PROGRAM_TEXT_MAX,
    "args": bounds.PROGRAM_TEXT_MAX,
    "env": bounds.PROGRAM_TEXT_MAX,
    "search": bounds.PARAMS.bytes,
    "params": bounds.PARAMS.bytes,
}
Errors = dict[str, list[str]]


def clean_spec(kind: str, name: str, raw: dict[str, Any]) -> tuple[dict[str, Any], Errors]:
    """Model field values for a workload of `kind`, and the problems found per field."""
    errors: Errors = {}
    out: dict[str, Any] = {"spec": {}}
    if kind not in WorkloadKind.values:
        return out, {"kind": [f"Unknown kind {kind!r}; use one of {', '.join(WorkloadKind)}."]}
    for key in sorted(set(raw) - SPEC_KEYS, key=str):
        _add(errors, str(key), "Unknown field.")
    raw, too_long = _within_size(raw)
    _clean_name(name, kind, errors)
    _clean_program(raw, out, errors)
    _clean_resources(raw, out, errors)
    _clean_pods(kind, raw, out, errors)
    _clean_range(kind, raw, out, errors)
    _clean_gpu_range(kind, raw, out, errors)
    if not out.get("elastic") or kind != WorkloadKind.INFERENCE:
        for key in sorted(k for k in SCALE_KEYS if raw.get(k) not in (None, "")):
            _add(errors, key, "Only an elastic service (min_replicas..max_replicas) scales.")
    _clean_placement(raw, out, errors)
    _clean_lifecycle(kind, raw, out, errors)
    _clean_extras(kind, raw, out, errors)
    errors.update(too_long)  # the only message for such a field: it was not read further
    if not errors:
        errors.update(mig_errors(out))
    if not errors:  # only a request that is sound on its own is compared with the nodes
        errors.update(fit_errors(out))
        if out.get("min_gpus") is not None and "gpus" in errors:
            errors["max_gpus"] = errors.pop("gpus")  # a GPU range's maximum is its pod's
    return out, errors


def _add(errors: Errors, field: str, message: str) -> None:
    errors.setdefault(field, []).append(message)


def _within_size(raw: dict[str, Any]) -> tuple[dict[str, Any], Errors]:
    """The fields short enough to read, and a message for each of the others. Measured
    before any splitting or parsing, which would cost more than the size check."""
    errors: Errors = {}
    for key in sorted(set(raw) & SPEC_KEYS):
        limit = TEXT_MAX.get(key, bounds.FIELD_TEXT_MAX)
        if bounds.text_size(raw[key], limit) > limit:
            _add(errors, key, f"Keep it under {limit} characters in all.")
    return {k: v for k, v in raw.items() if k not in errors}, errors


def _clean_name(name: str, kind: str, errors: Errors) -> None:
    # A sweep's trials are named <name>-trial-<n>, which must still be a valid name.
    limit = 53 if kind == WorkloadKind.HPO else 63
    if not name:
        _add(errors, "name", "Give the workload a name.")
    elif not K8S_NAME.fullmatch(name):
        _add(errors, "name", NAME_HELP)
    elif len(name) > limit:
        _add(errors, "name", f"Use at most {limit} characters for this kind.")


def _as_list(value: Any, field: str, errors: Errors) -> list[str]:
    if value in (None, ""):
        return []
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as exc:
            _add(errors, field, f"Cannot split into words: {exc}.")
            return []
    if isinstance(value, list | tuple) and all(isinstance(v, str | int | float) for v in value):
        return [str(v) for v in value]
    _add(errors, field, "Give a list of strings or one command line.")
    return []


def _as_env(value: Any, errors: Errors) -> dict[str, str]:
    if value in (None, ""):
        return {}
    if isinstance(value, str):
        pairs = [line.strip() for line in value.splitlines() if line.strip()]
        if not all("=" in pair for pair in pairs):
            _add(errors, "env", "Write one NAME=value per line.")
            return {}
        value = dict(pair.split("=", 1) for pair in pairs)
    if not isinstance(value, dict):
        _add(errors, "env", "Give a mapping of names to values.")
        return {}
    bad = sorted(str(k) for k in value if not ENV_NAME.fullmatch(str(k)))
    if bad:
        _add(errors, "env", f"Not valid variable names: {', '.join(bad)}.")
    # A number, null or object would be stored as its Python repr ('None', "{'a': 1}").
    if not_text := sorted(str(k) for k, v in value.items() if not isinstance(v, str)):
        _add(errors, "env", f"Give each value as a string (in quotes): {', '.join(not_text)}.")
    return {str(k).strip(): str(v) for k, v in value.items()}


def _clean_program(raw: dict[str, Any], out: dict[str, Any], errors: Errors) -> None:
    image = str(raw.get("image") or "").strip()
    if not image:
        _add(errors, "image", "Give the container image.")
    elif len(image) > 300 or any(c.isspace() for c in image):
        _add(errors, "image", "An image reference has no spaces and at most 300 characters.")
    out["image"] = image
    out["command"] = _as_list(raw.get("command"), "command", errors)
    out["args"] = _as_list(raw.get("args"), "args", errors)
    out["env"] = _as_env(raw.get("env"), errors)


def _number(
    raw: dict[str, Any], field: str, default: Any, bound: Bound, errors: Errors
) -> Decimal | None:
    """The field's value (or `default` when not given) within `bound`, else None."""
    value = raw.get(field)
    if value is None or value == "":
        value = default
    number, error = bound.check(value)
    if error:
        _add(errors, field, error)
    return number


TRUE_WORDS = {"true", "yes", "on", "1"}
FALSE_WORDS = {"false", "no", "off", "0"}


def _boolean(raw: dict[str, Any], field: str, errors: Errors) -> bool | None:
    """True, False, or None when not given; 'false' from a form-encoded body is False."""
    value = raw.get(field)
    if value in (None, ""):
        return None
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in TRUE_WORDS | FALSE_WORDS:
        return word in TRUE_WORDS
    _add(errors, field, "Enter true or false.")
    return None


def _integer(
    raw: dict[str, Any], field: str, default: Any, bound: Bound, errors: Errors
) -> int | None:
    number = _number(raw, field, default, bound, errors)
    return None if number is None else int(number)


def _optional_integer(raw: dict[str, Any], field: str, bound: Bound, errors: Errors) -> int | None:
    """The field's whole number within `bound`, or None when it is not given (or refused)."""
    if raw.get(field) in (None, ""):
        return None
    return _integer(raw, field, None, bound, errors)


def _clean_resources(raw: dict[str, Any], out: dict[str, Any], errors: Errors) -> None:
    request = raw.get("gpu_request") or GpuRequestKind.WHOLE
    if request not in GpuRequestKind.values:
        _add(errors, "gpu_request", f"Use one of {', '.join(GpuRequestKind)}.")
        request = GpuRequestKind.WHOLE
    gpus = _number(raw, "gpus", 0, bounds.GPUS, errors)
    memory = _integer(raw, "gpu_memory_mib", 0, bounds.GPU_MEMORY_MIB, errors)
    if request == GpuRequestKind.WHOLE and gpus is not None and gpus != int(gpus):
        _add(errors, "gpus", "Whole GPUs are counted in whole numbers; ask for a fraction.")
    if request == GpuRequestKind.FRACTION and gpus is not None and not 0 < gpus < 1:
        _add(errors, "gpus", "A fraction of a GPU is between 0 and 1, e.g. 0.5.")
    mig = _text(raw, "mig_profile", 16, errors)
    if request == GpuRequestKind.MEMORY:
        gpus = Decimal(0)
        if not memory:
            _add(errors, "gpu_memory_mib", "Give the GPU memory to reserve, in MiB.")
    elif request == GpuRequestKind.MIG:
        gpus, mig = Decimal(0), mig or AUTO
        if mig == AUTO and not memory:
            _add(errors, "mig_profile", "Name a MIG profile (e.g. 1g.10gb) or give GPU memory.")
        if mig != AUTO:
            memory = 0
    else:
        memory = 0
    if mig and request != GpuRequestKind.MIG:
        _add(errors, "mig_profile", "A MIG profile goes with the GPU request 'mig'.")
    out["mig_profile"] = mig if request == GpuRequestKind.MIG else ""
    cpu = _number(raw, "cpu", 1, bounds.CPU, errors)
    if cpu is not None and cpu <= 0:
        _add(errors, "cpu", "Ask for more than 0 CPU cores.")
    memory_mib = _integer(raw, "memory_mib", 1024, bounds.MEMORY_MIB, errors)
    out.update(gpu_request=request, gpus=gpus, gpu_memory_mib=memory, cpu=cpu)
    out["memory_mib"] = memory_mib
    out["pids_max"] = _optional_integer(raw, "pids_max", bounds.PIDS_MAX, errors)


def _clean_pods(kind: str, raw: dict[str, Any], out: dict[str, Any], errors: Errors) -> None:
    pods, min_pods = 1, 1
    if kind == WorkloadKind.DISTRIBUTED:
        workers = _integer(raw, "workers", raw.get("pods") or 2, bounds.PODS, errors) or 1
        master = bool(_boolean(raw, "master", errors))
        pods = workers + int(master)
        min_pods = _integer(raw, "min_pods", pods, bounds.PODS, errors) or pods
        if raw.get("max_pods") not in (None, ""):
            pods = min_pods  # elastic: _clean_range checks min_pods against max_pods
        elif not 1 <= min_pods <= pods:
            _add(errors, "min_pods", f"The gang minimum is between 1 and {pods} pods.")
        out["spec"].update(workers=workers, master=master)
    elif kind == WorkloadKind.INFERENCE:
        pods = _integer(raw, "replicas", raw.get("pods") or 1, bounds.PODS, errors) or 1
        out["spec"]["replicas"] = pods
    elif raw.get("pods") not in (None, "", 1, "1"):
        _add(errors, "pods", "This kind runs exactly one pod.")
    out.update(pods=max(pods, 1), min_pods=max(min_pods, 1))


def range_fields(kind: str) -> tuple[str, str]:
    """The names a kind's elastic range goes by: min_replicas .. max_replicas for a
    service, min_pods .. max_pods for training."""
    return RANGE_FIELDS.get(WorkloadKind(kind), ("min_pods", "max_pods"))


def _clean_range(kind: str, raw: dict[str, Any], out: dict[str, Any], errors: Errors) -> None:
    """An elastic range, when its maximum is given: the workload starts with the minimum
    (1 when not given) and may grow to the maximum (`pods`)."""
    low_name, high_name = range_fields(kind)
    given = [k for k in (low_name, high_name, "handles_resize") if raw.get(k) not in (None, "")]
    out["elastic"], out["handles_resize"] = False, False
    if kind not in ELASTIC_KINDS:
        for key in given:
            _add(errors, key, "Only training, distributed and inference work is elastic.")
        return
    if raw.get(high_name) in (None, ""):
        gang = kind == WorkloadKind.DISTRIBUTED  # min_pods alone is its gang minimum
        if raw.get(low_name) not in (None, "") and not gang:
            _add(errors, low_name, f"Give {high_name} too: the range is {low_name}..{high_name}.")
        return
    high = _integer(raw, high_name, None, bounds.PODS, errors)
    low = _integer(raw, low_name, 1, bounds.PODS, errors)
    if high is None or low is None:
        return
    if low > high:
        _add(errors, low_name, f"The minimum ({low}) is more than the maximum ({high}).")
        return
    out.update(pods=high, min_pods=low, elastic=True)
    out["handles_resize"] = bool(_boolean(raw, "handles_resize", errors))
    if kind == WorkloadKind.INFERENCE:
        out["spec"]["replicas"] = high
        _clean_scaling(raw, out, errors)
    elif kind == WorkloadKind.DISTRIBUTED:
        out["spec"].update(workers=high, master=False)


def _clean_gpu_range(kind: str, raw: dict[str, Any], out: dict[str, Any], errors: Errors) -> None:
    """A GPU range instead of one GPU count, for single-pod training: it starts with
    min_gpus (1 when not given) and may grow to max_gpus, which becomes `gpus`."""
    given = [k for k in ("min_gpus", "max_gpus") if raw.get(k) not in (None, "")]
    out["min_gpus"] = None
    if not given:
        return
    if kind != WorkloadKind.TRAINING:
        for key in given:
            _add(errors, key, "Only a single-pod training job takes a GPU range.")
        return
    if "max_gpus" not in given:
        _add(errors, "min_gpus", "Give max_gpus too: the range is min_gpus..max_gpus.")
        return
    if out.get("elastic"):
        _add(errors, "max_gpus", "A job with a pod range grows by pods; give one range only.")
    if out.get("gpu_request") != GpuRequestKind.WHOLE:
        _add(errors, "max_gpus", "A GPU range counts whole GPUs: use the GPU request 'whole'.")
    if _boolean(raw, "handles_resize", errors):
        _add(errors, "handles_resize", "A pod's GPUs change only when it restarts.")
    high = _integer(raw, "max_gpus", None, bounds.GPU_RANGE, errors)
    low = _integer(raw, "min_gpus", 1, bounds.GPU_RANGE, errors)
    if high is None or low is None:
        return
    if low > high:
        _add(errors, "min_gpus", f"The minimum ({low}) is more than the maximum ({high}).")
        return
    out.update(gpus=Decimal(high), min_gpus=low, elastic=True)


def _clean_scaling(raw: dict[str, Any], out: dict[str, Any], errors: Errors) -> None:
    """Scale-up on load: a GPU utilization target in percent, a requests-per-replica
    target (per minute), or both; and a cool-down."""
    metric = raw.get("scale_metric") or SCALE_METRICS[0]
    given = [k for k in ("scale_target", "scale_target_requests") if raw.get(k) not in (None, "")]
    if not given:
        if raw.get("scale_metric") or raw.get("scale_cooldown_s") not in (None, ""):
            _add(errors, "scale_target", "Give the target to scale on.")
        return
    if metric not in SCALE_METRICS:
        # scale_target is a GPU utilization; requests have their own target field.
        _add(errors, "scale_metric", f"Use one of {', '.join(SCALE_METRICS)}.")
    spec = out["spec"]
    if "scale_target" in given:
        target = _number(raw, "scale_target", None, SCALE_TARGET, errors)
        if target is not None:
            spec.update(scale_metric=metric, scale_target=float(target))
    if "scale_target_requests" in given:
        per_replica = _integer(raw, "scale_target_requests", None, SCALE_TARGET_REQUESTS, errors)
        if per_replica is not None:
            spec["scale_target_requests"] = per_replica
    cooldown = _integer(raw, "scale_cooldown_s", 300, bounds.GRACE_S, errors)
    if cooldown is not None:
        spec["scale_cooldown_s"] = cooldown


def _clean_placement(raw: dict[str, Any], out: dict[str, Any], errors: Errors) -> None:
    pools = raw.get("node_pools") or []
    if isinstance(pools, str):
        pools = [p.strip() for p in pools.split(",") if p.strip()]
    if not isinstance(pools, list) or not all(isinstance(p, str) for p in pools):
        _add(errors, "node_pools", "Give node pool names in order of preference.")
        pools = []
    known = kept(("pool_names",), lambda: set(NodePool.objects.values_list("name", flat=True)))
    missing = [p for p in pools if p not in known]
    if missing:
        _add(errors, "node_pools", f"No such node pool: {', '.join(missing)}.")
    out["node_pools"] = list(dict.fromkeys(pools))
    out["gpu_model"] = _text(raw, "gpu_model", 200, errors)
    out["topology_level"] = _text(raw, "topology_level", 63, errors)
    out["topology_required"] = bool(_boolean(raw, "topology_required", errors))
    if out["topology_required"] and not out["topology_level"]:
        _add(errors, "topology_level", "Name the topology level (e.g. rack) to keep pods in.")


def _text(raw: dict[str, Any], field: str, limit: int, errors: Errors) -> str:
    """A one-line string of at most `limit` characters (the column's length)."""
    text = str(raw.get(field) or "").strip()
    if len(text) > limit:
        _add(errors, field, f"Use at most {limit} characters.")
        return text[:limit]
    return text


def _clean_lifecycle(kind: str, raw: dict[str, Any], out: dict[str, Any], errors: Errors) -> None:
    priority_class = raw.get("priority_class") or DEFAULT_CLASS[WorkloadKind(kind)]
    if priority_class not in PriorityClass.values:
        _add(errors, "priority_class", f"Use one of {', '.join(PriorityClass)}.")
        priority_class = DEFAULT_CLASS[WorkloadKind(kind)]
    out["priority_class"] = priority_class
    out["priority"] = CLASS_PRIORITY[PriorityClass(priority_class)]
    # None means "let the policy decide" (services.py applies the class default).
    out["preemptible"] = _boolean(raw, "preemptible", errors)
    out["max_runtime_s"] = _optional_integer(raw, "max_runtime_s", bounds.RUNTIME_S, errors)
    _clean_checkpoints(kind, raw, out, errors)


def _clean_checkpoints(kind: str, raw: dict[str, Any], out: dict[str, Any], errors: Errors) -> None:
    """Where training saves its checkpoints, and how often (seconds; None = unknown)."""
    out["checkpoint_dir"] = _text(raw, "checkpoint_dir", 500, errors)
    out["checkpoint_interval_s"] = _optional_integer(
        raw, "checkpoint_interval_s", bounds.CHECKPOINT_INTERVAL_S, errors
    )
    if kind in (WorkloadKind.INFERENCE, WorkloadKind.WORKSPACE):
        if out["checkpoint_dir"]:
            _add(errors, "checkpoint_dir", "Only training work keeps a checkpoint directory.")
        if out["checkpoint_interval_s"] is not None:
            _add(errors, "checkpoint_interval_s", "Only training work saves checkpoints.")


def _clean_extras(kind: str, raw: dict[str, Any], out: dict[str, Any], errors: Errors) -> None:
    spec = out["spec"]
    if raw.get("ports"):
        spec["ports"] = _clean_ports(raw["ports"], errors)
    elif kind == WorkloadKind.INFERENCE:
        _add(errors, "ports", "An inference service exposes at least one port.")
    if _boolean(raw, "ssh", errors):
        spec["ssh"] = True
        spec["ports"] = with_ssh_port(spec.get("ports", []), errors)
    if raw.get("duration_s") not in (None, ""):
        spec["duration_s"] = _integer(raw, "duration_s", None, bounds.DURATION_S, errors)
    if kind == WorkloadKind.HPO:
        spec["search"] = clean_search(raw.get("search"), errors)
    elif raw.get("search"):
        _add(errors, "search", "Only an HPO sweep has a search space.")
    if raw.get("params"):
        spec["params"] = raw["params"]
        if error := bounds.PARAMS.check(raw["params"]):
            _add(errors, "params", error)
    if _boolean(raw, "run_as_root", errors):
        # The image needs root (apt at run time, a root-only tool): on Kubernetes its pods
        # then run only in namespaces whose Pod Security level allows it.
        spec["run_as_root"] = True


def _clean_ports(value: Any, errors: Errors) -> list[dict[str, Any]]:
    """[{name, port, protocol}], from numbers or mappings; names and numbers unique."""
    if isinstance(value, int | str):
        value = [value]
    if not isinstance(value, list):
        _add(errors, "ports", "Give a list of {name, port, protocol}.")
        return []
    ports: list[dict[str, Any]] = []
    for index, raw_item in enumerate(value[: bounds.PORTS_MAX + 1]):
        item = raw_item if isinstance(raw_item, dict) else {"port": raw_item}
        port, error = bounds.PORT.whole(item.get("port"))
        name = str(item.get("name") or ("http" if index == 0 else f"port{index}"))
        protocol = str(item.get("protocol") or "http").lower()
        if port is None:
            _add(errors, "ports", f"Not a port number: {str(item.get('port'))[:20]!r}. {error}")
        elif not PORT_NAME.fullmatch(name):
            _add(errors, "ports", f"Not a port name: {name[:20]!r}. {PORT_NAME_HELP}")
        elif protocol not in PORT_PROTOCOLS:
            _add(
                errors, "ports", f"Port {name}: the protocol is http or tcp, not {protocol[:10]!r}."
            )
        elif any(p["name"] == name or p["port"] == port for p in ports):
            _add(errors, "ports", f"Port {name} ({port}): each name and number only once.")
        else:
            ports.append({"name": name, "port": port, "protocol": protocol})
    if len(value) > bounds.PORTS_MAX:
        _add(errors, "ports", f"Expose at most {bounds.PORTS_MAX} ports.")
    return ports


def with_ssh_port(ports: list[dict[str, Any]], errors: Errors) -> list[dict[str, Any]]:
    """The ports plus the SSH server's: a TCP port named ssh, added unless declared."""
    declared = next((p for p in ports if p["name"] == SSH_PORT_NAME), None)
    if declared is not None:
        if declared.get("protocol") != "tcp":
            _add(errors, "ports", "The port named ssh is the SSH server's: make it tcp.")
        return ports
    if any(p["port"] == SSH_CONTAINER_PORT for p in ports):
        _add(errors, "ports", f"Port {SSH_CONTAINER_PORT} is the SSH server's; use another.")
        return ports
    if len(ports) >= bounds.PORTS_MAX:
        _add(errors, "ports", f"Expose at most {bounds.PORTS_MAX - 1} ports with SSH on.")
        return ports
    return [*ports, {"name": SSH_PORT_NAME, "port": SSH_CONTAINER_PORT, "protocol": "tcp"}]
