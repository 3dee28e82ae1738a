"""What an OpenID Connect login's claims mean here: pure functions, no database.

GPUPOOL_OIDC_GROUP_ROLES maps the identity provider's group names to places in GPUPool,
one `group=target` per entry, entries separated by ';':

    gpu-admins=platform_admin; vision-leads=department:vision:department_admin;
    vision-ml=project:ml-vision:researcher; vision-guests=project:ml-vision:viewer

The mapping governs only the places it names: on each login, a person's memberships in those
departments and projects (and platform-admin status, when `platform_admin` is a target) are made
to match their groups. Memberships elsewhere, given by hand, are left alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

PLATFORM_ADMIN = "platform_admin"
DEPARTMENT_ADMIN = "department_admin"
PROJECT_ROLES = ("researcher", "viewer")  # strongest first: two groups on one project
MAX_ENTRIES = 500


@dataclass(frozen=True)
class Target:
    """Where a group puts someone: kind is platform, department or project."""

    kind: str
    name: str = ""
    role: str = ""

    @property
    def place(self) -> tuple[str, str]:
        return (self.kind, self.name)


def parse_target(text: str, *, variable: str, group: str) -> Target:
    parts = [part.strip() for part in text.strip().split(":")]
    if parts == [PLATFORM_ADMIN]:
        return Target("platform")
    if len(parts) == 3 and parts[0] == "department" and parts[1] and parts[2] == DEPARTMENT_ADMIN:
        return Target("department", parts[1], DEPARTMENT_ADMIN)
    if len(parts) == 3 and parts[0] == "project" and parts[1] and parts[2] in PROJECT_ROLES:
        return Target("project", parts[1], parts[2])
    raise ImproperlyConfigured(
        f"{variable}: group {group!r} maps to {text.strip()!r}; use platform_admin, "
        f"department:<name>:department_admin or project:<name>:{'|'.join(PROJECT_ROLES)}"
    )


def parse_group_roles(text: str, *, variable: str) -> dict[str, tuple[Target, ...]]:
    """`group=target; group=target ...` -> {group: targets}; a group may appear twice."""
    mapping: dict[str, list[Target]] = {}
    entries = [entry.strip() for entry in text.replace("\n", ";").split(";") if entry.strip()]
    if len(entries) > MAX_ENTRIES:
        raise ImproperlyConfigured(f"{variable}: at most {MAX_ENTRIES} entries")
    for entry in entries:
        group, separator, target = entry.rpartition("=")
        if not separator or not group.strip():
            raise ImproperlyConfigured(f"{variable}: {entry!r} is not group=target")
        group = group.strip()
        mapping.setdefault(group, []).append(parse_target(target, variable=variable, group=group))
    return {group: tuple(targets) for group, targets in mapping.items()}


def claim_groups(claims: Mapping[str, Any], claim: str) -> frozenset[str]:
    """The group names in `claim`: a list of strings, or one string; anything else is none."""
    value = claims.get(claim) if claim else None
    if isinstance(value, str):
        return frozenset({value})
    if isinstance(value, list | tuple):
        return frozenset(item for item in value if isinstance(item, str))
    return frozenset()


@dataclass(frozen=True)
class Desired:
    """What the groups say: platform admin (None = not governed), and a role per place."""

    platform_admin: bool | None
    roles: dict[tuple[str, str], str]  # (kind, name) -> role, for places the groups grant
    governed: frozenset[tuple[str, str]]  # every place the mapping names


def desired_roles(groups: Iterable[str], mapping: Mapping[str, tuple[Target, ...]]) -> Desired:
    targets = [target for targets in mapping.values() for target in targets]
    governed = frozenset(t.place for t in targets if t.kind != "platform")
    held = [target for group in set(groups) for target in mapping.get(group, ())]
    roles: dict[tuple[str, str], str] = {}
    for target in held:
        if target.kind == "platform":
            continue
        current = roles.get(target.place)
        if current is None or _rank(target.role) < _rank(current):
            roles[target.place] = target.role
    governs_platform = any(t.kind == "platform" for t in targets)
    platform = any(t.kind == "platform" for t in held) if governs_platform else None
    return Desired(platform_admin=platform, roles=roles, governed=governed)


def _rank(role: str) -> int:
    return PROJECT_ROLES.index(role) if role in PROJECT_ROLES else -1


def verified_email(claims: Mapping[str, Any], *, require_verified: bool) -> str | None:
    """The lower-cased e-mail of the claims, or None when missing, malformed or unverified."""
    email = claims.get("email")
    if not isinstance(email, str) or "@" not in email or len(email) > 254:
        return None
    if require_verified and claims.get("email_verified") is not True:
        return None
    return email.strip().lower()
