"""The project's exceptions share one base class, so callers can catch GPUPool's own."""

from __future__ import annotations


class GPUPoolError(Exception):
    """Base of every GPUPool exception."""


class ValidationFailed(GPUPoolError):
    """A service refused input. `errors` maps a field name (or '__all__') to messages."""

    def __init__(self, errors: dict[str, list[str]] | str):
        if isinstance(errors, str):
            errors = {"__all__": [errors]}
        self.errors = errors
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items()))
