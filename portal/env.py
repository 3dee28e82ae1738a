"""Typed readers for settings that come from the environment.

A bad value stops start-up with a message naming the variable, rather than
failing later somewhere far from the cause.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _raw(name: str) -> str | None:
    return os.environ.get(name)


def env_str(name: str, default: str = "") -> str:
    value = _raw(name)
    return default if value is None else value


def env_bool(name: str, default: bool = False) -> bool:
    value = _raw(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false, yes/no), got {value!r}")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    value = _raw(name)
    if value is None or value.strip() == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {number}")
    return number


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    value = _raw(name)
    if value is None or value.strip() == "":
        return default
    try:
        number = float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {number}")
    return number


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """One of `choices`, compared without regard to case; returned as the choice is written."""
    value = _raw(name)
    if value is None or value.strip() == "":
        return default
    for choice in choices:
        if value.strip().lower() == choice.lower():
            return choice
    raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}, got {value!r}")


def env_url(name: str, schemes: tuple[str, ...]) -> str:
    """A URL with one of `schemes` and something after it, or '' when unset."""
    value = env_str(name).strip()
    scheme, separator, rest = value.partition("://")
    if value and (not separator or scheme.lower() not in schemes or not rest):
        expected = " or ".join(f"{s}://..." for s in schemes)
        raise ImproperlyConfigured(f"{name} must be a URL like {expected}, got {value!r}")
    return value


def env_list(name: str, default: list[str] | None = None) -> list[str]:
    value = _raw(name)
    if value is None:
        return list(default or [])
    return [item.strip() for item in value.split(",") if item.strip()]


def env_secret(name: str, default: str = "") -> str:
    """Read NAME, or the contents of the file named by NAME_FILE (Docker/Kubernetes secrets)."""
    file_name = _raw(f"{name}_FILE")
    if file_name:
        try:
            return Path(file_name).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={file_name!r} cannot be read: {exc}") from None
    return env_str(name, default)
