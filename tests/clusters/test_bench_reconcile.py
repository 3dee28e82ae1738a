"""bench_reconcile reconciles admitted pods into the fake API server and reports a rate."""

from __future__ import annotations

import json
from io import StringIO

import pytest
import yaml
from django.core.management import call_command
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from clusters.models import Cluster
from scheduling.models import Workload
from tests.clusters.fake_apiserver import FakeApiServer


@pytest.mark.django_db(transaction=True)
def test_bench_reconcile_creates_every_pod_once_reports_json_and_leaves_no_rows(monkeypatch):
    # The in-suite API server, whose figures it asserts, also in the real-cluster mode.
    monkeypatch.delenv("GPUPOOL_TEST_KUBECONFIG", raising=False)
    out = StringIO()
    call_command("bench_reconcile", "--pods", "40", "--workers", "4", "--json", stdout=out)
    result = json.loads(out.getvalue())
    assert result["created"] == 40 and result["errors"] == 0
    assert result["second_pass_created"] == 0
    assert result["deleted_after"] == 40
    assert result["pods_per_s"] > 0 and result["api_server"] == "fake"
    assert Cluster.objects.count() == 0 and Workload.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_bench_reconcile_on_a_shared_cluster_counts_and_removes_only_its_own_pods(
    tmp_path, monkeypatch
):
    """GPUPOOL_TEST_KUBECONFIG pointed at a cluster another GPUPool uses: its pods (the
    same names the bench would pick, managed-by gpupool) stay, uncounted."""
    with FakeApiServer() as fake:
        for name in ("gpu-a", "gpu-b"):
            fake.add_node(name, gpus=8)
        fake.add_node("down", ready=False)  # not schedulable: the bench puts nothing there
        api = k8s.CoreV1Api(k8s_config.new_client_from_config_dict(fake.kubeconfig()))
        api.create_namespace({"metadata": {"name": "gp-bench"}})
        other = {"app.kubernetes.io/managed-by": "gpupool", "gpupool.io/role": "workload"}
        for index in range(3):
            body = {
                "metadata": {"name": f"gp-{index + 1}-0", "labels": other},
                "spec": {"nodeName": "gpu-a", "containers": [{"name": "main", "image": "x"}]},
            }
            api.create_namespaced_pod("gp-bench", body)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(fake.kubeconfig()))
        monkeypatch.setenv("GPUPOOL_TEST_KUBECONFIG", str(kubeconfig))
        out = StringIO()
        call_command("bench_reconcile", "--pods", "20", "--workers", "4", "--json", stdout=out)
        result = json.loads(out.getvalue())
        assert result["created"] == 20 and result["errors"] == 0
        assert result["deleted_after"] == 20 and result["second_pass_created"] == 0
        assert result["namespace"].startswith("gp-bench-")
        assert sorted((p["metadata"]["namespace"], p["metadata"]["name"]) for p in fake.pods()) == [
            ("gp-bench", "gp-1-0"),
            ("gp-bench", "gp-2-0"),
            ("gp-bench", "gp-3-0"),
        ]
        assert result["namespace"] not in fake.namespaces()
        nodes = {p["spec"].get("nodeName") for _, r, k, p in fake.history if r == "pods"}
        assert "down" not in nodes
