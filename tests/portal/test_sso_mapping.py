"""Claims -> account and roles: the pure mapping, and the login service against the database."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.core.exceptions import ImproperlyConfigured

from portal.models import AuditLog, Membership, Role
from portal.sso import REFUSAL_ATTRIBUTE, sso_login_user
from portal.sso_mapping import (
    Target,
    claim_groups,
    desired_roles,
    parse_group_roles,
    verified_email,
)

MAPPING_TEXT = (
    "gpu-admins=platform_admin; vision-leads=department:vision:department_admin;"
    "vision-ml=project:ml-vision:researcher; vision-guests=project:ml-vision:viewer"
)


def test_the_mapping_is_parsed_and_a_group_may_map_twice():
    mapping = parse_group_roles(MAPPING_TEXT + ";vision-ml=project:ml-detect:viewer", variable="V")
    assert mapping["gpu-admins"] == (Target("platform"),)
    assert mapping["vision-ml"] == (
        Target("project", "ml-vision", "researcher"),
        Target("project", "ml-detect", "viewer"),
    )
    # Group names may hold '=' (LDAP DNs): the last one separates the target.
    assert parse_group_roles("cn=ops,ou=x=platform_admin", variable="V") == {
        "cn=ops,ou=x": (Target("platform"),)
    }
    assert parse_group_roles("", variable="V") == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("vision-ml", "is not group=target"),
        ("=platform_admin", "is not group=target"),
        ("g=project:ml-vision:department_admin", "use platform_admin"),
        ("g=department:vision:researcher", "use platform_admin"),
        ("g=project::viewer", "use platform_admin"),
        ("g=superuser", "use platform_admin"),
    ],
)
def test_a_bad_mapping_stops_start_up_naming_the_variable(text, message):
    with pytest.raises(ImproperlyConfigured, match=message) as caught:
        parse_group_roles(text, variable="GPUPOOL_OIDC_GROUP_ROLES")
    assert "GPUPOOL_OIDC_GROUP_ROLES" in str(caught.value)


def test_groups_become_roles_the_strongest_wins_and_only_named_places_are_governed():
    mapping = parse_group_roles(MAPPING_TEXT, variable="V")
    both = desired_roles({"vision-ml", "vision-guests", "unknown"}, mapping)
    assert both.roles == {("project", "ml-vision"): "researcher"}
    assert both.governed == {("department", "vision"), ("project", "ml-vision")}
    assert both.platform_admin is False
    admin = desired_roles({"gpu-admins", "vision-leads"}, mapping)
    assert admin.platform_admin is True
    assert admin.roles == {("department", "vision"): "department_admin"}
    # Without platform_admin in the mapping, platform-admin status is not governed at all.
    plain = desired_roles({"gpu-admins"}, parse_group_roles("g=project:p:viewer", variable="V"))
    assert plain.platform_admin is None and plain.roles == {}


def test_group_claims_of_each_shape():
    assert claim_groups({"groups": ["a", "b", 3]}, "groups") == {"a", "b"}
    assert claim_groups({"groups": "a"}, "groups") == {"a"}
    assert claim_groups({"groups": {"a": 1}}, "groups") == frozenset()
    assert claim_groups({"groups": ["a"]}, "") == frozenset()


def test_only_a_verified_email_counts_when_required():
    assert verified_email(
        {"email": "Rita@Example.COM", "email_verified": True}, require_verified=True
    ) == ("rita@example.com")
    assert verified_email({"email": "rita@example.com"}, require_verified=True) is None
    assert (
        verified_email(
            {"email": "rita@example.com", "email_verified": "true"}, require_verified=True
        )
        is None
    )
    assert (
        verified_email({"email": "rita@example.com"}, require_verified=False) == "rita@example.com"
    )
    assert (
        verified_email({"email": "not-an-address", "email_verified": True}, require_verified=True)
        is None
    )
    assert verified_email({}, require_verified=False) is None


# --- The login service against the database --------------------------------------------------


@pytest.fixture
def sso(settings):
    settings.GPUPOOL_OIDC_ISSUER = "https://idp.example.com"
    settings.GPUPOOL_OIDC_GROUPS_CLAIM = "groups"
    settings.GPUPOOL_OIDC_GROUP_ROLES = parse_group_roles(MAPPING_TEXT, variable="V")
    settings.GPUPOOL_OIDC_CREATE_USERS = False
    return settings


def claims(email, *groups, verified=True):
    return {"sub": "x", "email": email, "email_verified": verified, "groups": list(groups)}


def request():
    return SimpleNamespace()


def test_a_known_user_is_matched_by_email_ignoring_case(org, sso):
    assert sso_login_user(request(), claims("RITA@example.com")) == org.researcher


def test_an_unknown_user_is_refused_and_audited_unless_creation_is_allowed(org, sso):
    asked = request()
    assert sso_login_user(asked, claims("new@example.com")) is None
    assert "no GPUPool account" in getattr(asked, REFUSAL_ATTRIBUTE)
    row = AuditLog.objects.get(action="sso.login_refused")
    assert row.after["email"] == "new@example.com"

    sso.GPUPOOL_OIDC_CREATE_USERS = True
    user = sso_login_user(request(), claims("New@Example.com", "vision-ml"))
    assert (user.username, user.email, user.has_usable_password()) == (
        "new",
        "new@example.com",
        False,
    )
    assert user.memberships.get().role == Role.RESEARCHER
    assert AuditLog.objects.filter(action="sso.user_create", object_id=str(user.pk)).exists()


def test_deactivated_and_unverified_are_refused(org, sso):
    org.researcher.is_active = False
    org.researcher.save()
    asked = request()
    assert sso_login_user(asked, claims("rita@example.com")) is None
    assert "deactivated" in getattr(asked, REFUSAL_ATTRIBUTE)
    asked = request()
    assert sso_login_user(asked, claims("dana@example.com", verified=False)) is None
    assert "verified" in getattr(asked, REFUSAL_ATTRIBUTE)
    assert AuditLog.objects.filter(action="sso.login_refused").count() == 2


def test_groups_add_change_and_remove_memberships_in_governed_places_only(org, sso):
    user = org.outsider  # researcher in nlp (department language), which the mapping does not name
    sso_login_user(request(), claims(user.email, "vision-guests", "vision-leads", "gpu-admins"))
    user.refresh_from_db()
    places = {(m.role, str(m.project or m.department)) for m in user.memberships.all()}
    assert places == {
        ("viewer", "ml-vision"),
        ("department_admin", "vision"),
        ("researcher", "nlp"),
    }
    assert user.is_platform_admin

    sso_login_user(request(), claims(user.email, "vision-ml"))  # viewer -> researcher; others go
    user.refresh_from_db()
    places = {(m.role, str(m.project or m.department)) for m in user.memberships.all()}
    assert places == {("researcher", "ml-vision"), ("researcher", "nlp")}
    assert not user.is_platform_admin
    actions = list(
        AuditLog.objects.filter(action__startswith="sso.").values_list("action", flat=True)
    )
    assert actions.count("sso.membership_add") == 3
    assert actions.count("sso.membership_remove") == 2
    assert actions.count("sso.platform_admin_set") == 2

    before = AuditLog.objects.count()
    sso_login_user(request(), claims(user.email, "vision-ml"))  # nothing changes, nothing logged
    assert AuditLog.objects.count() == before


def test_platform_admin_status_is_never_touched_unless_mapped(org, sso):
    sso.GPUPOOL_OIDC_GROUP_ROLES = parse_group_roles("g=project:ml-vision:viewer", variable="V")
    assert sso_login_user(request(), claims("admin@example.com")).is_platform_admin
    assert Membership.objects.filter(user=org.platform_admin).count() == 0


def test_a_mapped_place_that_does_not_exist_is_skipped(org, sso):
    sso.GPUPOOL_OIDC_GROUP_ROLES = parse_group_roles("g=project:gone:viewer", variable="V")
    assert sso_login_user(request(), claims("rita@example.com", "g")) == org.researcher
    assert org.researcher.memberships.count() == 1


def test_a_session_made_by_sso_ends_when_the_account_is_deactivated(org, client):
    client.force_login(org.researcher, backend="portal.sso.SsoBackend")
    assert client.get("/").wsgi_request.user == org.researcher
    org.researcher.is_active = False
    org.researcher.save()
    assert not client.get("/").wsgi_request.user.is_authenticated
