"""The Kubernetes test harness: the in-process fake API server, or a real cluster when
GPUPOOL_TEST_KUBECONFIG names a kubeconfig. Tests that need to steer the cluster
(faults, a kubelet that finishes pods on request, nodes that vanish) ask for `fake` and
are skipped against a real cluster; tests that need pods to run and stop ask for a kubelet
(`require_kubelet`) and are skipped against a real cluster unless GPUPOOL_TEST_KUBELET=1
says its nodes have one (a bare API server, kind's or a control plane alone, has none);
the rest run unchanged against both. How many run and skip: run the mode with `-rs`, the
skips say why (clusters/README.md).

Against a real cluster every run is a fresh one: the org's projects get namespaces of
their own (`gp-ml-vision-<run>`), tests name their namespaces with `kube.namespace()`, and
every namespace a test made, or that carries the test database's installation, is
deleted after it. Tests compare the labels they set, never whole label maps (a real API
server adds its own)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import yaml
from cryptography.fernet import Fernet
from kubernetes import config as k8s_config
from kubernetes.client import CoreV1Api

from clusters.backends.kubernetes import KubernetesBackend
from clusters.backends.kubernetes.watch import watches_stop
from clusters.crypto import kubeconfig_encrypt
from clusters.inventory import inventory_sync
from clusters.models import Backend, Cluster, Node, installation_uid
from tests.clusters.fake_apiserver import FakeApiServer

INSTALLATION = "gpupool.io/installation"

REAL = os.environ.get("GPUPOOL_TEST_KUBECONFIG")
# The real cluster's nodes run kubelets that start and stop pods (not a bare API server).
KUBELET = not REAL or os.environ.get("GPUPOOL_TEST_KUBELET") == "1"
# How long a test waits for a real kubelet (pods stop within their 1 s grace): well inside
# the 60 s timeout of the modules that use it, with the passes before the wait.
KUBELET_WAIT_S = 30


def k8s_name(cluster: Cluster, pod: str) -> str:
    """The Kubernetes name of the pod GPUPool calls `pod` (gp-<workload>-<index>) in the
    cluster: it carries the installation's and the Cluster record's identities."""
    return KubernetesBackend(cluster).owner.object_name(pod)


class Harness:
    def __init__(self, kubeconfig: dict, fake: FakeApiServer | None):
        self.kubeconfig = kubeconfig
        self.fake = fake
        self.run = uuid.uuid4().hex[:6]
        self.made: list[str] = []

    def namespace(self, name: str) -> str:
        """A namespace name of this run's own (unique against a real cluster), deleted
        after the test."""
        unique = name if self.fake else f"{name}-{self.run}"
        self.made.append(unique)
        return unique

    def clean_up(self) -> None:
        """Delete the namespaces this run made or that carry its installation's identity:
        their pods and services go with them."""
        api = CoreV1Api(k8s_config.new_client_from_config_dict(self.kubeconfig))
        ours = installation_uid()
        for item in api.list_namespace().items:
            annotations = item.metadata.annotations or {}
            if item.metadata.name in self.made or annotations.get(INSTALLATION) == ours:
                api.delete_namespace(item.metadata.name)

    def require_fake(self) -> FakeApiServer:
        if self.fake is None:
            pytest.skip("steers the cluster: runs against the fake API server only")
        return self.fake

    def require_kubelet(self, why: str) -> None:
        """Skip the rest against a real cluster without kubelets (GPUPOOL_TEST_KUBELET)."""
        if not KUBELET:
            pytest.skip(f"needs a kubelet ({why}): set GPUPOOL_TEST_KUBELET=1 if it has one")

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
def kube(db, settings, request):
    settings.GPUPOOL_KUBECONFIG_KEY = Fernet.generate_key().decode()
    if REAL:
        harness = Harness(yaml.safe_load(Path(REAL).read_text()), None)
        if "org" in request.fixturenames:
            org = request.getfixturevalue("org")
            for project in (org.project_a, org.project_a2, org.project_b):
                project.namespace = harness.namespace(project.namespace)
                project.save(update_fields=["namespace"])
        yield harness
        watches_stop()
        harness.clean_up()
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
        watches_stop()  # a test's watches (the default) end before their server does
