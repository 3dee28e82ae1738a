"""People: invitations, memberships and roles, deactivation.

A department admin acts only on people and projects inside their department, and never
makes or touches platform admins.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.contrib.auth.tokens import default_token_generator
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from portal import permissions
from portal.audit import audit_log, snapshot
from portal.errors import ValidationFailed
from portal.models import Department, Membership, Project, Role, User
from portal.permissions import can_admin_department, can_manage_user
from portal.services.common import create_audited, raise_if, require, save_audited

USER_FIELDS = ["username", "email", "first_name", "last_name", "is_active", "is_platform_admin"]


def _memberships(user: User) -> list[Membership]:
    return list(user.memberships.select_related("department", "project__department"))


def _scope_department(project: Project | None, department: Department | None) -> Department:
    if project is not None:
        return project.department
    if department is None:
        raise ValidationFailed({"project": ["Choose a project (or a department for its admin)."]})
    return department


def _membership_errors(
    role: str, project: Project | None, department: Department | None
) -> dict[str, list[str]]:
    if role not in Role.values:
        return {"role": [f"Choose one of: {', '.join(Role.values)}."]}
    if role == Role.DEPARTMENT_ADMIN and (department is None or project is not None):
        return {"department": ["A department admin holds a department, not a project."]}
    if role != Role.DEPARTMENT_ADMIN and (project is None or department is not None):
        return {"project": [f"A {Role(role).label.lower()} belongs to a project."]}
    return {}


# --- Invitations ------------------------------------------------------------------------------


def _username_from(email: str) -> str:
    base = re.sub(r"[^\w.@+-]", "", email.split("@")[0]) or "user"
    candidate, n = base[:140], 1
    while User.objects.filter(username=candidate).exists():
        n += 1
        candidate = f"{base[:140]}{n}"
    return candidate


def _invite_errors(email: str, username: str) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", email):
        errors["email"] = ["Enter a valid e-mail address."]
    elif existing := User.objects.filter(email__iexact=email).first():
        hint = "" if existing.is_active else " It is deactivated: reactivate it from its page."
        errors["email"] = [f"{email} already has an account.{hint}"]
    if username and User.objects.filter(username=username).exists():
        errors["username"] = [f"The username {username} is taken."]
    elif username and not re.fullmatch(r"[\w.@+-]{1,150}", username):
        errors["username"] = ["Use letters, digits and @/./+/-/_ only."]
    return errors


def set_password_link(user: User) -> str:
    """An absolute link to Django's password_reset_confirm page for this user."""
    uid = urlsafe_base64_encode(force_bytes(user.pk))
    token = default_token_generator.make_token(user)
    path = reverse("password_reset_confirm", kwargs={"uidb64": uid, "token": token})
    return f"{settings.SITE_URL}{path}"


def _send_invitation(user_id: int, inviter: str) -> None:
    user = User.objects.get(pk=user_id)
    context = {"user": user, "inviter": inviter, "link": set_password_link(user)}
    send_mail(
        subject="You are invited to GPUPool",
        message=render_to_string("registration/invitation_email.txt", context),
        from_email=None,
        recipient_list=[user.email],
    )


def _account_create(**fields: Any) -> User:
    """An account that cannot sign in until its owner sets a password from the e-mailed link."""
    user = User(**fields)
    user.set_unusable_password()
    try:
        with transaction.atomic():  # a savepoint: the invitation's transaction stays usable
            user.save()
    except IntegrityError:  # the same e-mail or username invited at the same moment
        raise ValidationFailed(
            {"email": [f"{fields['email']} was given an account at the same moment; reload."]}
        ) from None
    return user


