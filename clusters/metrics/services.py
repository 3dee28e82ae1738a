"""Writes of the metrics app: sample ingestion, node tokens, GPU prices."""

from __future__ import annotations

import hashlib
import secrets
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from clusters.metrics.ingest import agent_scope, rows_for, write_rows
from clusters.metrics.models import GpuPrice, NodeToken
from clusters.metrics.rollup import rollup_rewind
from clusters.models import Node
from portal.audit import audit_log, snapshot
from portal.errors import ValidationFailed

MAX_BATCH = 50_000


def samples_ingest(samples: list[dict[str, Any]], *, agent_node_id: int | None = None) -> int:
    """Store GPU samples; returns how many. All or nothing: a bad sample rejects the batch.

    From a node's agent (agent_node_id), every sample must be of that node, one of its GPUs
    and the workloads placed on it, and no older than raw samples are kept (ingest.AgentScope).

    Keys of each sample:
      node_id (int) — or cluster (id or name) and node (name);
      gpu_index (int); ts (epoch seconds, ISO 8601 string or aware datetime);
      util_pct (0-100); mem_used_mib; mem_total_mib;
      optional: power_w, temp_c, workload_id, pod_index,
      processes: [{pid, used_mib, workload_id?, pod_index?}].
    Raises ValidationFailed({"samples": [...]}) naming the first bad sample.
    """
    if not isinstance(samples, list):
        raise ValidationFailed({"samples": ["must be a list"]})
    if len(samples) > MAX_BATCH:
        raise ValidationFailed({"samples": [f"at most {MAX_BATCH} samples per batch"]})
    if not samples:
        return 0
    scope = None if agent_node_id is None else agent_scope(agent_node_id)
    rows, procs = rows_for(samples, scope)
    write_rows(rows, procs)
    # Late samples (an agent emptying its buffer) make already rolled-up minutes stale.
    rollup_rewind(min(row[0] for row in rows))
    return len(rows)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def node_token_issue(*, actor: Any, node: Node) -> tuple[NodeToken, str]:
    """A new agent token for a node; the plain token is returned once and never stored."""
    plain = "gpn_" + secrets.token_urlsafe(32)
    with transaction.atomic():
        token = NodeToken.objects.create(
            node=node, token_hash=_hash(plain), prefix=plain[:12], created_by=actor
        )
        audit_log(actor=actor, action="node_token.issue", obj=token, after={"node": node.pk})
    return token, plain


def node_token_revoke(*, actor: Any, token: NodeToken) -> None:
    with transaction.atomic():
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        audit_log(actor=actor, action="node_token.revoke", obj=token, after={"node": token.node_id})


def node_token_check(plain: str) -> NodeToken | None:
    """The live token matching `plain`, touching last_used_at at most once a minute."""
    token = (
        NodeToken.objects.select_related("node")
        .filter(token_hash=_hash(plain), revoked_at__isnull=True)
        .first()
    )
    if token is None:
        return None
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        NodeToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


def gpu_price_set(*, actor: Any, gpu_model: str, price_per_hour: Decimal) -> GpuPrice:
    gpu_model = gpu_model.strip()
    if not gpu_model:
        raise ValidationFailed({"gpu_model": ["Name the GPU model."]})
    if price_per_hour < 0:
        raise ValidationFailed({"price_per_hour": ["A price cannot be negative."]})
    with transaction.atomic():
        price = GpuPrice.objects.filter(gpu_model=gpu_model).first()
        before = snapshot(price) if price else None
        price = price or GpuPrice(gpu_model=gpu_model)
        price.price_per_hour = price_per_hour
        price.save()
        audit_log(
            actor=actor, action="gpu_price.set", obj=price, before=before, after=snapshot(price)
        )
    return price


def gpu_price_delete(*, actor: Any, price: GpuPrice) -> None:
    with transaction.atomic():
        audit_log(actor=actor, action="gpu_price.delete", obj=price, before=snapshot(price))
        price.delete()
