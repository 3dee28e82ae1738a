"""`make demo` seeds through `manage.py seed_demo` on every start: a second run changes nothing
and prints the same passwords, which sign in."""

from __future__ import annotations

import io
import re

import pytest
from django.apps import apps
from django.core.management import call_command

from portal.models import Department, Membership, Project, User

pytestmark = pytest.mark.django_db


def _counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in apps.get_models()}


def _seed() -> str:
    out = io.StringIO()
    call_command("seed_demo", stdout=out)
    return out.getvalue()


def test_seeding_twice_keeps_one_organisation_and_the_same_passwords(settings, tmp_path, client):
    settings.VAR_DIR = tmp_path
    first = _seed()
    counts = _counts()
    second = _seed()
    assert _counts() == counts
    assert (Department.objects.count(), Project.objects.count()) == (2, 4)
    assert sorted(User.objects.values_list("username", "is_platform_admin")) == [
        ("admin", True),
        ("alice", False),
        ("bob", False),
    ]
    assert Membership.objects.filter(role="researcher").count() == 2
    passwords = dict(re.findall(r"^  (admin|alice|bob)\s+(\S+)", first, re.MULTILINE))
    assert len(passwords) == 3
    assert dict(re.findall(r"^  (admin|alice|bob)\s+(\S+)", second, re.MULTILINE)) == passwords
    for username, password in passwords.items():
        assert client.login(username=username, password=password), username


def test_the_demo_prices_every_gpu_model_of_its_clusters(settings, tmp_path):
    from clusters.metrics.models import GpuPrice
    from clusters.models import Gpu

    settings.VAR_DIR = tmp_path
    _seed()
    models = set(Gpu.objects.exclude(model="").values_list("model", flat=True))
    assert models, "the demo has GPUs"
    prices = dict(GpuPrice.objects.values_list("gpu_model", "price_per_hour"))
    assert set(prices) == models and all(price > 0 for price in prices.values())
    GpuPrice.objects.update(price_per_hour=9)  # an admin's change is kept on the next start
    _seed()
    assert set(GpuPrice.objects.values_list("price_per_hour", flat=True)) == {9}


def test_the_demo_starts_again_on_whatever_admins_left_behind(settings, tmp_path, client):
    """Seeding is once per database; later starts leave the admins' changes alone: a renamed
    project, department, cluster or user, a deleted workload, are neither recreated nor in the
    way (a renamed project once stopped every start: UNIQUE constraint on namespace)."""
    from clusters.models import Cluster
    from scheduling.models import Workload

    settings.VAR_DIR = tmp_path
    first = _seed()
    Project.objects.filter(name="ml-vision").update(name="vision-main")
    Department.objects.filter(name="Language").update(name="Speech and Text")
    Cluster.objects.filter(name="sim").update(name="sim-renamed")
    User.objects.filter(username="bob").update(username="robert", is_active=False)
    User.objects.filter(username="alice").update(username="alice2")
    gone = Workload.objects.order_by("pk").first()
    gone_name = gone.name
    gone.delete()
    counts = _counts()
    second = _seed()
    assert _counts() == counts, "nothing recreated"
    assert not Project.objects.filter(name="ml-vision").exists()
    assert not Cluster.objects.filter(name="sim").exists()
    assert not Workload.objects.filter(name=gone_name).exists()
    assert not User.objects.filter(username__in=("alice", "bob")).exists()
    passwords = dict(re.findall(r"^  (admin)\s+(\S+)", first, re.MULTILINE))
    assert dict(re.findall(r"^  (admin)\s+(\S+)", second, re.MULTILINE)) == passwords
    assert client.login(username="admin", password=passwords["admin"])
    assert "bob" not in second.split("Demo users")[1].split("\n\n")[0]


def test_a_demo_seeded_before_seeding_was_remembered_starts_too(settings, tmp_path):
    """A database seeded by an older version (no DemoSeed rows) whose project an admin
    renamed: the organisation's seeder fails on it, is rolled back whole and reported,
    and the demo starts."""
    from portal.models import DemoSeed

    settings.VAR_DIR = tmp_path
    _seed()
    DemoSeed.objects.all().delete()
    Project.objects.filter(name="ml-vision").update(name="vision-main")
    counts = _counts()
    out = _seed()
    assert "Demo data of portal.demo left as the admins changed it (IntegrityError" in out
    assert not Project.objects.filter(name="ml-vision").exists()
    assert {k: v for k, v in _counts().items() if k != "DemoSeed"} == {
        k: v for k, v in counts.items() if k != "DemoSeed"
    }
    assert DemoSeed.objects.filter(name="portal.demo").exists()


def test_the_readme_describes_the_demo_cluster_as_seeded():
    """The README once said 4 nodes x 8 A100 while the demo had 6 nodes and 48 GPUs, MIG
    included: it carries the words clusters.demo makes from the seeded description."""
    from pathlib import Path

    from clusters.demo import simulated_summary

    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    assert f"The demo has one simulated cluster, `sim` ({simulated_summary()};" in readme
