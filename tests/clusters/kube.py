"""The Kubernetes test harness: the in-process fake API server, or a real cluster when
GPUPOOL_TEST_KUBECONFIG names a kubeconfig. Tests that need to steer the cluster
(faults, a kubelet that finishes pods on request, nodes that vanish) ask for `fake` and
are skipped against a real cluster; the rest run unchanged against both."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from cryptography.fernet import Fernet

from clusters.crypto import kubeconfig_encrypt
from clusters.inventory import inventory_sync
from clusters.models import Backend, Cluster, Node
from tests.clusters.fake_apiserver import FakeApiServer

REAL = os.environ.get("GPUPOOL_TEST_KUBECONFIG")


class Harness:
    def __init__(self, kubeconfig: dict, fake: FakeApiServer | None):
        self.kubeconfig = kubeconfig
        self.fake = fake

    def require_fake(self) -> FakeApiServer:
        if self.fake is None:
            pytest.skip("steers the cluster: runs against the fake API server only")
        return self.fake

    def cluster(self, name: str = "kube", **config) -> Cluster:
        defaults = {"retries": 3, "backoff_s": 0.01, "timeout_s": 0.5, "connect_timeout_s": 0.5}
        # These tests change the cluster and expect the very next pass to see it: they
        # observe by listing. The watch (the default) is tested in test_kubernetes_watch.py,
        # where a test waits for the watch to deliver what it changed.
        defaults["watch"] = False
        if self.fake is None:
            defaults.update(timeout_s=10, connect_timeout_s=5, grace_period_s=1)
        cluster = Cluster.objects.create(
            name=name,
            backend=Backend.KUBERNETES,
            kubeconfig_encrypted=kubeconfig_encrypt(yaml.safe_dump(self.kubeconfig)),
            topology_labels=["gpupool.io/rack"],
            config={**defaults, **config},
        )
        return cluster

    def nodes(self, cluster: Cluster) -> list[Node]:
        inventory_sync(cluster)
        return list(Node.objects.filter(cluster=cluster, schedulable=True))


@pytest.fixture
def kube(db, settings):
    settings.GPUPOOL_KUBECONFIG_KEY = Fernet.generate_key().decode()
    if REAL:
        yield Harness(yaml.safe_load(Path(REAL).read_text()), None)
        return
    with FakeApiServer() as fake:
        fake.add_node(
            "gpu-a", gpus=8, labels={"gpupool.io/node-pool": "a100", "gpupool.io/rack": "r1"}
        )
        fake.add_node(
            "gpu-b", gpus=8, labels={"gpupool.io/node-pool": "a100", "gpupool.io/rack": "r2"}
        )
        fake.timeout_s = 0.8
        yield Harness(fake.kubeconfig(), fake)
