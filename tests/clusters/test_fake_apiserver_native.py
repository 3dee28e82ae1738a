"""The fake API server does what native scheduling needs as a real one (Kubernetes 1.30+)
does: field selectors and ownerReferences. Each test talks
to it over HTTP with the official client and names the real code it pins (kubernetes/
kubernetes unless said otherwise)."""

from __future__ import annotations

import json
import threading

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from tests.clusters.fake_apiserver import FakeApiServer

pytestmark = pytest.mark.timeout(30)
NS = "team-a"


def serve(**options) -> FakeApiServer:
    server = FakeApiServer(**options)
    server.add_node("gpu-a", gpus=2)
    return server


@pytest.fixture
def fake():
    with serve() as server:
        yield server


@pytest.fixture
def api_client(fake):
    client = k8s_config.new_client_from_config_dict(fake.kubeconfig())
    k8s.CoreV1Api(client).create_namespace({"metadata": {"name": NS}})
    return client


@pytest.fixture
def api(api_client):
    return k8s.CoreV1Api(api_client)


def refusal(call, *args, **kwargs) -> tuple[int, str]:
    with pytest.raises(ApiException) as err:
        call(*args, **kwargs)
    return err.value.status, json.loads(err.value.body)["message"]


def pod(name: str, *, labels: dict | None = None, **spec) -> dict:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "schedulerName": "gpupool",
            "containers": [{"name": "main", "image": "x"}],
            **spec,
        },
    }


def binding(name: str, node: str = "gpu-a", annotations: dict | None = None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "annotations": annotations or {}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def bind(api, name: str, body: dict | None = None, node: str = "gpu-a"):
    # The client cannot read the Status a binding answers as a V1Binding: read it raw.
    return api.create_namespaced_pod_binding(
        name, NS, body or binding(name, node), _preload_content=False
    )


# --- field selectors on pods (pkg/registry/core/pod/strategy.go ToSelectableFields) ----------
def test_pods_are_listed_by_node_scheduler_and_phase(api):
    api.create_namespaced_pod(NS, pod("unbound"))
    api.create_namespaced_pod(NS, pod("bound", nodeName="gpu-a"))
    other = pod("other")
    other["spec"].pop("schedulerName")  # the default scheduler's
    api.create_namespaced_pod(NS, other)

    def names(selector: str) -> set[str]:
        return {p.metadata.name for p in api.list_namespaced_pod(NS, field_selector=selector).items}

    assert names("spec.nodeName=") == {"unbound", "other"}
    assert names("spec.schedulerName=gpupool,spec.nodeName=") == {"unbound"}
    assert names("spec.schedulerName==default-scheduler") == {"other"}
    assert names("status.phase!=Running") == {"unbound", "other"}
    assert names("metadata.name=bound,spec.nodeName=gpu-a") == {"bound"}
    everywhere = api.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-a").items
    assert [p.metadata.name for p in everywhere] == ["bound"]


def test_a_field_a_pod_cannot_be_selected_by_is_400(api):
    status, message = refusal(api.list_namespaced_pod, NS, field_selector="spec.priority=1")
    assert (status, message) == (400, "field label not supported: spec.priority")
    status, _ = refusal(api.list_namespaced_pod, NS, field_selector="spec.nodeName")
    assert status == 400


def test_a_watch_of_unbound_pods_sees_a_bound_one_leave(api):
    api.create_namespaced_pod(NS, pod("p"))
    since = api.list_namespaced_pod(NS).metadata.resource_version
    seen: list[tuple[str, str]] = []

    def watch() -> None:
        stream = k8s_watch.Watch().stream(
            api.list_namespaced_pod,
            NS,
            field_selector="spec.nodeName=",
            resource_version=since,
            timeout_seconds=2,
        )
        seen.extend((e["type"], e["object"].metadata.name) for e in stream)

    watcher = threading.Thread(target=watch)
    watcher.start()
    api.create_namespaced_pod(NS, pod("q"))
    bind(api, "p")
    watcher.join()
    assert seen == [("ADDED", "q"), ("DELETED", "p")]


# --- ownerReferences: apimachinery's ValidateOwnerReferences --------------------------------
def owner(name: str, **fields) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": f"uid-{name}", **fields}


def test_an_owner_reference_names_its_owner_fully(api):
    for field in ("apiVersion", "kind", "name", "uid"):
        body = pod("p")
        reference = owner("j")
        reference[field] = ""
        body["metadata"]["ownerReferences"] = [reference]
        status, message = refusal(api.create_namespaced_pod, NS, body)
        assert status == 422
        assert message.startswith(f'metadata.ownerReferences.{field}: Invalid value: ""')


def test_a_pod_has_at_most_one_controller(api):
    body = pod("p")
    body["metadata"]["ownerReferences"] = [owner("a", controller=True), owner("b", controller=True)]
    status, message = refusal(api.create_namespaced_pod, NS, body)
    assert status == 422
    assert message.endswith('Found "true" in references for Job/a and Job/b')
    body["metadata"]["ownerReferences"] = [owner("a", controller=True), owner("b")]
    api.create_namespaced_pod(NS, body)
