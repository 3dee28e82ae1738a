"""A user's SSH public keys: added (parsed and checked) and removed by their owner only."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from portal.audit import audit_log
from portal.errors import ValidationFailed
from portal.models import SshKey, User
from portal.services.common import create_audited, require
from portal.ssh_keys import SshKeyInvalid, parse_public_key

SSH_KEYS_PER_USER = 20
NAME_MAX = 100


def _public(key: SshKey) -> dict[str, Any]:
    return {"name": key.name, "key_type": key.key_type, "bits": key.bits,
            "fingerprint": key.fingerprint}  # fmt: skip


def ssh_key_add(*, actor: Any, user: User, name: str, public_key: str) -> SshKey:
    """Register `public_key` for `user` (who must be the actor): refused with the reason
    when it does not parse, is too weak, or is already there."""
    require(actor.pk == user.pk, "Only its owner adds an SSH key to a profile.")
    errors: dict[str, list[str]] = {}
    name = (name or "").strip()
    try:
        parsed = parse_public_key(public_key)
    except SshKeyInvalid as exc:
        errors["public_key"] = [str(exc)]
        parsed = None
    if parsed is not None and not name:
        name = (parsed.comment or parsed.fingerprint)[:NAME_MAX]
    if not name or len(name) > NAME_MAX or not name.isprintable():
        errors["name"] = [f"Give the key a name of 1 to {NAME_MAX} printable characters."]
    keys = SshKey.objects.filter(user=user)
    if keys.filter(name=name).exists():
        errors["name"] = ["You already have a key of this name."]
    if parsed is not None and keys.filter(fingerprint=parsed.fingerprint).exists():
        errors["public_key"] = ["This key is already on your profile."]
    if keys.count() >= SSH_KEYS_PER_USER:
        errors["public_key"] = [f"At most {SSH_KEYS_PER_USER} keys: remove one first."]
    if errors or parsed is None:
        raise ValidationFailed(errors)
    values = {
        "user": user,
        "name": name,
        "key_type": parsed.key_type,
        "body": parsed.body,
        "comment": parsed.comment,
        "bits": parsed.bits,
        "fingerprint": parsed.fingerprint,
    }
    with transaction.atomic():
        key = create_audited(SshKey, values, actor=actor, action="ssh_key.add")
    return key


def ssh_key_remove(*, actor: Any, key: SshKey) -> None:
    require(actor.pk == key.user_id, "Only its owner removes an SSH key.")
    with transaction.atomic():
        audit_log(actor=actor, action="ssh_key.remove", obj=key, before=_public(key))
        key.delete()
