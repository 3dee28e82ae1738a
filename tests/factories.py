"""Small builders for test data. Plain functions: explicit beats clever."""

from __future__ import annotations

import itertools
from decimal import Decimal
from typing import Any

from clusters.models import NodePool
from portal.models import Department, DepartmentQuota, Membership, Project, ProjectQuota, Role, User

_seq = itertools.count(1)
PASSWORD = "correct-horse-battery-staple"


def make_user(username: str | None = None, *, platform_admin: bool = False, **extra: Any) -> User:
    username = username or f"user{next(_seq)}"
    return User.objects.create_user(
        username=username,
        email=f"{username}@example.com",
        password=PASSWORD,
        is_platform_admin=platform_admin,
        **extra,
    )


def make_pool(name: str = "a100", **extra: Any) -> NodePool:
    pool, _ = NodePool.objects.get_or_create(name=name, defaults=extra)
    return pool


def make_department(name: str | None = None, **extra: Any) -> Department:
    return Department.objects.create(name=name or f"dept{next(_seq)}", **extra)


def make_project(department: Department, name: str | None = None, **extra: Any) -> Project:
    name = name or f"proj{next(_seq)}"
    return Project.objects.create(department=department, name=name, namespace=f"gp-{name}", **extra)


def make_membership(
    user: User, *, role: str, project: Project | None = None, department: Department | None = None
) -> Membership:
    return Membership.objects.create(user=user, role=role, project=project, department=department)


def make_department_quota(
    department: Department, pool: NodePool, gpus: float | str = 0, **extra: Any
) -> DepartmentQuota:
    return DepartmentQuota.objects.create(
        department=department, node_pool=pool, gpus=Decimal(str(gpus)), **extra
    )


def make_project_quota(
    project: Project, pool: NodePool, gpus: float | str = 0, **extra: Any
) -> ProjectQuota:
    return ProjectQuota.objects.create(
        project=project, node_pool=pool, gpus=Decimal(str(gpus)), **extra
    )


__all__ = [
    "PASSWORD",
    "Role",
    "make_department",
    "make_department_quota",
    "make_membership",
    "make_pool",
    "make_project",
    "make_project_quota",
    "make_user",
]
