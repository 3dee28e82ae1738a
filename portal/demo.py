"""The demo organisation: 2 departments, 4 projects, an admin and two researchers.

Passwords are made once, kept in var/demo-credentials.txt, and printed on every run.
"""

from __future__ import annotations

import secrets
from decimal import Decimal
from pathlib import Path
from typing import TextIO

from django.conf import settings

from clusters.models import NodePool
from portal.models import Department, DepartmentQuota, Membership, Project, ProjectQuota, Role, User

DEPARTMENTS = {
    "Vision": {"a100": 12, "projects": {"ml-vision": 6, "ml-detect": 4}},
    "Language": {"a100": 8, "projects": {"nlp-llm": 5, "nlp-speech": 2}},
}
USERS = [
    ("admin", "Ada", "Admin", None),
    ("alice", "Alice", "Researcher", "ml-vision"),
    ("bob", "Bob", "Researcher", "nlp-llm"),
]


def _credentials_file() -> Path:
    return Path(settings.VAR_DIR) / "demo-credentials.txt"


def _passwords() -> dict[str, str]:
    path = _credentials_file()
    known: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            name, _, password = line.partition(" ")
            known[name] = password
    for username, *_ in USERS:
        known.setdefault(username, secrets.token_urlsafe(9))
    path.write_text("".join(f"{name} {pw}\n" for name, pw in sorted(known.items())))
    path.chmod(0o600)
    return known


def _organisation(pool: NodePool) -> None:
    for dept_name, spec in DEPARTMENTS.items():
        department, _ = Department.objects.get_or_create(name=dept_name)
        DepartmentQuota.objects.get_or_create(
            department=department, node_pool=pool, defaults={"gpus": Decimal(spec["a100"])}
        )
        for project_name, gpus in spec["projects"].items():
            project, _ = Project.objects.get_or_create(
                name=project_name,
                defaults={"department": department, "namespace": f"gpupool-{project_name}"},
            )
            ProjectQuota.objects.get_or_create(
                project=project, node_pool=pool, defaults={"gpus": Decimal(gpus)}
            )


def _users(passwords: dict[str, str]) -> None:
    for username, first, last, project_name in USERS:
        user, created = User.objects.get_or_create(
            username=username,
            defaults={
                "email": f"{username}@gpupool.example",
                "first_name": first,
                "last_name": last,
                "is_platform_admin": project_name is None,
            },
        )
        # Always the password printed below, even if the credentials file was lost.
        if not user.check_password(passwords[username]):
            user.set_password(passwords[username])
            user.save()
        if project_name:
            Membership.objects.get_or_create(
                user=user,
                project=Project.objects.get(name=project_name),
                defaults={"role": Role.RESEARCHER},
            )


def seed(stdout: TextIO) -> None:
    """The first start: the pool, the organisation and its users."""
    pool, _ = NodePool.objects.get_or_create(name="a100")
    _organisation(pool)
    passwords = _passwords()
    _users(passwords)
    _print(stdout, passwords)


def every_start(stdout: TextIO) -> None:
    """Later starts: the demo users that are still there get the password printed for
    them (even if the credentials file was lost); the rest is as admins left it."""
    passwords = _passwords()
    for user in User.objects.filter(username__in=[name for name, *_ in USERS]):
        if not user.check_password(passwords[user.username]):
            user.set_password(passwords[user.username])
            user.save()
    _print(stdout, passwords)


def _print(stdout: TextIO, passwords: dict[str, str]) -> None:
    present = set(User.objects.values_list("username", flat=True))
    stdout.write("Demo users (username / password):\n")
    for username, *_rest, project_name in USERS:
        if username not in present:
            continue
        role = "platform admin" if project_name is None else f"researcher in {project_name}"
        stdout.write(f"  {username:<8} {passwords[username]:<16} {role}\n")
    stdout.write("\n")
