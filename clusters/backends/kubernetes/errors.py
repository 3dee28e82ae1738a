"""What the API server answered, read for people and for the decision to retry."""

from __future__ import annotations

import json

from kubernetes.client.exceptions import ApiException


def message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message", ""))
    except (ValueError, AttributeError):
        return str(exc.body or "")[:500]


def said(exc: ApiException) -> str:
    """Status, reason and the API server's message (it says what is wrong)."""
    return ": ".join(filter(None, [f"{exc.status} {exc.reason}", message(exc)]))


def refused_by_admission(exc: ApiException) -> bool:
    """The cluster's admission refused the object for what it is (Pod Security, a
    validating webhook): asking again will not help. A 403 of RBAC (GPUPool may not) or
    of a ResourceQuota (full for now) is not such a refusal; it is retried."""
    text = message(exc)
    return exc.status in (400, 403, 422) and (
        "violates PodSecurity" in text or "denied the request" in text
    )


def priority_class_missing(exc: ApiException) -> bool:
    """403 from the Priority admission plugin: the pod names a class that is not there."""
    return exc.status == 403 and "no PriorityClass with name" in message(exc)
