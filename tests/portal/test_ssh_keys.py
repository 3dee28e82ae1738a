"""SSH public keys on a user's profile: parsed for real, weak or broken keys refused with the
reason, each user's keys their own (page, API, audit)."""

from __future__ import annotations

import base64
import struct

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed25519, rsa
from rest_framework.test import APIClient

from portal.models import AuditLog, SshKey
from portal.selectors import ssh_authorized_keys
from portal.ssh_keys import SshKeyInvalid, parse_public_key
from tests import factories as f

OPENSSH = (serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)


def public_line(key, comment: str = "rita@laptop") -> str:
    return key.public_key().public_bytes(*OPENSSH).decode() + (f" {comment}" if comment else "")


@pytest.fixture(scope="module")
def ed_key() -> str:
    return public_line(ed25519.Ed25519PrivateKey.generate())


def test_ed25519_rsa_and_ecdsa_keys_parse_with_their_size_and_ssh_keygens_fingerprint(ed_key):
    parsed = parse_public_key(ed_key)
    assert (parsed.key_type, parsed.bits, parsed.comment) == ("ssh-ed25519", 256, "rita@laptop")
    blob = base64.b64decode(ed_key.split()[1])
    # ssh-keygen -l: SHA256 of the blob, base64 without padding.
    assert parsed.fingerprint.startswith("SHA256:") and not parsed.fingerprint.endswith("=")
    assert len(blob) == 51 and parsed.line == ed_key
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert parse_public_key(public_line(rsa_key)).bits == 2048
    ec_key = ec.generate_private_key(ec.SECP384R1())
    assert parse_public_key(public_line(ec_key, "")).key_type == "ecdsa-sha2-nistp384"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "Paste a public key"),
        ("ssh-ed25519", "Not a valid ssh-ed25519 key"),
        ("ssh-ed25519 not*base64!", "not valid base64"),
        ("ssh-ed25519 QUJDRA==", "Not a valid ssh-ed25519 key"),
        ("ssh-foo QUJDRA== x", "Unsupported key type 'ssh-foo'"),
        ("ssh-ed25519 AAAA\nssh-ed25519 AAAA", "one line"),
        ("-----BEGIN OPENSSH PRIVATE KEY-----", "This is a private key"),
        ("ssh-ed25519 " + "A" * 5000, "at most 4096 characters"),
    ],
)
def test_broken_keys_are_refused_with_the_reason(text, reason):
    with pytest.raises(SshKeyInvalid, match=reason):
        parse_public_key(text)


def test_a_key_whose_body_is_of_another_type_is_refused(ed_key):
    rsa_line = public_line(rsa.generate_private_key(public_exponent=65537, key_size=2048))
    with pytest.raises(SshKeyInvalid, match="Not a valid ssh-ed25519 key"):
        parse_public_key("ssh-ed25519 " + rsa_line.split()[1])


def test_weak_rsa_and_obsolete_dsa_keys_are_refused():
    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    with pytest.raises(SshKeyInvalid, match="RSA key of 1024 bits is refused"):
        parse_public_key(public_line(weak))
    # cryptography writes DSA keys as ssh-dss, which is not among the types taken.
    numbers = dsa.generate_private_key(key_size=1024).public_key().public_numbers()
    parts = [b"ssh-dss", numbers.parameter_numbers.p, numbers.parameter_numbers.q,
             numbers.parameter_numbers.g, numbers.y]  # fmt: skip
    blob = b"".join(_ssh_string(p) for p in parts)
    with pytest.raises(SshKeyInvalid, match="Unsupported key type 'ssh-dss'"):
        parse_public_key("ssh-dss " + base64.b64encode(blob).decode())


def _ssh_string(value: bytes | int) -> bytes:
    if isinstance(value, int):
        value = value.to_bytes((value.bit_length() + 8) // 8, "big")
    return struct.pack(">I", len(value)) + value


def test_the_profile_page_adds_and_removes_keys_and_shows_refusals_on_the_field(
    client, org, ed_key
):
    client.force_login(org.researcher)
    response = client.post("/accounts/profile/", {"name": "", "public_key": "ssh-ed25519 QUJD"})
    assert response.status_code == 200
    assert "Not a valid ssh-ed25519 key" in str(response.context["form"].errors["public_key"])
    response = client.post("/accounts/profile/", {"name": "", "public_key": ed_key}, follow=True)
    key = SshKey.objects.get(user=org.researcher)
    assert key.name == "rita@laptop" and key.fingerprint in response.content.decode()
    again = client.post("/accounts/profile/", {"name": "other", "public_key": ed_key})
    assert "already on your profile" in str(again.context["form"].errors["public_key"])
    # Another user cannot remove it: it is not among theirs.
    client.force_login(org.outsider)
    assert client.post(f"/accounts/profile/ssh-keys/{key.pk}/delete/").status_code == 404
    client.force_login(org.researcher)
    client.post(f"/accounts/profile/ssh-keys/{key.pk}/delete/")
    assert not SshKey.objects.exists()
    actions = set(AuditLog.objects.values_list("action", flat=True))
    assert {"ssh_key.add", "ssh_key.remove"} <= actions


def test_the_api_lists_only_the_callers_keys_and_refuses_bad_ones_naming_the_field(org, ed_key):
    api = APIClient()
    api.force_authenticate(org.researcher)
    bad = api.post("/api/v1/users/me/ssh-keys/", {"public_key": "ssh-rsa AAAA"}, format="json")
    assert bad.status_code == 400 and "public_key" in bad.json()
    created = api.post(
        "/api/v1/users/me/ssh-keys/", {"name": "laptop", "public_key": ed_key}, format="json"
    )
    assert created.status_code == 201
    assert created.json()["key_type"] == "ssh-ed25519" and "public_key" not in created.json()
    other = APIClient()
    other.force_authenticate(org.outsider)
    assert other.get("/api/v1/users/me/ssh-keys/").json() == []
    key_id = created.json()["id"]
    assert other.delete(f"/api/v1/users/me/ssh-keys/{key_id}/").status_code == 404
    assert APIClient().get("/api/v1/users/me/ssh-keys/").status_code in (401, 403)
    assert api.delete(f"/api/v1/users/me/ssh-keys/{key_id}/").status_code == 204


def test_authorized_keys_are_the_owners_plus_the_project_researchers_when_shared(org, ed_key):
    colleague = f.make_user("carl")
    f.make_membership(colleague, role=f.Role.RESEARCHER, project=org.project_a)
    viewer = f.make_user("vera")
    f.make_membership(viewer, role=f.Role.VIEWER, project=org.project_a)
    lines = {}
    for user in (org.researcher, colleague, viewer, org.outsider):
        line = public_line(ed25519.Ed25519PrivateKey.generate(), user.username)
        SshKey.objects.create(user=user, name="k", bits=256, fingerprint=user.username,
                              key_type="ssh-ed25519", body=line.split()[1],
                              comment=user.username)  # fmt: skip
        lines[user.username] = line
    ids = {"owner_id": org.researcher.pk, "project_id": org.project_a.pk}
    assert ssh_authorized_keys(**ids, shared=False) == [lines[org.researcher.username]]
    shared = ssh_authorized_keys(**ids, shared=True)
    assert sorted(shared) == sorted([lines[org.researcher.username], lines["carl"]])
    colleague.is_active = False
    colleague.save()
    assert ssh_authorized_keys(**ids, shared=True) == [lines[org.researcher.username]]
