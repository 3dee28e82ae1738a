"""Declared ports and SSH on a submission: cleaned once (scheduling.specs) whatever the
entry, bounded, refused per field; shown as links on the page, in the API and the CLI."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from rest_framework.test import APIClient

from portal.models import SshKey
from scheduling.models import Workload
from scheduling.specs import clean_spec
from tests.scheduling.test_cli import gp, logged_in  # noqa: F401 - the fixtures

BASE = {"image": "img", "command": ["python", "serve.py"]}


def cleaned(**raw):
    out, errors = clean_spec("training", "job", {**BASE, **raw})
    return out["spec"], errors


def test_ports_carry_a_protocol_http_by_default_and_ssh_adds_its_tcp_port(db):
    spec, errors = cleaned(ports=[6006, {"name": "debug", "port": "5678", "protocol": "TCP"}])
    assert errors == {}
    assert spec["ports"] == [
        {"name": "http", "port": 6006, "protocol": "http"},
        {"name": "debug", "port": 5678, "protocol": "tcp"},
    ]
    spec, errors = cleaned(ssh="true")
    assert errors == {} and spec["ssh"] is True
    assert spec["ports"] == [{"name": "ssh", "port": 2222, "protocol": "tcp"}]
    spec, _ = cleaned(ssh=False)
    assert "ssh" not in spec and "ports" not in spec


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"ports": [{"name": "web", "port": 80, "protocol": "udp"}]},
            "the protocol is http or tcp",
        ),
        ({"ports": [{"name": "web", "port": 80}, {"name": "web", "port": 81}]}, "only once"),
        ({"ports": [{"name": "a", "port": 80}, {"name": "b", "port": 80}]}, "only once"),
        ({"ports": [{"name": "Web UI", "port": 80}]}, "Not a port name"),
        ({"ports": [{"name": "web", "port": 70000}]}, "Not a port number"),
        ({"ports": [{"port": p} for p in range(1000, 1102)]}, "Expose at most 100 ports"),
        ({"ports": [{"name": "ssh", "port": 22, "protocol": "http"}], "ssh": True}, "make it tcp"),
        ({"ports": [{"name": "other", "port": 2222}], "ssh": True}, "the SSH server's"),
        ({"ssh": "maybe"}, "Enter true or false."),
    ],
)
def test_bad_ports_are_refused_on_the_ports_field(db, raw, message):
    _, errors = cleaned(**raw)
    field = "ssh" if raw.get("ssh") == "maybe" else "ports"
    assert any(message in m for m in errors[field]), errors


def test_the_api_shows_a_link_per_http_port_and_how_to_ssh(org, cluster):
    api = APIClient()
    api.force_authenticate(org.researcher)
    body = {"project": "ml-vision", "kind": "training", "name": "board", "image": "img",
            "command": ["x"], "ssh": True,
            "ports": [{"name": "tb", "port": 6006}, {"name": "dbg", "port": 5678,
                                                     "protocol": "tcp"}]}  # fmt: skip
    created = api.post("/api/v1/workloads/", body, format="json")
    assert created.status_code == 201, created.json()
    wid = created.json()["id"]
    assert created.json()["links"] == {
        "ports": [
            {"name": "tb", "port": 6006, "protocol": "http", "url": f"/workloads/{wid}/ports/tb/"},
            {"name": "dbg", "port": 5678, "protocol": "tcp", "url": ""},
            {"name": "ssh", "port": 2222, "protocol": "tcp", "url": ""},
        ],
        "ssh": {
            "user": "gpupool",
            "path": f"/workloads/{wid}/ssh",
            "command": f"gpupool ssh {wid}",
        },
    }
    body.update(name="bad", ports=[{"name": "tb", "port": 6006, "protocol": "quic"}])
    refused = api.post("/api/v1/workloads/", body, format="json")
    assert refused.status_code == 400 and "ports" in refused.json()


def test_the_workload_page_links_http_ports_and_says_how_to_ssh(client, org, cluster):
    client.force_login(org.researcher)
    form = client.get("/workloads/new/training/").content.decode()
    assert 'id="section-ports-and-ssh"' in form and 'name="ssh"' in form
    response = client.post(
        "/workloads/new/training/",
        {"project": org.project_a.pk, "name": "board", "image": "img", "command": "python x.py",
         "gpu_request": "whole", "gpus": "0", "cpu": "1", "memory_mib": "1024",
         "ports": "tb:6006, dbg:5678/tcp", "ssh": "on"},
    )  # fmt: skip
    assert response.status_code == 302, response.context["form"].errors
    workload = Workload.objects.get(name="board")
    page = client.get(f"/workloads/{workload.pk}/").content.decode()
    assert f'href="/workloads/{workload.pk}/ports/tb/"' in page
    assert "inside the cluster only" in page  # the TCP port has no link
    assert f"gpupool ssh {workload.pk}" in page
    clone = client.get(f"/workloads/{workload.pk}/clone/")
    assert clone.context["form"].initial["ports"] == "tb:6006, dbg:5678/tcp, ssh:2222/tcp"
    assert clone.context["form"].initial["ssh"] is True


def test_the_cli_adds_a_key_submits_with_ssh_and_describes_the_links(
    logged_in,  # noqa: F811
    org,
    cluster,
    tmp_path,
):
    run = logged_in
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    line = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    (tmp_path / "id.pub").write_bytes(line + b" rita@laptop\n")
    assert "Added SSH key rita@laptop (SHA256:" in run("ssh-key", "add", str(tmp_path / "id.pub"))
    (tmp_path / "bad.pub").write_text("ssh-ed25519 QUJD\n")
    out = run("ssh-key", "add", str(tmp_path / "bad.pub"), ok=False)
    assert "public_key: Not a valid ssh-ed25519 key" in out
    assert SshKey.objects.filter(user=org.researcher).count() == 1
    run("project", "set", "ml-vision")
    run("submit", "training", "build", "--image", "img", "--ssh", "--", "sleep", "1d")
    workload = Workload.objects.get(name="build")
    assert workload.spec["ssh"] is True
    out = run("describe", str(workload.pk))
    assert f"SSH:            gpupool ssh {workload.pk}  (user gpupool)" in out
    assert "ssh   2222  tcp" in out
    config = run("ssh-config", str(workload.pk))
    assert config.startswith(f"Host gpupool-{workload.pk}\n    User gpupool\n    ProxyCommand ")
    assert f"scheduling.cli ssh-proxy {workload.pk}" in config
    assert "StrictHostKeyChecking accept-new" in config
    # A workload started without SSH: the CLI says how to get it instead of running ssh.
    run("submit", "training", "plain", "--image", "img", "--", "x")
    plain = Workload.objects.get(name="plain")
    assert "was not started with SSH: submit it with --ssh" in run("ssh", str(plain.pk), ok=False)
