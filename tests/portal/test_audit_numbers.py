"""The audit log writes numbers as people do (issue 28): a department quota of 100 GPUs was
shown as `1E+2` (Decimal.normalize), 2.50 as 2.50."""

from __future__ import annotations

from decimal import Decimal

import pytest

from portal.models import AuditLog
from portal.services.quotas import quota_set

pytestmark = pytest.mark.django_db


def test_a_quota_of_100_is_audited_as_100(org):
    quota_set(
        actor=org.platform_admin, owner=org.dept_a, table={org.pool: {"gpus": Decimal("100")}}
    )
    entry = AuditLog.objects.filter(action__contains="quota").latest("id")
    text = str(entry.after)
    assert "'100'" in text and "E+" not in text, entry.after


def test_a_fraction_keeps_its_digits_without_trailing_zeros(org):
    quota_set(
        actor=org.platform_admin, owner=org.dept_a, table={org.pool: {"gpus": Decimal("6.50")}}
    )
    entry = AuditLog.objects.filter(action__contains="quota").latest("id")
    assert "'6.5'" in str(entry.after), entry.after
