"""Forms of the workload pages. They parse text into a spec; workload_submit judges it and
its messages come back onto the field that caused them (portal.forms.show_errors)."""

from __future__ import annotations

import json
import shlex
from typing import Any

from django import forms

from clusters.models import Backend, Cluster
from clusters.selectors import gpu_models, pool_backends, topology_levels
from portal.errors import ValidationFailed
from portal.parsers import MAX_DEPTH, depth
from portal.permissions import submittable_projects
from scheduling import bounds
from scheduling.bounds import Bound
from scheduling.models import GpuRequestKind, PriorityClass, Workload, WorkloadKind
from scheduling.specs import SCALE_TARGET, SCALE_TARGET_REQUESTS, range_fields

FORM_KINDS = (
    WorkloadKind.TRAINING,
    WorkloadKind.DISTRIBUTED,
    WorkloadKind.HPO,
    WorkloadKind.INFERENCE,
)
# Fields each kind shows on top of the common ones.
KIND_FIELDS = {
    WorkloadKind.TRAINING: (
        "min_gpus",
        "max_gpus",
        "min_pods",
        "max_pods",
        "handles_resize",
        "checkpoint_dir",
        "checkpoint_interval_s",
    ),
    WorkloadKind.DISTRIBUTED: (
        "workers",
        "master",
        "min_pods",
        "max_pods",
        "handles_resize",
        "checkpoint_dir",
        "checkpoint_interval_s",
    ),
    WorkloadKind.HPO: ("search_method", "parameters", "trials", "parallelism", "seed"),
    WorkloadKind.INFERENCE: (
        "replicas",
        "min_replicas",
        "max_replicas",
        "scale_target",
        "scale_target_requests",
        "scale_cooldown_s",
    ),
}
SCALE_FIELDS = ("scale_target", "scale_target_requests", "scale_cooldown_s")
# Where a service's message about a spec key is shown on this form.
ERROR_FIELDS = {"search": "parameters", "kind": "__all__", "state": "__all__"}
TOO_DEEP = object()  # json.loads gave up: nested past Python's recursion limit
TRI_STATE = [("", "Policy default"), ("yes", "Yes"), ("no", "No")]


class ChoicesOrText(forms.MultipleChoiceField):
    """Several of the platform's choices, ticked on the page or sent as one text
    ('a100, h100'; 'A100|H100') by a script or a clone; order kept, repeats dropped."""

    def __init__(self, *, separator: str, **kwargs: Any):
        self.separator = separator
        super().__init__(required=False, widget=forms.CheckboxSelectMultiple, **kwargs)

    def to_python(self, value: Any) -> list[str]:
        words: list[str] = []
        for item in super().to_python(value):
            words += [w.strip() for w in item.split(self.separator) if w.strip()]
        return list(dict.fromkeys(words))


def kind_noun(kind: str) -> str:
    """A kind's label inside a sentence: 'training', 'distributed training', 'HPO sweep'."""
    label = str(WorkloadKind(kind).label)
    first = label.split()[0]
    return label if first.isupper() else label[0].lower() + label[1:]


def _text(label: str = "", **kwargs: Any) -> forms.CharField:
    return forms.CharField(label=label or None, required=False, **kwargs)


def whole_field(bound: Bound, label: str | None = None, **kwargs: Any) -> forms.IntegerField:
    """A form field for a whole number within `bound` (scheduling.bounds)."""
    return forms.IntegerField(
        label=label, min_value=int(bound.low), max_value=int(bound.high), **kwargs
    )


def decimal_field(bound: Bound, label: str | None = None, **kwargs: Any) -> forms.DecimalField:
    """A form field for a number within `bound`, with at most its decimal places. No
    max_digits: the bound's maximum says the same, and with both a number too large got
    two messages for one mistake ("≤ 256" and "no more than 3 digits before the decimal
    point")."""
    return forms.DecimalField(
        label=label,
        min_value=bound.low,
        max_value=bound.high,
        decimal_places=bound.places,
        **kwargs,
    )


