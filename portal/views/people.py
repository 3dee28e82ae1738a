"""Users: the list, invitations, memberships and roles, deactivation; and the audit log."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from portal import selectors, services
from portal.errors import ValidationFailed
from portal.forms import (
    AuditFilterForm,
    InviteForm,
    MembershipForm,
    UserEditForm,
)
from portal.models import User
from portal.permissions import admin_required, can_manage_user, is_platform_admin
from portal.views.common import confirmed, form_saved, posted, refusal

AUDIT_PAGE_SIZE = 50


@admin_required
def user_list(request: HttpRequest) -> HttpResponse:
    users = selectors.user_list_for_admin(request.user)
    return render(request, "portal/user_list.html", {"users": users})


@admin_required
def user_invite(request: HttpRequest) -> HttpResponse:
    platform = is_platform_admin(request.user)
    form = InviteForm(posted(request), user=request.user, platform=platform)
    done = form_saved(
        request,
        form,
        lambda: services.user_invite(actor=request.user, **form.cleaned_data),
        message=lambda user: f"Invitation sent to {user.email}.",
        then=lambda user: redirect("user_edit", pk=user.pk),
    )
    return done or render(request, "portal/user_invite.html", {"form": form})


def _managed_user(request: HttpRequest, pk: int) -> User:
    user = get_object_or_404(selectors.user_list_for_admin(request.user), pk=pk)
    if not can_manage_user(request.user, user):
        raise PermissionDenied("This person also works outside your department.")
    return user


def _user_page(request: HttpRequest, user: User, **forms: object) -> HttpResponse:
    platform = is_platform_admin(request.user)
    initial = {f: getattr(user, f) for f in ("first_name", "last_name", "email")}
    initial["is_platform_admin"] = user.is_platform_admin
    context = {
        "person": user,
        "form": forms.get("form") or UserEditForm(initial=initial, platform=platform),
        "membership_form": forms.get("membership_form") or MembershipForm(user=request.user),
        "memberships": selectors.memberships_visible_to(request.user, user),
    }
    return render(request, "portal/user_edit.html", context)


@admin_required
def user_edit(request: HttpRequest, pk: int) -> HttpResponse:
    user = _managed_user(request, pk)
    form = UserEditForm(posted(request), platform=is_platform_admin(request.user))
    done = form_saved(
        request,
        form,
        lambda: services.user_update(actor=request.user, user=user, **form.cleaned_data),
        message=lambda saved: f"{saved.username} saved.",
        then=lambda saved: redirect("user_edit", pk=saved.pk),
    )
    return done or _user_page(request, user, form=form if form.is_bound else None)


@admin_required
@require_POST
def membership_add(request: HttpRequest, pk: int) -> HttpResponse:
    user = get_object_or_404(selectors.user_list_for_admin(request.user), pk=pk)
    form = MembershipForm(request.POST, user=request.user)
    done = form_saved(
        request,
        form,
        lambda: services.membership_add(actor=request.user, user=user, **form.cleaned_data),
        message=lambda _: f"Membership added to {user.username}.",
        then=lambda _: redirect("user_edit", pk=user.pk),
    )
    return done or _user_page(request, user, membership_form=form)


@admin_required
@require_POST
def membership_remove(request: HttpRequest, pk: int, membership_pk: int) -> HttpResponse:
    user = get_object_or_404(selectors.user_list_for_admin(request.user), pk=pk)
    membership = get_object_or_404(
        selectors.memberships_visible_to(request.user, user), pk=membership_pk
    )
    services.membership_remove(actor=request.user, membership=membership)
    messages.success(request, f"Removed: {membership}.")
    return redirect("user_edit", pk=user.pk)


@admin_required
def user_deactivate(request: HttpRequest, pk: int) -> HttpResponse:
    user = _managed_user(request, pk)
    return confirmed(
        request,
        ("portal/user_deactivate.html", {"person": user}),
        lambda: services.user_deactivate(actor=request.user, user=user),
        message=f"{user.username} can no longer sign in.",
        then=redirect("user_list"),
        back=redirect("user_edit", pk=user.pk),
    )


@admin_required
@require_POST
def user_reactivate(request: HttpRequest, pk: int) -> HttpResponse:
    user = _managed_user(request, pk)
    try:
        services.user_reactivate(actor=request.user, user=user)
    except ValidationFailed as exc:
        messages.error(request, refusal(exc))
    else:
        messages.success(request, f"{user.username} can sign in again.")
    return redirect("user_edit", pk=user.pk)


@admin_required
def audit_log(request: HttpRequest) -> HttpResponse:
    rows = selectors.audit_log_for_user(request.user)
    form = AuditFilterForm(
        request.GET or None, user=request.user, choices=selectors.audit_choices(rows)
    )
    if form.is_bound and form.is_valid():
        rows = selectors.audit_log_filter(rows, form.cleaned_data)
    page = Paginator(rows, AUDIT_PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {"form": form, "page": page, "query": query.urlencode()}
    return render(request, "portal/audit_log.html", context)
