"""POST /k8s/admission/<cluster uid>/pods/: the pod webhook kube-apiserver calls
(clusters/admission.py says what it changes; deploy/webhook/ how it is installed).

No session and no CSRF token: the caller is the API server, over TLS to the webhook's own
listener. Answers: 200 with an AdmissionReview (the only answer the API server applies);
400 for a body that is not a review (also one larger than Django's
DATA_UPLOAD_MAX_MEMORY_SIZE, refused before this view); 404 for a cluster GPUPool does
not know. The API server counts any non-200 as a failure to call the webhook, so the
configuration's failurePolicy decides the pod's fate. The answer never says more than the
review's uid, the patch and a warning about the pod itself.
"""

from __future__ import annotations

import logging
from uuid import UUID

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from clusters import admission
from clusters.backends import SCHEDULER_NAME
from clusters.models import Backend, Cluster
from clusters.stored import config_of
from portal.models import Project

log = logging.getLogger(__name__)


def _error(code: int, message: str) -> JsonResponse:
    return JsonResponse({"detail": message}, status=code)


@csrf_exempt
@require_POST
def pods_admission(request: HttpRequest, cluster_uid: UUID) -> JsonResponse:
    try:  # read bounded whatever Content-Length says (or a chunked body does not say)
        review = admission.review_request(request.read(admission.REVIEW_MAX_BYTES + 1))
    except admission.ReviewInvalid as exc:
        return _error(400, str(exc))
    cluster = Cluster.objects.filter(uid=cluster_uid, backend=Backend.KUBERNETES).first()
    if cluster is None:
        return _error(404, f"no Kubernetes cluster {cluster_uid} in this GPUPool")
    operations: list[dict] = []
    context = _context(cluster, review.get("namespace") or "", review["uid"])
    if context is not None and admission.is_pod_create(review):
        operations = admission.mutations_for(review.get("object") or {}, context)
    warnings = admission.changed_warning(operations, context) if context else []
    return JsonResponse(admission.review_answer(review["uid"], operations, warnings))


def _context(cluster: Cluster, namespace: str, uid: str) -> admission.Context | None:
    """The context of a project's namespace; None for any other (its pods are answered
    unchanged)."""
    project = Project.objects.filter(namespace=namespace).first()
    if project is None:
        return None
    config = config_of(cluster)  # another writer's list answers as {}
    return admission.Context(
        namespace,
        str(config.get("scheduler_name") or SCHEDULER_NAME),
        project.name,
        project.enforce_scheduler,
        request_uid=uid,
        mps_root=str(config.get("mps_root") or ""),
    )
