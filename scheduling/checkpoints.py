"""A running job says "I saved a checkpoint now", so that the cycle knows when its next one
is due (engine/actions/victims.py `checkpoint_due`).

A workload with a checkpoint directory gets, in its pods' environment, the address to
POST to and a token of its own (GPUPOOL_CHECKPOINT_URL, GPUPOOL_CHECKPOINT_TOKEN). The
token is the workload's id signed with the server's secret key: nothing to store, and a
leaked one can only report checkpoints of that one workload while it runs. The time is
the server's, never the caller's.
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.core import signing
from django.urls import reverse
from django.utils import timezone

from portal.errors import ValidationFailed
from scheduling.models import ACTIVE_STATES, Workload

SALT = "gpupool.workload-checkpoint"


def workload_checkpoint_token(workload_id: int) -> str:
    return signing.Signer(salt=SALT).sign(str(workload_id))


def workload_token_check(token: str) -> int | None:
    """The workload id a checkpoint token was made for, or None for a forged one."""
    try:
        return int(signing.Signer(salt=SALT).unsign(token))
    except (signing.BadSignature, ValueError):
        return None


def workload_checkpoint_env(workload: Workload) -> dict[str, str]:
    """What a pod needs to report its checkpoints: only work that keeps them gets it."""
    if not workload.checkpoint_dir:
        return {}
    path = reverse("api-workload-checkpoint", kwargs={"pk": workload.pk})
    return {
        "GPUPOOL_CHECKPOINT_URL": f"{settings.SITE_URL}{path}",
        "GPUPOOL_CHECKPOINT_TOKEN": workload_checkpoint_token(workload.pk),
    }


def workload_checkpoint_record(*, workload_id: int) -> datetime:
    """Note that the running workload saved a checkpoint now; when that was.

    One conditional UPDATE: a workload that has meanwhile stopped or been preempted is
    refused rather than given a checkpoint time it did not run to."""
    now = timezone.now()
    updated = (
        Workload.objects.filter(pk=workload_id, state__in=ACTIVE_STATES)
        .exclude(checkpoint_dir="")
        .update(last_checkpoint_at=now)
    )
    if not updated:
        raise ValidationFailed(
            {"state": ["Only a running workload with a checkpoint directory reports checkpoints."]}
        )
    return now
