"""Light pages: the vendored plotly bundle matches the server's plotly, holds every chart
type the portal draws, and collected static files are served compressed and cached."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import brotli
import plotly
import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import RequestFactory, override_settings
from whitenoise.middleware import WhiteNoiseMiddleware

ROOT = Path(settings.BASE_DIR)
BUNDLE = ROOT / "static" / "vendor" / "plotly" / "plotly-cartesian-3.0.1.min.js"
# The trace modules of plotly.js's cartesian bundle (its README).
CARTESIAN = {
    "bar", "box", "contour", "heatmap", "histogram", "histogram2d", "histogram2dcontour",
    "image", "pie", "scatter", "scatterternary", "violin",
}  # fmt: skip


def _version(js: Path) -> str:
    found = re.search(r"plotly\.js(?: \([a-z -]+\))? v(\d+\.\d+\.\d+)", js.read_text()[:400])
    assert found, js
    return found.group(1)


def test_the_vendored_bundle_is_the_plotly_js_of_the_pinned_plotly_package():
    full = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    assert _version(BUNDLE) == _version(full)
    assert BUNDLE.stat().st_size < full.stat().st_size / 3


def test_every_chart_type_the_portal_draws_is_in_the_bundle():
    drawn = set()
    for source in (ROOT / "clusters" / "metrics").glob("*.py"):
        drawn |= set(re.findall(r'"type":\s*"([a-z0-9]+)"', source.read_text()))
    drawn -= {"date", "linear", "log", "category"}  # axis types, not traces
    assert drawn, "no chart types found: the pattern above is out of date"
    assert drawn <= CARTESIAN, drawn - CARTESIAN


@pytest.mark.django_db
def test_plotly_loads_only_on_pages_with_a_chart(client_as, org):
    client = client_as(org.platform_admin)
    assert "plotly-cartesian" in client.get("/dashboard/").content.decode()
    for path in ("/", "/workloads/", "/clusters/"):
        page = client.get(path)
        assert page.status_code == 200, path
        assert "plotly" not in page.content.decode(), path


def test_collected_static_files_are_served_compressed_and_cached(tmp_path):
    storages = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }
    # The project's own folder only: compressing every app's files takes half a minute.
    only_ours = ["django.contrib.staticfiles.finders.FileSystemFinder"]
    with override_settings(
        STATIC_ROOT=tmp_path,
        STORAGES=storages,
        WHITENOISE_USE_FINDERS=False,
        STATICFILES_FINDERS=only_ours,
    ):
        call_command("collectstatic", "--noinput", "--verbosity", "0")
        from django.contrib.staticfiles.storage import staticfiles_storage

        name = staticfiles_storage.stored_name("vendor/plotly/plotly-cartesian-3.0.1.min.js")
        assert re.search(r"\.min\.[0-9a-f]{12}\.js$", name), name
        original = (tmp_path / name).read_bytes()
        assert gzip.decompress((tmp_path / f"{name}.gz").read_bytes()) == original
        assert brotli.decompress((tmp_path / f"{name}.br").read_bytes()) == original
        served = WhiteNoiseMiddleware(lambda request: None)
        factory = RequestFactory()
        for accept, encoding, limit in (("gzip", "gzip", 0.4), ("br, gzip", "br", 0.35)):
            response = served(factory.get(f"/static/{name}", HTTP_ACCEPT_ENCODING=accept))
            assert response.status_code == 200
            assert response["Content-Encoding"] == encoding
            assert int(response["Content-Length"]) < limit * len(original)
            assert "immutable" in response["Cache-Control"]
            assert "max-age=315360000" in response["Cache-Control"]
        plain = served(factory.get(f"/static/{name}"))
        assert "Content-Encoding" not in plain and int(plain["Content-Length"]) == len(original)