class WorkloadForm(forms.Form):
    project = forms.ModelChoiceField(queryset=None, empty_label=None)
    name = forms.CharField(max_length=63, help_text="Lower-case letters, digits and '-'.")
    environment = forms.ChoiceField(
        label="Start from an environment",
        required=False,
        help_text="Fills in the image of an environment your admins defined.",
    )
    image = forms.CharField(max_length=300, help_text="e.g. nvcr.io/nvidia/pytorch:24.05-py3")
    command = _text(help_text="The program and its arguments, as on a shell line.")
    args = _text()
    env = _text(
        "Environment variables", widget=forms.Textarea(attrs={"rows": 3}), help_text="NAME=value"
    )
    gpu_request = forms.ChoiceField(label="GPU request", choices=GpuRequestKind.choices)
    gpus = decimal_field(bounds.GPUS, "GPUs per pod", initial=1)
    gpu_memory_mib = whole_field(bounds.GPU_MEMORY_MIB, "GPU memory (MiB)", required=False)
    mig_profile = _text(
        "MIG profile",
        max_length=16,
        help_text="With GPU request 'MIG instance': e.g. 1g.10gb, 3g.40gb; empty = the "
        "smallest that holds the GPU memory.",
    )
    cpu = decimal_field(bounds.CPU, "CPU cores per pod", initial=1)
    memory_mib = whole_field(bounds.MEMORY_MIB, "Memory per pod (MiB)", initial=4096)
    pids_max = whole_field(
        bounds.PIDS_MAX,
        "Processes per pod",
        required=False,
        help_text="Processes and threads each pod may run (local clusters), at most the "
        "cluster's limit. Empty = the cluster's (1024 unless its admin set another).",
    )
    min_gpus = whole_field(
        bounds.GPU_RANGE, "Minimum GPUs", required=False, help_text="A GPU range: with maximum."
    )
    max_gpus = whole_field(
        bounds.GPU_RANGE,
        "Maximum GPUs",
        required=False,
        help_text="A GPU range instead of a count: starts with the minimum, grows with idle "
        "GPUs of its node, restarting from its checkpoint with the new count.",
    )
    workers = whole_field(bounds.PODS, required=False, initial=2)
    master = forms.BooleanField(required=False, help_text="Add a master pod to the workers.")
    min_pods = whole_field(
        bounds.PODS, "Minimum pods", required=False, help_text="Elastic: with maximum pods."
    )
    max_pods = whole_field(
        bounds.PODS,
        "Maximum pods",
        required=False,
        help_text="Elastic: starts with the minimum, grows with idle GPUs up to this.",
    )
    handles_resize = forms.BooleanField(
        label="Handles resizing itself",
        required=False,
        help_text="Unticked: the pods restart from their checkpoint when the size changes.",
    )
    replicas = whole_field(bounds.PODS, required=False, initial=1)
    ports = _text(
        max_length=2000,
        help_text="Ports it listens on: 8000, tensorboard:6006, debug:5678/tcp. HTTP ports get a "
        "link through the portal; TCP ports are reached inside the cluster.",
    )
    ssh = forms.BooleanField(
        label="SSH", required=False,
        help_text="Start an SSH server with your profile's keys; connect with `gpupool ssh`.",
    )  # fmt: skip
    min_replicas = whole_field(bounds.PODS, "Minimum replicas", required=False)
    max_replicas = whole_field(
        bounds.PODS, "Maximum replicas", required=False, help_text="Elastic: with the minimum."
    )
    scale_target = decimal_field(
        SCALE_TARGET,
        "Scale at GPU utilization (%)",
        required=False,
        help_text="Elastic: more replicas when the GPUs are busier than this.",
    )
    scale_target_requests = whole_field(
        SCALE_TARGET_REQUESTS,
        "Scale at requests per replica per minute",
        required=False,
        help_text="Elastic: more replicas when each gets more requests (through its links).",
    )
    scale_cooldown_s = whole_field(
        bounds.GRACE_S, "Scaling cool-down (s)", required=False, help_text="Default 300."
    )
    node_pools = ChoicesOrText(
        label="Node pools",
        separator=",",
        help_text="None ticked = any pool. Ticked pools are tried in the order listed.",
        error_messages={"invalid_choice": "No such node pool: %(value)s."},
    )
    gpu_model = ChoicesOrText(
        label="GPU model",
        separator="|",
        help_text="None ticked = any model.",
        error_messages={"invalid_choice": "No GPU of model %(value)s in any cluster."},
    )
    topology_level = _text(
        max_length=63, help_text="Keep pods in one domain of this level, e.g. rack."
    )
    topology_required = forms.BooleanField(required=False)
    priority_class = forms.ChoiceField(
        choices=[("", "Default for the kind"), *PriorityClass.choices], required=False
    )
    preemptible = forms.ChoiceField(choices=TRI_STATE, required=False)
    max_runtime_s = whole_field(bounds.RUNTIME_S, "Max runtime (s)", required=False)
    checkpoint_dir = _text("Checkpoint directory", max_length=500)
    checkpoint_interval_s = whole_field(
        bounds.CHECKPOINT_INTERVAL_S,
        "Checkpoint interval (s)",
        required=False,
        help_text="How often it saves a checkpoint. Reclaiming its GPUs may then wait for a "
        "checkpoint that is due soon. Empty = unknown.",
    )
    duration_s = whole_field(
        bounds.DURATION_S,
        "Simulated duration (s)",
        required=False,
        help_text="Only on simulated clusters, where nothing runs: how long the workload "
        "pretends to run. Real clusters run it until its program exits.",
    )
    search_method = forms.ChoiceField(
        choices=[("grid", "Grid"), ("random", "Random")], required=False
    )
    parameters = _text(
        max_length=bounds.PARAMS.bytes,  # checked before _search parses it
        widget=forms.Textarea(attrs={"rows": 4}),
        help_text='JSON: {"lr": [0.1, 0.01]} or {"lr": {"min": 1e-4, "max": 0.1, "log": true}}',
    )
    trials = whole_field(bounds.TRIALS, required=False, help_text="Random search only.")
    parallelism = whole_field(bounds.TRIALS, required=False, initial=2)
    seed = whole_field(bounds.SEED, required=False, initial=0)

    def __init__(self, *args: Any, user: Any, kind: str, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.kind = kind
        self.fields["project"].queryset = submittable_projects(user)
        hidden = {f for fields in KIND_FIELDS.values() for f in fields} - set(KIND_FIELDS[kind])
        for name in hidden:
            del self.fields[name]
        self._offer_the_platforms_choices()

    def _offer_the_platforms_choices(self) -> None:
        """Node pools (named with what runs them), GPU models and environments from the
        inventory; the duration only where a simulated cluster could use it."""
        from workspaces.models import Environment  # noqa: PLC0415 - workspaces imports this module

        self.pool_backends = pool_backends()
        self.fields["node_pools"].choices = [
            (name, _pool_label(name, backends)) for name, backends in self.pool_backends.items()
        ]
        self.fields["gpu_model"].choices = [(m, m) for m in gpu_models()]
        self.topology_levels = topology_levels()
        if self.topology_levels:
            self.fields["topology_level"].widget.attrs["list"] = "topology-levels"
        self.environments = list(Environment.objects.filter(enabled=True).order_by("name"))
        self.fields["environment"].choices = [("", "None: give the image below")] + [
            (str(e.pk), e.name) for e in self.environments
        ]
        if not self.environments:
            del self.fields["environment"]
        self.backends = set().union(*self.pool_backends.values())
        if Backend.SIMULATED not in self.backends and not self.initial.get("duration_s"):
            del self.fields["duration_s"]

    def spec(self) -> dict[str, Any]:
        """The cleaned data as workload_submit's keyword arguments (minus actor/project)."""
        data = {k: v for k, v in self.cleaned_data.items() if v not in (None, "")}
        data.pop("project", None)
        data.pop("name", None)
        data.pop("environment", None)  # it only filled in the image on the page
        for key in ("node_pools", "gpu_model"):
            if not data.get(key):
                data.pop(key, None)
        if "gpu_model" in data:
            data["gpu_model"] = "|".join(data["gpu_model"])
        if "preemptible" in data:
            data["preemptible"] = data["preemptible"] == "yes"
        if "ports" in data:
            data["ports"] = parse_ports(data["ports"])
        if self.kind == WorkloadKind.HPO:
            data["search"] = self._search(data)
        return data

    def _search(self, data: dict[str, Any]) -> dict[str, Any]:
        try:
            parameters = json.loads(data.pop("parameters", "") or "{}")
        except json.JSONDecodeError as exc:
            raise ValidationFailed({"parameters": [f"Not valid JSON: {exc.msg}."]}) from exc
        except RecursionError:
            parameters = TOO_DEEP
        if parameters is TOO_DEEP or depth(parameters) > MAX_DEPTH:
            raise ValidationFailed({"parameters": [f"Nest at most {MAX_DEPTH} levels deep."]})
        search = {"method": data.pop("search_method", "grid"), "parameters": parameters}
        for key in ("trials", "parallelism", "seed"):
            if key in data:
                search[key] = data.pop(key)
        return search


def _pool_label(name: str, backends: set[str]) -> str:
    if not backends:
        return f"{name} (no cluster yet)"
    return f"{name} ({', '.join(sorted(Backend(b).label.lower() for b in backends))})"


def parse_ports(text: str) -> list[dict[str, Any]] | str:
    """'8000, metrics:9090, debug:5678/tcp' -> [{name: http, port: 8000}, {name: metrics,
    port: 9090}, {name: debug, port: 5678, protocol: tcp}]."""
    ports: list[dict[str, Any]] = []
    for index, item in enumerate(p.strip() for p in text.split(",") if p.strip()):
        address, _, protocol = item.partition("/")
        name, _, number = address.rpartition(":")
        if not number.isdigit():
            return text  # left for the service to refuse with its message
        port = {"name": name or ("http" if index == 0 else f"port{index}"), "port": number}
        ports.append({**port, "protocol": protocol} if protocol else port)  # the service bounds it
    return ports


def format_ports(ports: list[dict[str, Any]]) -> str:
    """parse_ports' text for a workload's ports (clone-and-edit)."""
    return ", ".join(
        f"{p['name']}:{p['port']}" + ("/tcp" if p.get("protocol") == "tcp" else "") for p in ports
    )


def initial_from(workload: Workload) -> dict[str, Any]:
    """A form's initial values copied from an existing workload (clone-and-edit)."""
    spec = workload.spec or {}
    search = spec.get("search", {})
    initial = {
        f: getattr(workload, f)
        for f in (
            "image",
            "gpu_request",
            "gpus",
            "gpu_memory_mib",
            "mig_profile",
            "cpu",
            "memory_mib",
            "pids_max",
            "topology_level",
            "topology_required",
            "priority_class",
            "max_runtime_s",
            "checkpoint_dir",
            "checkpoint_interval_s",
            "handles_resize",
        )
    }
    if workload.kind == WorkloadKind.DISTRIBUTED:
        initial["min_pods"] = workload.min_pods
    if workload.min_gpus is not None:
        initial.update(min_gpus=workload.min_gpus, max_gpus=int(workload.gpus))
    elif workload.elastic:
        low, high = range_fields(workload.kind)
        initial.update({low: workload.min_pods, high: workload.pods})
        initial.update({k: spec[k] for k in SCALE_FIELDS if k in spec})
    initial.update(
        project=workload.project_id,
        name=f"{workload.name[:56]}-copy",
        # Quoted as a shell would, so the form splits it back into the same words.
        command=shlex.join(workload.command),
        args=shlex.join(workload.args),
        env="\n".join(f"{k}={v}" for k, v in workload.env.items()),
        node_pools=list(workload.node_pools),
        gpu_model=[m for m in workload.gpu_model.split("|") if m],
        preemptible="yes" if workload.preemptible else "no",
        workers=spec.get("workers"),
        master=spec.get("master", False),
        replicas=spec.get("replicas"),
        ports=format_ports(spec.get("ports", [])),
        ssh=bool(spec.get("ssh")),
        duration_s=spec.get("duration_s"),
        search_method=search.get("method"),
        parameters=json.dumps(search.get("parameters")) if search else "",
        trials=search.get("trials"),
        parallelism=search.get("parallelism"),
        seed=search.get("seed"),
    )
    return initial


def show_errors(form: forms.Form, exc: ValidationFailed) -> None:
    for key, messages in exc.errors.items():
        target = ERROR_FIELDS.get(key, key)
        for message in messages:
            form.add_error(target if target in form.fields else None, message)


class PolicyForm(forms.Form):
    max_gpus_per_workload = decimal_field(
        bounds.POLICY_GPUS, "Max GPUs per workload", required=False
    )
    allowed_kinds = forms.MultipleChoiceField(
        choices=WorkloadKind.choices,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked = inherit (any kind).",
    )
    default_runtime_s = whole_field(bounds.RUNTIME_S, "Default max runtime (s)", required=False)
    max_runtime_s = whole_field(bounds.RUNTIME_S, "Max runtime (s)", required=False)
    preemptible_classes = forms.MultipleChoiceField(
        choices=PriorityClass.choices,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Classes that may be preempted. None ticked = inherit (train only).",
    )
    termination_grace_s = whole_field(
        bounds.GRACE_S,
        "Termination grace period (s)",
        required=False,
        help_text="Time from SIGTERM to SIGKILL when a workload is preempted or stopped, so "
        "training can checkpoint. Empty = inherit (the cluster's default, usually 30 s).",
    )

    def values(self) -> dict[str, Any]:
        data = dict(self.cleaned_data)
        for key in ("allowed_kinds", "preemptible_classes"):
            data[key] = data[key] or None
        return data


class ManifestForm(forms.Form):
    """ "From YAML": a Kubernetes Pod or Job for the project's namespace
    (clusters/manifest_submit.py judges the text; its refusals land on these fields)."""

    project = forms.ModelChoiceField(queryset=None, empty_label=None)
    cluster = forms.ModelChoiceField(
        queryset=None,
        required=False,
        empty_label="The project's (only) Kubernetes cluster",
        help_text="Needed when the project has quota on several Kubernetes clusters.",
    )
    manifest = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 24, "spellcheck": "false", "class": "mono"}),
        strip=False,
        help_text=f"One Pod or batch/v1 Job, at most {bounds.MANIFEST_MAX_BYTES // 1024} KiB. "
        "Its namespace is the project's and its scheduler GPUPool's: both may be left out.",
    )

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["project"].queryset = submittable_projects(user)
        self.fields["cluster"].queryset = Cluster.objects.filter(
            backend=Backend.KUBERNETES, enabled=True
        ).order_by("name")