@transaction.atomic
def user_invite(
    *,
    actor: Any,
    email: str,
    username: str = "",
    first_name: str = "",
    last_name: str = "",
    role: str = Role.RESEARCHER,
    project: Project | None = None,
    department: Department | None = None,
    is_platform_admin: bool = False,
) -> User:
    """Create an account without a usable password and e-mail a link to set one.

    The mail leaves on commit: a rolled-back invitation sends nothing.
    """
    platform = permissions.is_platform_admin(actor)
    require(permissions.is_admin(actor), "Only admins invite people.")
    require(platform or not is_platform_admin, "Only platform admins make platform admins.")
    email, username = email.strip().lower(), username.strip()
    errors = _invite_errors(email, username)
    if not platform or project or department:
        errors.update(_membership_errors(role, project, department))
    raise_if(errors)
    user = _account_create(
        username=username or _username_from(email),
        email=email,
        first_name=first_name.strip(),
        last_name=last_name.strip(),
        is_platform_admin=is_platform_admin,
    )
    scope = _scope_department(project, department) if project or department else None
    audit_log(
        actor=actor,
        action="user.invite",
        obj=user,
        after=snapshot(user, USER_FIELDS),
        department=scope,  # so the department's admins find their invitations in the log
    )
    if project or department:
        membership_add(actor=actor, user=user, role=role, project=project, department=department)
    inviter = actor.get_full_name() or actor.username
    transaction.on_commit(lambda: _send_invitation(user.pk, inviter))
    return user


# --- Memberships and accounts -----------------------------------------------------------------


@transaction.atomic
def membership_add(
    *,
    actor: Any,
    user: User,
    role: str,
    project: Project | None = None,
    department: Department | None = None,
) -> Membership:
    raise_if(_membership_errors(role, project, department))
    scope = _scope_department(project, department)
    require(can_admin_department(actor, scope), f"You do not administer {scope.name}.")
    existing = Membership.objects.filter(user=user, project=project, department=department)
    if existing.exists():
        where = (project or department).name  # type: ignore[union-attr]
        raise ValidationFailed({"role": [f"{user.username} is already a member of {where}."]})
    values = {"user": user, "role": role, "project": project, "department": department}
    return create_audited(
        Membership, values, actor=actor, action="membership.add", department=scope
    )


@transaction.atomic
def membership_remove(*, actor: Any, membership: Membership) -> None:
    scope = _scope_department(membership.project, membership.department)
    require(can_admin_department(actor, scope), f"You do not administer {scope.name}.")
    audit_log(
        actor=actor,
        action="membership.remove",
        obj=membership,
        before=snapshot(membership),
        department=scope,
    )
    membership.delete()


@transaction.atomic
def user_update(
    *,
    actor: Any,
    user: User,
    first_name: str,
    last_name: str,
    email: str,
    is_platform_admin: bool | None = None,
) -> User:
    require(can_manage_user(actor, user), "You may not change this user.")
    platform = permissions.is_platform_admin(actor)
    require(is_platform_admin is None or platform, "Only platform admins make platform admins.")
    email = email.strip().lower()
    if User.objects.filter(email__iexact=email).exclude(pk=user.pk).exists():
        raise ValidationFailed({"email": [f"{email} already has an account."]})
    if is_platform_admin is False and user.pk == actor.pk:
        raise ValidationFailed({"is_platform_admin": ["You cannot remove your own admin rights."]})
    changes: dict[str, Any] = {
        "first_name": first_name.strip(),
        "last_name": last_name.strip(),
        "email": email,
    }
    if is_platform_admin is not None:
        changes["is_platform_admin"] = is_platform_admin
    save_audited(
        user,
        changes,
        actor=actor,
        action="user.update",
        department=_home_department(user),
        fields=USER_FIELDS,
    )
    return user


def _home_department(user: User) -> Department | None:
    """The one department a person works in, so its admins find changes to them in the
    audit log; None for someone in several departments or none (platform admins read those)."""
    departments = {m.department or m.project.department for m in _memberships(user)}
    return departments.pop() if len(departments) == 1 else None


@transaction.atomic
def user_deactivate(*, actor: Any, user: User) -> User:
    """Stop someone signing in (pages and API tokens); their history stays."""
    require(can_manage_user(actor, user), "You may not deactivate this user.")
    if user.pk == actor.pk:
        raise ValidationFailed("You cannot deactivate yourself.")
    return _set_active(actor, user, active=False)


@transaction.atomic
def user_reactivate(*, actor: Any, user: User) -> User:
    """Let a deactivated person sign in again, with the password and memberships they had."""
    require(can_manage_user(actor, user), "You may not reactivate this user.")
    if user.is_active:
        raise ValidationFailed(f"{user.username} is active already.")
    return _set_active(actor, user, active=True)


def _set_active(actor: Any, user: User, *, active: bool) -> User:
    save_audited(
        user,
        {"is_active": active},
        actor=actor,
        action="user.reactivate" if active else "user.deactivate",
        department=_home_department(user),
        fields=USER_FIELDS,
        update_fields=["is_active"],
    )
    return user
