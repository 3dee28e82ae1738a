"""Kubeconfigs are stored encrypted with Fernet under settings.GPUPOOL_KUBECONFIG_KEY."""

from __future__ import annotations

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings

from portal.errors import GPUPoolError


class KubeconfigKeyMissing(GPUPoolError):
    pass


def _fernet() -> Fernet:
    key = getattr(settings, "GPUPOOL_KUBECONFIG_KEY", "")
    if not key:
        raise KubeconfigKeyMissing(
            "GPUPOOL_KUBECONFIG_KEY is not set, so kubeconfigs cannot be stored encrypted. "
            "Generate one with: python -c 'from cryptography.fernet import Fernet; "
            "print(Fernet.generate_key().decode())'"
        )
    try:
        return Fernet(key.encode() if isinstance(key, str) else key)
    except ValueError as exc:
        raise KubeconfigKeyMissing(f"GPUPOOL_KUBECONFIG_KEY is not a Fernet key: {exc}") from None


def kubeconfig_encrypt(text: str) -> str:
    return _fernet().encrypt(text.encode()).decode()


def kubeconfig_decrypt(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        raise KubeconfigKeyMissing(
            "The stored kubeconfig cannot be decrypted with the current GPUPOOL_KUBECONFIG_KEY."
        ) from None
