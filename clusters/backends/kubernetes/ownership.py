"""Whose objects these are: this GPUPool database's and this Cluster record's.

Two GPUPool databases, or two Cluster records, may point at one cluster. Every object
GPUPool makes there carries both identities: in its labels (every list selects on them),
in its name (so that pods never collide: `gp-<workload>-<pod>-<installation>-<cluster>`,
eight hex digits of each), and on namespaces as annotations. An object without both is
never adopted, listed as GPUPool's, changed or deleted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clusters.backends import MANAGED_BY, MANAGED_BY_LABEL

INSTALLATION_LABEL = "gpupool.io/installation"
CLUSTER_LABEL = "gpupool.io/cluster"
# On a pod GPUPool bound but did not create (a "native" pod: kubectl, Helm, an operator with
# schedulerName gpupool): `<installation>.<cluster>`, set through the Binding's annotations,
# which the API server copies onto the pod.
BOUND_BY_ANNOTATION = "gpupool.io/bound-by"


@dataclass(frozen=True, slots=True)
class Owner:
    installation: str  # clusters.models.Installation.uid
    cluster: str  # clusters.models.Cluster.uid

    @property
    def identity(self) -> dict[str, str]:
        """The two identities, as labels or as namespace annotations."""
        return {INSTALLATION_LABEL: self.installation, CLUSTER_LABEL: self.cluster}

    @property
    def labels(self) -> dict[str, str]:
        return {MANAGED_BY_LABEL: MANAGED_BY, **self.identity}

    @property
    def selector(self) -> str:
        """The label selector of every list GPUPool makes."""
        return ",".join(f"{key}={value}" for key, value in self.labels.items())

    def owns(self, labels: Mapping[str, str] | None) -> bool:
        return all((labels or {}).get(key) == value for key, value in self.labels.items())

    @property
    def bound_by(self) -> str:
        """The value of BOUND_BY_ANNOTATION on the native pods this owner binds."""
        return f"{self.installation}.{self.cluster}"

    def holds(self, metadata: Mapping[str, Any]) -> bool:
        """Whether a pod is this owner's: made by it (its identity labels) or bound by it
        (a native pod with our BOUND_BY_ANNOTATION). Every other bound pod is foreign."""
        annotations = metadata.get("annotations") or {}
        return (
            self.owns(metadata.get("labels"))
            or annotations.get(BOUND_BY_ANNOTATION) == self.bound_by
        )

    @property
    def tag(self) -> str:
        return f"{self.installation[:8]}-{self.cluster[:8]}".lower()

    def object_name(self, pod: str) -> str:
        """The Kubernetes name of a pod (and of its Service) GPUPool calls `pod`
        (`gp-<workload>-<index>`): at most 63 characters, a DNS label as Services need."""
        return f"{pod}-{self.tag}"


def owner_of(cluster: Any, installation: str | None = None) -> Owner:
    """The owner of a Cluster record's objects: this installation (read from the database
    unless given) and the record."""
    if installation is None:
        from clusters.models import installation_uid  # noqa: PLC0415 - models need apps ready

        installation = installation_uid()
    return Owner(installation, str(cluster.uid))
