"""Tests of tenant isolation fail, not skip, where this machine cannot sandbox pods: a
skipped isolation test looks like a passing one. `GPUPOOL_TEST_ALLOW_NO_SANDBOX=1` is the
explicit opt-out (a machine without root or bubblewrap)."""

from __future__ import annotations

import os

import pytest

OPT_OUT = "GPUPOOL_TEST_ALLOW_NO_SANDBOX"


def require_sandbox():
    """The sandbox's probe when pods can be sandboxed here; otherwise the test fails, or
    is skipped under the opt-out, saying why."""
    from clusters.backends import sandbox

    isolation = sandbox.probe()
    if isolation.available:
        return isolation
    message = f"this machine cannot sandbox pods: {isolation.reason}"
    if os.environ.get(OPT_OUT) == "1":
        pytest.skip(f"{message} ({OPT_OUT}=1)")
    pytest.fail(f"{message}; scripts/install-test-deps.sh installs what it needs, or set "
                f"{OPT_OUT}=1 to skip the isolation tests")  # fmt: skip
