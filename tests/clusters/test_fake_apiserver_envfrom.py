"""The fake API server and its kubelet treat a container's `envFrom` and ConfigMaps as real
ones do (what GPU fractions of native pods rely on, clusters/native_sharing.py): the API
server takes a pod whose envFrom names a ConfigMap that does not exist, and checks only the
reference's shape (ValidateEnvFrom); the kubelet does not make a container whose ConfigMap
is missing (CreateContainerConfigError) and starts it once it is there; a ConfigMap's name
is a DNS subdomain and its keys `[-._a-zA-Z0-9]+`."""

from __future__ import annotations

import pytest

from tests.clusters.test_fake_apiserver_strict import api, fake, refusal  # noqa: F401

pytestmark = pytest.mark.timeout(30)


def env_pod(name: str, *sources: dict, node: str = "gpu-a") -> dict:
    container = {"name": "main", "image": "x", "envFrom": list(sources)}
    spec = {"containers": [container], **({"nodeName": node} if node else {})}
    return {"metadata": {"name": name}, "spec": spec}


def waiting(pod) -> dict:
    return pod.status.container_statuses[0].state.waiting


def test_a_pod_naming_a_missing_config_map_is_taken_but_its_container_is_not_made(api):  # noqa: F811
    api.create_namespaced_pod("default", env_pod("early", {"configMapRef": {"name": "later"}}))
    pod = api.read_namespaced_pod("early", "default")
    assert pod.status.phase == "Pending"
    assert (waiting(pod).reason, waiting(pod).message) == (
        "CreateContainerConfigError",
        'configmap "later" not found',
    )
    api.create_namespaced_config_map("default", {"metadata": {"name": "later"}, "data": {}})
    assert api.read_namespaced_pod("early", "default").status.phase == "Running"  # retried
    optional = {"configMapRef": {"name": "never", "optional": True}}
    api.create_namespaced_pod("default", env_pod("relaxed", optional))
    assert api.read_namespaced_pod("relaxed", "default").status.phase == "Running"
    api.create_namespaced_config_map("default", {"metadata": {"name": "there"}, "data": {}})
    api.create_namespaced_pod("default", env_pod("ready", {"configMapRef": {"name": "there"}}))
    assert api.read_namespaced_pod("ready", "default").status.phase == "Running"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({}, "must specify one of: `configMapRef` or `secretRef`"),
        (
            {"configMapRef": {"name": "a"}, "secretRef": {"name": "b"}},
            "may not have more than one field specified at a time",
        ),
        ({"configMapRef": {}}, "envFrom[0].configMapRef.name: Required value"),
        (
            {"configMapRef": {"name": "Bad_Name"}},
            'configMapRef.name: Invalid value: "Bad_Name"',
        ),
        ({"configMapRef": {"name": "a"}, "prefix": "A=B"}, 'prefix: Invalid value: "A=B"'),
    ],
)
def test_an_env_from_of_the_wrong_shape_is_refused(api, source, message):  # noqa: F811
    status, said = refusal(api.create_namespaced_pod, "default", env_pod("bad", source))
    assert status == 422 and message in said, said


def test_a_config_map_needs_a_dns_name_and_env_like_keys(api):  # noqa: F811
    status, said = refusal(
        api.create_namespaced_config_map, "default", {"metadata": {"name": "Upper"}, "data": {}}
    )
    assert status == 422 and 'metadata.name: Invalid value: "Upper"' in said
    body = {"metadata": {"name": "keys"}, "data": {"NO SPACES": "x"}}
    status, said = refusal(api.create_namespaced_config_map, "default", body)
    assert status == 422 and 'data[NO SPACES]: Invalid value: "NO SPACES"' in said
    big = {"metadata": {"name": "big"}, "data": {"A": "x" * (1024 * 1024)}}
    status, said = refusal(api.create_namespaced_config_map, "default", big)
    assert status == 422 and "must have at most 1048576 bytes" in said
