"""SSH public keys as users paste them (`ssh-ed25519 AAAA... comment`): parsed for real with
`cryptography`, never matched by pattern, so that what reaches a pod's authorized_keys is a
key sshd will read. Standard library and cryptography only."""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed25519, rsa

# What a line may hold: the longest real key (RSA 16384) is under 3 kB in base64.
KEY_TEXT_MAX = 4096
COMMENT_MAX = 100
RSA_MIN_BITS = 2048
RSA_MAX_BITS = 16384
# sk-* (security keys) are left out: cryptography cannot load them, so they cannot be checked.
TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
         "ecdsa-sha2-nistp521")  # fmt: skip


class SshKeyInvalid(ValueError):
    """Why a pasted key is refused, in words for the person who pasted it."""


@dataclass(frozen=True, slots=True)
class ParsedKey:
    key_type: str
    body: str  # the base64 blob, as sshd reads it
    comment: str
    bits: int
    fingerprint: str  # SHA256:..., as `ssh-keygen -l` prints it

    @property
    def line(self) -> str:
        """The authorized_keys line: type and body, the comment made safe for one line."""
        return " ".join(part for part in (self.key_type, self.body, self.comment) if part)


def parse_public_key(text: str) -> ParsedKey:
    """The key in one line of OpenSSH public-key format, or SshKeyInvalid saying why not."""
    text = (text or "").strip()
    if not text:
        raise SshKeyInvalid("Paste a public key, e.g. the contents of ~/.ssh/id_ed25519.pub.")
    if len(text) > KEY_TEXT_MAX:
        raise SshKeyInvalid(f"A public key is one line of at most {KEY_TEXT_MAX} characters.")
    if "PRIVATE KEY" in text:
        raise SshKeyInvalid("This is a private key: paste the .pub file, and keep this one safe.")
    if "\n" in text or "\r" in text:
        raise SshKeyInvalid("Paste one key, on one line.")
    key_type, _, rest = text.partition(" ")
    body, _, comment = rest.strip().partition(" ")
    if key_type not in TYPES:
        raise SshKeyInvalid(
            f"Unsupported key type {key_type[:30]!r}; use one of {', '.join(TYPES)}."
        )
    try:
        blob = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise SshKeyInvalid("The key's body is not valid base64.") from None
    try:
        key = serialization.load_ssh_public_key(f"{key_type} {body}".encode())
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise SshKeyInvalid(f"Not a valid {key_type} key: {exc}") from None
    bits = _bits(key)
    if isinstance(key, dsa.DSAPublicKey):
        raise SshKeyInvalid("DSA keys are obsolete; OpenSSH refuses them. Use ssh-ed25519.")
    if isinstance(key, rsa.RSAPublicKey) and not RSA_MIN_BITS <= bits <= RSA_MAX_BITS:
        raise SshKeyInvalid(
            f"An RSA key of {bits} bits is refused: use {RSA_MIN_BITS} to {RSA_MAX_BITS} bits."
        )
    comment = "".join(c for c in comment.strip() if c.isprintable())[:COMMENT_MAX]
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return ParsedKey(key_type, body, comment, bits, f"SHA256:{digest}")


def _bits(key: object) -> int:
    if isinstance(key, ed25519.Ed25519PublicKey):
        return 256
    if isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey | dsa.DSAPublicKey):
        return key.key_size
    return 0
