"""How the launch forms are laid out: sections, what is folded away as advanced, what each
backend does with an image, and the policy limits shown beside the fields they bound.

The form (scheduling.forms) keeps every field and its validation; this module only says
where a field goes and what is said next to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from clusters.models import Backend
from scheduling.policies import EffectivePolicy

# (section, fields shown, fields folded under "Advanced"), in page order. A field the kind's
# form does not have is skipped.
SECTIONS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("General", ("project", "name"), ()),
    ("Environment", ("environment", "image", "command"), ("args", "env")),
    (
        "Compute",
        (
            "gpu_request",
            "gpus",
            "min_gpus",
            "max_gpus",
            "gpu_memory_mib",
            "cpu",
            "memory_mib",
            "workers",
            "master",
            "replicas",
        ),
        # The gang minimum, and an elastic range with its scaling rule.
        (
            "pids_max",
            "min_pods",
            "max_pods",
            "handles_resize",
            "min_replicas",
            "max_replicas",
            "scale_target",
            "scale_target_requests",
            "scale_cooldown_s",
        ),
    ),
    ("Sweep", ("search_method", "parameters", "trials", "parallelism"), ("seed",)),
    ("Data", ("checkpoint_dir", "checkpoint_interval_s"), ()),
    ("Ports and SSH", ("ports", "ssh"), ()),
    (
        "Scheduling",
        ("node_pools", "gpu_model", "priority_class", "max_runtime_s", "duration_s"),
        ("preemptible", "topology_level", "topology_required"),
    ),
)

# What each backend does with the image field, in words a researcher understands.
IMAGE_BY_BACKEND = {
    Backend.KUBERNETES: "Kubernetes pulls this image and runs the command in it.",
    Backend.LOCAL: "The local machine does not use the image: the command runs in this "
    "host's own environment (its Python and packages), in a sandbox.",
    Backend.SIMULATED: "A simulated cluster runs nothing: the image is only recorded.",
}


@dataclass
class Section:
    title: str
    fields: list[Any] = field(default_factory=list)
    advanced: list[Any] = field(default_factory=list)

    @property
    def advanced_open(self) -> bool:
        """Unfolded when a folded field was filled in or has an error to show."""
        return any(f.errors or (f.value() not in (None, "", [], False)) for f in self.advanced)


def sections(form: Any) -> list[Section]:
    """The form's bound fields grouped as on the page; empty sections left out."""
    out = []
    for title, shown, folded in SECTIONS:
        section = Section(
            title,
            [form[name] for name in shown if name in form.fields],
            [form[name] for name in folded if name in form.fields],
        )
        if section.fields or section.advanced:
            out.append(section)
    return out


def image_help(backends: Iterable[str]) -> list[str]:
    """One sentence per backend the platform has, in a fixed order."""
    present = set(backends)
    return [text for backend, text in IMAGE_BY_BACKEND.items() if backend in present]


def policy_limits(policy: EffectivePolicy, kind: str) -> dict[str, str]:
    """Field name -> the policy limit that applies to it, said with where it was set."""
    limits: dict[str, str] = {}
    where = policy.sources
    if policy.allowed_kinds and kind not in policy.allowed_kinds:
        limits["project"] = (
            f"This kind is not allowed here ({where.get('allowed_kinds', 'policy')}): "
            f"only {', '.join(policy.allowed_kinds)}."
        )
    if policy.max_gpus_per_workload is not None:
        limits["gpus"] = (
            f"At most {policy.max_gpus_per_workload.normalize():f} GPUs per workload, all "
            f"pods together ({where.get('max_gpus_per_workload')})."
        )
    runtime = []
    if policy.max_runtime_s:
        runtime.append(f"at most {policy.max_runtime_s} s ({where.get('max_runtime_s')})")
    if policy.default_runtime_s:
        runtime.append(f"empty = {policy.default_runtime_s} s")
    if runtime:
        limits["max_runtime_s"] = "Policy: " + "; ".join(runtime) + "."
    classes = ", ".join(policy.preemptible_classes) or "none"
    source = where.get("preemptible_classes", "the platform default")
    limits["preemptible"] = f"Preemptible by policy: {classes} ({source})."

    return limits
