"""The real-cluster mode of the Kubernetes tests (GPUPOOL_TEST_KUBECONFIG, tests/clusters/
kube.py) against an API server whose nodes have no kubelet, as a bare control plane: the
in-suite server with its kubelet off (pods stay Pending, graceful deletes never end). What
needs a kubelet skips saying so, the bench asserts the in-suite server's figures whatever
the mode, and no test waits past its own timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.clusters import test_kubernetes_backend
from tests.clusters.fake_apiserver import FakeApiServer
from tests.clusters.kube import KUBELET_WAIT_S

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]
NEEDS_A_KUBELET = "test_kubernetes_backend.py::test_reconcile_creates_pinned_labelled_pods_once_and_deletes_them_on_stop"  # noqa: E501 - a test id
BENCH = "test_bench_reconcile.py::test_bench_reconcile_creates_every_pod_once_reports_json_and_leaves_no_rows"  # noqa: E501 - a test id


def test_the_real_cluster_mode_skips_what_needs_a_kubelet_and_benches_the_in_suite_server(
    tmp_path,
):
    with FakeApiServer(auto_run=False, deferred_delete=True) as server:
        for name in ("gpu-a", "gpu-b"):
            server.add_node(name, gpus=8, labels={"gpupool.io/node-pool": "a100"})
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(server.kubeconfig()))
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        env.pop("GPUPOOL_TEST_KUBELET", None)
        env.update(GPUPOOL_TEST_KUBECONFIG=str(kubeconfig), GPUPOOL_TEST_EMBEDDED="1")
        tests = [f"tests/clusters/{test}" for test in (NEEDS_A_KUBELET, BENCH)]
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", *tests]
        run = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=150, check=False
        )
    assert "1 passed, 1 skipped" in run.stdout, run.stdout[-3000:]
    assert "needs a kubelet (its pods stop only when a kubelet confirms)" in run.stdout


def test_a_wait_for_a_real_kubelet_fits_inside_the_tests_timeout():
    [timeout] = [m.args[0] for m in [test_kubernetes_backend.pytestmark] if m.name == "timeout"]
    assert timeout > KUBELET_WAIT_S + 15  # the passes before the wait take seconds too
