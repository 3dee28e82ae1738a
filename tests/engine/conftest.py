"""Engine tests: no database and no Django settings, so `-p no:django` runs them alone."""

from __future__ import annotations
