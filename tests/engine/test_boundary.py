"""The engine package imports nothing from Django, Celery or Kubernetes."""

from __future__ import annotations

import ast
from pathlib import Path

import scheduling.engine

BANNED = ("django", "celery", "kubernetes", "rest_framework", "kombu")
ENGINE_DIR = Path(scheduling.engine.__file__).parent


def _imported_modules(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_no_engine_module_imports_django_celery_or_kubernetes() -> None:
    offenders = []
    files = sorted(ENGINE_DIR.rglob("*.py"))
    assert files, "the engine package has no modules to check"
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        for name in _imported_modules(tree):
            if name.split(".")[0] in BANNED:
                offenders.append(f"{path.relative_to(ENGINE_DIR)}: {name}")
    assert offenders == []


def test_the_import_walker_notices_a_banned_import() -> None:
    tree = ast.parse("import os\nfrom django.db import models\nimport celery.app\n")
    assert _imported_modules(tree) == ["os", "django.db", "celery.app"]
