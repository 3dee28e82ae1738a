"""Changes made in Django's admin (/django-admin/: platform admins with their portal session,
and staff) are audited like the portal's."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib import admin

from clusters.metrics.models import GpuPrice
from portal.admin import AuditedAdmin
from portal.models import AuditLog, User
from scheduling.models import WorkloadPolicy

pytestmark = pytest.mark.django_db

PRICES = "/django-admin/metrics/gpuprice/"


@pytest.fixture
def operator(db):
    return User.objects.create_superuser("root", "root@example.org", "pw-not-used")


def _actions() -> list[tuple[str, str]]:
    return list(AuditLog.objects.order_by("id").values_list("action", "object_repr"))


def test_every_model_in_the_django_admin_is_audited():
    assert admin.site._registry, "nothing registered"
    unaudited = [
        model._meta.label
        for model, model_admin in admin.site._registry.items()
        if not isinstance(model_admin, AuditedAdmin)
    ]
    assert unaudited == []


def test_adding_changing_and_deleting_a_row_there_writes_the_audit_log(client_as, operator):
    client = client_as(operator)
    form = {"gpu_model": "H100", "price_per_hour": "2.5", "currency": "EUR"}
    assert client.post(f"{PRICES}add/", form).status_code == 302
    price = GpuPrice.objects.get(gpu_model="H100")
    assert (
        client.post(f"{PRICES}{price.pk}/change/", form | {"price_per_hour": "3"}).status_code
        == 302
    )
    assert client.post(f"{PRICES}{price.pk}/delete/", {"post": "yes"}).status_code == 302
    entries = list(AuditLog.objects.order_by("id"))
    assert [e.action for e in entries] == [
        "django-admin.gpuprice.create",
        "django-admin.gpuprice.update",
        "django-admin.gpuprice.delete",
    ]
    assert all(e.actor == operator for e in entries)
    assert Decimal(entries[1].before["price_per_hour"]) == Decimal("2.5")
    assert Decimal(entries[1].after["price_per_hour"]) == Decimal("3")
    assert entries[2].before["gpu_model"] == "H100" and entries[2].after is None
    assert not GpuPrice.objects.exists()


def test_a_bulk_delete_records_each_row_and_a_refused_form_records_nothing(client_as, operator):
    client = client_as(operator)
    prices = [GpuPrice.objects.create(gpu_model=m, price_per_hour=1) for m in ("A100", "L4")]
    response = client.post(
        PRICES,
        {"action": "delete_selected", "_selected_action": [p.pk for p in prices], "post": "yes"},
    )
    assert response.status_code == 302
    assert sorted(_actions()) == [
        ("django-admin.gpuprice.delete", "A100: 1.0000 USD/GPU-hour"),
        ("django-admin.gpuprice.delete", "L4: 1.0000 USD/GPU-hour"),
    ]
    AuditLog.objects.all().delete()
    bad = client.post(f"{PRICES}add/", {"gpu_model": "H100", "price_per_hour": "cheap"})
    assert bad.status_code == 200 and _actions() == []


def test_a_department_row_changed_there_is_filed_under_its_department(client_as, operator, org):
    policy = WorkloadPolicy.objects.create(department=org.dept_a, max_runtime_s=3600)
    url = f"/django-admin/scheduling/workloadpolicy/{policy.pk}/delete/"
    assert client_as(operator).post(url, {"post": "yes"}).status_code == 302
    entry = AuditLog.objects.get()
    assert (entry.action, entry.department) == ("django-admin.workloadpolicy.delete", org.dept_a)


def test_a_platform_admin_reaches_the_django_admin_with_the_portal_session(client_as, org):
    client = client_as(org.platform_admin)  # signed in to the portal, not a staff user
    assert not org.platform_admin.is_staff
    page = client.get("/django-admin/")
    assert page.status_code == 200 and "GPUPool administration" in page.content.decode()
    assert client.get(PRICES).status_code == 200
    assert client.get(PRICES + "add/").status_code == 200


@pytest.mark.parametrize("who", ["researcher", "dept_admin"])
def test_anyone_else_signed_in_is_sent_to_the_admin_sign_in(client_as, org, who):
    client = client_as(getattr(org, who))
    for path in ("/django-admin/", PRICES):
        page = client.get(path)
        assert page.status_code == 302 and "/django-admin/login/" in page["Location"], path
