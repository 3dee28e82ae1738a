"""The backend keeps its connections to the API server: an answer it does not need the body
of (a Binding, an Event, a patch) is still read to the end, so that its connection goes
back to the pool instead of one new connection (a TLS handshake, on a real cluster) per
request."""

from __future__ import annotations

import pytest

from clusters.backends.kubernetes import KubernetesBackend
from clusters.models import Backend, Cluster
from tests.clusters.fake_apiserver import FakeApiServer


@pytest.mark.django_db
def test_requests_whose_answer_is_not_read_reuse_one_connection():
    with FakeApiServer() as fake:
        cluster = Cluster.objects.create(name="kube", backend=Backend.KUBERNETES, config={})
        backend = KubernetesBackend(cluster, kubeconfig=fake.kubeconfig())
        for index in range(5):
            body = {"metadata": {"name": f"team-{index}"}}
            backend.call(backend.api.create_namespace, body, _preload_content=False)
        pools = backend.api.api_client.rest_client.pool_manager.pools
        (key,) = pools.keys()
        assert pools[key].num_connections == 1
        assert backend.requests == 5 and backend.bytes_read > 0
        assert {f"team-{i}" for i in range(5)} <= set(fake.namespaces())
