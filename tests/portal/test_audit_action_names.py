"""Audit actions have one naming style, `noun.verb` (issue 16), and rows written under the
old snake_case names are renamed by portal/migrations/0005_audit_action_names.py."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

ROOT = Path(__file__).resolve().parents[2]
STYLE = re.compile(r"^[a-z][a-z_]*(\.[a-z][a-z_]*)+$")
APPS = ("portal", "scheduling", "clusters", "workspaces")
ARGPARSE = {"store_true", "store_false", "store_const", "append", "count", "version"}


def _actions_in_code() -> dict[str, str]:
    """Every constant string passed as `action=` in the apps' code, with where it is."""
    found: dict[str, str] = {}
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                for kw in node.keywords:
                    value = kw.value.value if isinstance(kw.value, ast.Constant) else None
                    # argparse's action="store_true" and the like are not audit actions.
                    if kw.arg == "action" and isinstance(value, str) and value not in ARGPARSE:
                        found[value] = f"{path.relative_to(ROOT)}:{node.lineno}"
    return found


def test_every_audit_action_in_the_code_is_noun_dot_verb():
    actions = _actions_in_code()
    assert len(actions) > 20, "the scan found too few actions: is it still looking?"
    assert {a: where for a, where in actions.items() if not STYLE.match(a)} == {}


@pytest.mark.django_db(transaction=True)
def test_the_migration_renames_old_rows_and_back():
    executor = MigrationExecutor(connection)
    before = [("portal", "0004_ssh_keys_build")]
    after = [("portal", "0005_audit_action_names")]
    executor.migrate(before)
    old_apps = executor.loader.project_state(before).apps
    AuditLog = old_apps.get_model("portal", "AuditLog")
    for action in ("workload_submit", "workspace_share_set", "department.create"):
        AuditLog.objects.create(action=action, object_type="x", object_id="1", object_repr="x")
    executor = MigrationExecutor(connection)
    executor.migrate(after)
    new_apps = executor.loader.project_state(after).apps
    rows = new_apps.get_model("portal", "AuditLog").objects.values_list("action", flat=True)
    assert sorted(rows) == ["department.create", "workload.submit", "workspace.share"]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    rows = AuditLog.objects.values_list("action", flat=True)
    assert sorted(rows) == ["department.create", "workload_submit", "workspace_share_set"]
    MigrationExecutor(connection).migrate(executor.loader.graph.leaf_nodes())
