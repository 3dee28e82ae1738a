"""Rights GPUPool's cluster user holds only in the namespaces it manages.

The objects users submit as YAML (a Job, a PyTorchJob, a RayJob...: clusters/manifest_kinds.py)
are created by GPUPool's own user, and only ever in a project's namespace. So `create` on
those kinds is not in its ClusterRole: it is the ClusterRole `gpupool-manifests`
(deploy/base/rbac.yaml), bound by a RoleBinding of that name in each namespace GPUPool makes
or adopts for a project (`ensure_grant`, from `ensure_namespace`). Elsewhere (kube-system, a
namespace of another tool or another GPUPool) such a create is refused by RBAC.

The binding's subject is whoever the kubeconfig authenticates as, asked of the API server
(a SelfSubjectReview, `kubectl auth whoami`: any user may ask it, Kubernetes 1.28+). To make
it without holding the role's rights, GPUPool's ClusterRole may `bind` that one ClusterRole
and create RoleBindings (RBAC's own escalation check).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from clusters.backends import MANAGED_BY, MANAGED_BY_LABEL, BackendError
from clusters.backends.kubernetes.errors import said

if TYPE_CHECKING:
    from clusters.backends.kubernetes import KubernetesBackend

log = logging.getLogger(__name__)
MANIFESTS_ROLE = "gpupool-manifests"
RBAC_GROUP = "rbac.authorization.k8s.io"
SERVICE_ACCOUNT = "system:serviceaccount:"


def subject(backend: KubernetesBackend) -> dict[str, str] | None:
    """The RoleBinding subject of the kubeconfig's user: a ServiceAccount (in the cluster,
    `gpupool/gpupool`) or a User (a kubeconfig from outside); None where the API server is
    older than SelfSubjectReviews (before 1.28: 404), said in the log: no RoleBinding is
    made there, and an admin makes them (docs/kubernetes-native.md, "RBAC")."""
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    api = k8s.AuthenticationV1Api(backend.api.api_client)
    try:
        answer = backend.call(api.create_self_subject_review, review, _preload_content=False)
    except ApiException as exc:
        if exc.status == 404:
            log.warning(
                "%s: no SelfSubjectReview (%s): RoleBindings are an admin's",
                backend.cluster.name,
                said(exc),
            )
            return None
        raise BackendError(
            f"who GPUPool is in the cluster (SelfSubjectReview): {said(exc)}"
        ) from exc
    user = str(
        (json.loads(answer.data).get("status") or {}).get("userInfo", {}).get("username", "")
    )
    if user.startswith(SERVICE_ACCOUNT) and user.count(":") == 3:
        namespace, name = user[len(SERVICE_ACCOUNT) :].split(":")
        return {"kind": "ServiceAccount", "name": name, "namespace": namespace}
    if not user:
        raise BackendError("who GPUPool is in the cluster: the API server named no user")
    return {"kind": "User", "apiGroup": RBAC_GROUP, "name": user}


def ensure_grant(backend: KubernetesBackend, namespace: str, who: dict[str, str]) -> None:
    """Bind `gpupool-manifests` to GPUPool's user in the project's namespace. One there
    already (made before, its roleRef immutable) is kept as it is. Where GPUPool may not
    make it (403: an admin who makes these RoleBindings themselves took that right away, or
    an older rbac.yaml), its own pods still go ahead: only a submitted manifest needs it,
    and the cluster's 403 on that create says so."""
    body = {
        "apiVersion": f"{RBAC_GROUP}/v1",
        "kind": "RoleBinding",
        "metadata": {
            "name": MANIFESTS_ROLE,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "annotations": backend.owner.identity,
        },
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": MANIFESTS_ROLE},
        "subjects": [who],
    }
    api = k8s.RbacAuthorizationV1Api(backend.api.api_client)
    try:
        backend.call(api.create_namespaced_role_binding, namespace, body, _preload_content=False)
    except ApiException as exc:
        if exc.status == 403:
            log.warning("%s: %s", backend.cluster.name, said(exc))
            return
        if exc.status != 409:
            raise BackendError(
                f"namespace {namespace}: RoleBinding {MANIFESTS_ROLE}: {said(exc)}"
            ) from exc
