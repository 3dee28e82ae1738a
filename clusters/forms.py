"""HTML forms of the clusters pages."""

from __future__ import annotations

from django import forms

from clusters.models import Backend

DESCRIPTION_HELP = (
    "Simulated clusters only: YAML or JSON with node groups and nodes, e.g. "
    "groups: [{prefix: a100, count: 4, gpus: 8, gpu_model: A100, "
    "labels: {gpupool.io/node-pool: a100}, spread: {gpupool.io/rack: [r1, r2]}}]"
)


def _read_upload(upload: forms.Field | None) -> str:
    if not upload:
        return ""
    return upload.read().decode("utf-8", "replace")


class ClusterForm(forms.Form):
    name = forms.CharField(max_length=63, help_text="Lower-case letters, digits and dashes.")
    backend = forms.ChoiceField(choices=Backend.choices)
    kubeconfig = forms.FileField(
        required=False,
        label="Kubeconfig",
        help_text="Kubernetes only. Stored encrypted and never shown again; "
        "leave empty to keep the current one.",
    )
    node_pool_label = forms.CharField(
        max_length=253,
        initial="gpupool.io/node-pool",
        help_text="The node label naming node pools.",
    )
    topology_labels = forms.CharField(
        required=False,
        max_length=1000,
        help_text="Node labels naming topology levels, widest first, comma-separated, "
        "e.g. topology.kubernetes.io/zone, gpupool.io/rack.",
    )
    description = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 8}), help_text=DESCRIPTION_HELP
    )
    description_file = forms.FileField(required=False, label="…or upload the description")
    data_volume_roots = forms.CharField(
        required=False,
        max_length=5000,
        label="Data-volume roots",
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Local clusters only: one absolute directory per line, e.g. /srv/datasets. "
        "A workspace's data volume must lie under one of them; with none, workloads get "
        "no data volume here.",
    )
    publish_ports = forms.ChoiceField(
        required=False,
        label="Publish workload ports",
        choices=[
            ("", "No: through the portal only"),
            ("nodeport", "Also on every node (NodePort)"),
            ("ingress", "Also through an Ingress class"),
        ],
        help_text="Kubernetes only. The SSH server's port is never published.",
    )
    ingress_class = forms.CharField(required=False, max_length=253, help_text="e.g. nginx")
    ingress_domain = forms.CharField(
        required=False,
        max_length=253,
        help_text="Hosts are <port>-<workload>-<pod>.<domain>; point a wildcard record here.",
    )
    enabled = forms.BooleanField(required=False, initial=True)

    def __init__(self, *args: object, editing: bool = False, **kwargs: object):
        super().__init__(*args, **kwargs)
        if editing:
            self.fields["backend"].disabled = True  # a cluster's backend is what it is
        else:
            del self.fields["enabled"]

    def clean_topology_labels(self) -> list[str]:
        raw = self.cleaned_data.get("topology_labels") or ""
        return [part.strip() for part in raw.split(",") if part.strip()]

    def clean_data_volume_roots(self) -> list[str]:
        raw = self.cleaned_data.get("data_volume_roots") or ""
        return [line.strip() for line in raw.splitlines() if line.strip()]

    def service_fields(self) -> dict[str, object]:
        data = dict(self.cleaned_data)
        data["kubeconfig"] = _read_upload(data.pop("kubeconfig", None))
        uploaded = _read_upload(data.pop("description_file", None))
        data["description"] = uploaded or data.get("description", "")
        return data
