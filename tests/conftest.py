"""Shared fixtures: the four personas every page and endpoint is checked against.

- platform_admin: runs the whole pool.
- dept_admin: administers department A (projects A and A2).
- researcher: a researcher in project A.
- outsider: a researcher in project B of department B; sees nothing of department A.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from uuid import uuid4

import pytest

from portal.celery import app as celery_app
from tests import factories as f
from tests.isolation import require_sandbox


@pytest.fixture(autouse=True)
def _fast_and_local(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    # Sign-in attempts are counted per address and username: each test starts with none
    # counted, under rates no test reaches unless it sets its own (a test's own CACHES
    # without this alias shares the default cache with the tests before it).
    settings.GPUPOOL_SIGN_IN_RATES = {"sign-in": "1000/min", "sign-in-username": "1000/min"}
    settings.CACHES = settings.CACHES | {
        "sign-in": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": uuid4().hex,
        }
    }
    # Unit tests run tasks in-process; end-to-end tests start real workers and turn this off.
    # The app reads Django settings under the CELERY_ namespace, so the key carries it too.
    previous = celery_app.conf.task_always_eager
    celery_app.conf.CELERY_TASK_ALWAYS_EAGER = True
    yield
    celery_app.conf.CELERY_TASK_ALWAYS_EAGER = previous


@pytest.fixture
def pool(db):
    return f.make_pool("a100")


@pytest.fixture
def org(db, pool):
    """Two departments, three projects, four personas, quotas on pool a100."""
    dept_a = f.make_department("vision")
    dept_b = f.make_department("language")
    project_a = f.make_project(dept_a, "ml-vision")
    project_a2 = f.make_project(dept_a, "ml-detect")
    project_b = f.make_project(dept_b, "nlp")
    f.make_department_quota(dept_a, pool, gpus=8)
    f.make_department_quota(dept_b, pool, gpus=8)
    f.make_project_quota(project_a, pool, gpus=4)
    f.make_project_quota(project_a2, pool, gpus=2)
    f.make_project_quota(project_b, pool, gpus=4)
    platform_admin = f.make_user("admin", platform_admin=True)
    dept_admin = f.make_user("dana")
    researcher = f.make_user("rita")
    outsider = f.make_user("otto")
    f.make_membership(dept_admin, role=f.Role.DEPARTMENT_ADMIN, department=dept_a)
    f.make_membership(researcher, role=f.Role.RESEARCHER, project=project_a)
    f.make_membership(outsider, role=f.Role.RESEARCHER, project=project_b)
    return SimpleNamespace(
        pool=pool,
        dept_a=dept_a,
        dept_b=dept_b,
        project_a=project_a,
        project_a2=project_a2,
        project_b=project_b,
        platform_admin=platform_admin,
        dept_admin=dept_admin,
        researcher=researcher,
        outsider=outsider,
    )


@pytest.fixture
def client_as(client):
    """client_as(user) logs the test client in as that user (None = anonymous)."""

    def login(user):
        client.logout()
        if user is not None:
            client.force_login(user)
        return client

    return login


PERSONAS = ("platform_admin", "dept_admin", "researcher", "outsider")


# --- Browser tests: Playwright driving Debian's Chromium (never a downloaded browser) -------
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless=new",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def chromium():
    import shutil

    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("Debian's chromium is not installed: run scripts/install-test-deps.sh")
    # Playwright's sync API runs an event loop in this thread; the Django ORM calls the
    # tests make around it are still synchronous and safe.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(chromium):
    context = chromium.new_context()
    context.set_default_timeout(15_000)
    tab = context.new_page()
    yield tab
    context.close()


@pytest.fixture
def sandbox_required():
    """Tests of tenant isolation fail, not skip, where pods cannot be sandboxed
    (tests/isolation.py)."""
    return require_sandbox()
