from __future__ import annotations

from django import forms

from clusters.metrics.reports import GROUPS
from clusters.models import Cluster
from scheduling.bounds import date_error

PRESETS = [("this_month", "This month"), ("last_month", "Last month"), ("custom", "Custom")]
GROUP_LABELS = {
    "department": "Department",
    "project": "Project",
    "user": "User",
    "pool": "Node pool",
    "cluster": "Cluster",
    "gpu_model": "GPU model",
}


class UsageReportForm(forms.Form):
    period = forms.ChoiceField(choices=PRESETS, initial="this_month", required=False)
    start = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    end = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    group = forms.ChoiceField(
        choices=[(g, GROUP_LABELS[g]) for g in GROUPS], initial="project", required=False
    )
    cluster = forms.ModelChoiceField(
        queryset=Cluster.objects.order_by("name"), required=False, empty_label="All clusters"
    )

    def clean(self) -> dict:
        data = super().clean()
        data["period"] = data.get("period") or "this_month"
        data["group"] = data.get("group") or "project"
        for name in ("start", "end"):
            if error := date_error(data.get(name)):
                self.add_error(name, error)
        if data["period"] == "custom":
            start, end = data.get("start"), data.get("end")
            if not start or not end:
                raise forms.ValidationError("A custom period needs a start and an end date.")
            if end < start:
                self.add_error("end", "The end comes before the start.")
        return data


class GpuPriceForm(forms.Form):
    gpu_model = forms.CharField(max_length=100)
    price_per_hour = forms.DecimalField(max_digits=10, decimal_places=4, min_value=0)
