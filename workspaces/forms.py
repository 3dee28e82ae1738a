"""The launch form: project, environment or template, resources, data volume, variables."""

from __future__ import annotations

import shlex
from decimal import Decimal
from typing import Any

from django import forms

from clusters.models import NodePool
from clusters.selectors import simulated_pool_ids
from portal.errors import ValidationFailed
from scheduling import bounds
from scheduling.forms import decimal_field, parse_ports, whole_field
from scheduling.models import GpuRequestKind
from workspaces.models import Environment, WorkspaceTemplate
from workspaces.services import LaunchRequest, data_volume_roots

# The services' field names that the form shows under another name.
FIELD_ALIASES = {"memory_mib": "memory_gib", "gpu_memory_mib": "gpu_memory_gib"}
# What a chosen template fixes, in place of the form's own fields.
TEMPLATE_FIELDS = {"environment", "gpu_request", "gpus", "gpu_memory_gib", "cpu", "memory_gib",
                   "node_pool"}  # fmt: skip


class LaunchForm(forms.Form):
    project = forms.ModelChoiceField(queryset=None, empty_label=None)
    environment = forms.ModelChoiceField(
        queryset=None, required=False, widget=forms.RadioSelect, empty_label=None
    )
    template = forms.ModelChoiceField(
        queryset=None, required=False, empty_label="None: choose below"
    )
    name = forms.CharField(max_length=63, help_text="Lower-case letters, digits and '-'.")
    gpu_request = forms.ChoiceField(
        label="GPU request", choices=GpuRequestKind.choices, initial="whole"
    )
    gpus = decimal_field(
        bounds.GPUS, "GPUs", initial=0, help_text="Whole GPUs, or the fraction of one GPU (0.5)."
    )
    gpu_memory_gib = whole_field(bounds.GPU_MEMORY_GIB, "GPU memory (GiB)", initial=0)
    cpu = decimal_field(bounds.CPU, "CPU cores", initial=1)
    memory_gib = whole_field(bounds.MEMORY_GIB, "Memory (GiB)", initial=4)
    node_pool = forms.ModelChoiceField(
        queryset=NodePool.objects.all(),
        required=False,
        empty_label="Any node pool that runs real processes",
        help_text="A simulated pool runs nothing: a workspace there never opens.",
    )
    data_volume = forms.CharField(
        required=False,
        max_length=500,
        help_text="A PVC name on Kubernetes, or an absolute directory on the local backend.",
    )
    env = forms.CharField(
        label="Environment variables",
        required=False,
        max_length=bounds.PROGRAM_TEXT_MAX,  # checked before clean_env splits it
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="One NAME=value per line.",
    )
    shared_with_project = forms.BooleanField(
        label="Let the project's researchers open it", required=False
    )
    ports = forms.CharField(
        required=False,
        max_length=2000,
        help_text="Your own ports beside the tool's: tensorboard:6006, debug:5678/tcp. HTTP "
        "ports get a link through the portal.",
    )
    ssh = forms.BooleanField(
        label="SSH",
        required=False,
        help_text="Start an SSH server with your profile's keys (`gpupool ssh`).",
    )

    def __init__(self, *args: Any, projects: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["project"].queryset = projects
        environments = Environment.objects.filter(enabled=True)
        self.fields["environment"].queryset = environments
        if len(environments) == 1:  # nothing to choose: preselect it
            self.fields["environment"].initial = environments[0].pk
        # A template whose environment an admin disabled could only be refused: not offered.
        self.fields["template"].queryset = WorkspaceTemplate.objects.filter(
            project__in=projects, environment__enabled=True
        ).select_related("project", "environment")
        label_simulated_pools(self.fields["node_pool"])
        # The directories the administrators offer as data volumes on the local machine.
        self.data_volume_roots = data_volume_roots([])
        if self.data_volume_roots:
            self.fields["data_volume"].widget.attrs["list"] = "data-volume-roots"
            self.fields["data_volume"].help_text += (
                " Local directories lie under " + ", ".join(self.data_volume_roots) + "."
            )

    def clean_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for line in self.cleaned_data["env"].splitlines():
            if not line.strip():
                continue
            key, sep, value = line.partition("=")
            if not sep or not key.strip().isidentifier():
                raise forms.ValidationError(f"Write NAME=value, not {line.strip()!r}.")
            env[key.strip()] = value
        return env

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        template = data.get("template")
        if template is not None and template.project_id != getattr(data.get("project"), "pk", None):
            self.add_error("template", "This template belongs to another project.")
        if template is None and not data.get("environment"):
            self.add_error("environment", "Choose an environment or a template.")
        return data

    def launch_request(self) -> LaunchRequest:
        data = self.cleaned_data
        template = data.get("template")
        if template is not None:  # a template fixes the environment and the resources
            return LaunchRequest(
                name=data["name"],
                environment=template.environment,
                gpu_request=template.gpu_request,
                gpus=template.gpus,
                gpu_memory_mib=template.gpu_memory_mib,
                cpu=template.cpu,
                memory_mib=template.memory_mib,
                node_pool=template.node_pool,
                data_volume=data["data_volume"].strip(),
                env=data["env"],
                shared_with_project=data["shared_with_project"],
                **self._extras(data),
            )
        return LaunchRequest(
            name=data["name"],
            environment=data["environment"],
            gpu_request=data["gpu_request"],
            gpus=data["gpus"] or Decimal("0"),
            gpu_memory_mib=data["gpu_memory_gib"] * 1024,
            cpu=data["cpu"],
            memory_mib=data["memory_gib"] * 1024,
            node_pool=data["node_pool"],
            data_volume=data["data_volume"].strip(),
            env=data["env"],
            shared_with_project=data["shared_with_project"],
            **self._extras(data),
        )

    def _extras(self, data: dict[str, Any]) -> dict[str, Any]:
        ports = parse_ports(data.get("ports") or "")
        # Text that is not a port list goes on as it is, for the service to refuse by field.
        return {"ports": ports if isinstance(ports, list) else [ports], "ssh": data["ssh"]}

    def add_service_errors(self, exc: ValidationFailed) -> None:
        uses_template = self.cleaned_data.get("template") is not None
        for field, messages in exc.errors.items():
            name = FIELD_ALIASES.get(field, field)
            target = name if name in self.fields else None
            if uses_template and target in TEMPLATE_FIELDS:
                # The page hides the resource fields while a template is chosen: say it there.
                target = "template"
            for message in messages:
                self.add_error(target, message)


def label_simulated_pools(field: forms.ModelChoiceField) -> None:
    """Name simulated pools as such: a workspace placed there would never open."""
    simulated = simulated_pool_ids()
    field.label_from_instance = lambda pool: (  # type: ignore[method-assign]
        f"{pool.name} (simulated: no process runs)" if pool.pk in simulated else pool.name
    )


class EnvironmentForm(forms.ModelForm):
    port = whole_field(bounds.PORT, help_text="The port the tool listens on in its container.")
    default_gpus = decimal_field(bounds.GPUS, "Default GPUs")
    default_cpu = decimal_field(bounds.CPU, "Default CPU cores")
    default_memory_mib = whole_field(bounds.MEMORY_MIB, "Default memory (MiB)")
    command_line = forms.CharField(
        label="Command",
        max_length=bounds.PROGRAM_TEXT_MAX,  # checked before clean_command_line splits it
        help_text="The tool's executable and fixed arguments, e.g. 'jupyter lab': for "
        "JupyterLab the portal adds the base URL, port, address and token. For VS Code "
        "server or TensorBoard write them in: $(GPUPOOL_PORT) for the port, "
        "$(WORKSPACE_BIND_HOST) for the address, {base_url} for the path prefix, e.g. "
        "'tensorboard --logdir . --port $(GPUPOOL_PORT) --host $(WORKSPACE_BIND_HOST) "
        "--path_prefix {base_url}'.",
    )

    class Meta:
        model = Environment
        fields = ["name", "description", "image", "tool_kind", "port", "default_gpus",
                  "default_cpu", "default_memory_mib", "enabled"]  # fmt: skip
        widgets = {"description": forms.Textarea(attrs={"rows": 2})}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.fields["command_line"].initial = shlex.join(self.instance.command)

    def clean_command_line(self) -> list[str]:
        try:
            words = shlex.split(self.cleaned_data["command_line"])
        except ValueError as exc:
            raise forms.ValidationError(f"Cannot split into words: {exc}.") from exc
        if not words:
            raise forms.ValidationError("Give the tool's command.")
        return words

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        words = data.get("command_line")
        if (
            words
            and data.get("tool_kind", "jupyterlab") != "jupyterlab"
            and not any("$(GPUPOOL_PORT)" in word for word in words)
        ):
            # The portal gives each pod its port (a free one on the local backend): a tool
            # listening on its own default would never be reached.
            self.add_error(
                "command_line",
                "Pass the tool its port as $(GPUPOOL_PORT), e.g. --port $(GPUPOOL_PORT).",
            )
        return data

    def save(self, commit: bool = True) -> Environment:
        self.instance.command = self.cleaned_data["command_line"]
        return super().save(commit=commit)


class TemplateForm(forms.ModelForm):
    gpus = decimal_field(bounds.GPUS, "GPUs")
    gpu_memory_mib = whole_field(bounds.GPU_MEMORY_MIB, "GPU memory (MiB)")
    cpu = decimal_field(bounds.CPU, "CPU cores")
    memory_mib = whole_field(bounds.MEMORY_MIB, "Memory (MiB)")

    class Meta:
        model = WorkspaceTemplate
        fields = ["project", "name", "environment", "gpu_request", "gpus", "gpu_memory_mib",
                  "cpu", "memory_mib", "node_pool"]  # fmt: skip

    def __init__(self, *args: Any, projects: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["project"].queryset = projects
        self.fields["environment"].queryset = Environment.objects.filter(enabled=True)
        self.fields["gpu_request"] = forms.ChoiceField(choices=GpuRequestKind.choices)
        label_simulated_pools(self.fields["node_pool"])


class IdlePolicyForm(forms.Form):
    scope = forms.ChoiceField(help_text="Where it applies: a project's policy wins over its "
                              "department's, which wins over the platform's.")  # fmt: skip
    warn_after_min = whole_field(bounds.IDLE_MINUTES, "Warn after (idle minutes)")
    stop_after_min = whole_field(bounds.IDLE_MINUTES, "Stop after (idle minutes)")
    gpu_util_threshold_pct = forms.IntegerField(
        label="GPU utilisation under (%)", min_value=0, max_value=100, initial=5
    )

    def __init__(self, *args: Any, scopes: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["scope"].choices = scopes
