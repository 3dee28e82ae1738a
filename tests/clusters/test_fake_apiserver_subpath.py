"""The fake API server and its kubelet treat a volume mount's subPath and subPathExpr as real
ones do (what a native sharer's mount of its GPU's pipe relies on,
clusters/native_sharing.py): the API server refuses both set, an absolute path, a '..' part
(ValidateVolumeMounts, on the expression before expansion); the kubelet expands
subPathExpr's $(VAR) from the container's environment (its envFrom sources in order, then its
env, a later one winning) and makes no container while a variable is unset or empty
("missing value for VAR", CreateContainerConfigError)."""

from __future__ import annotations

import pytest

from tests.clusters.test_fake_apiserver_strict import api, fake, refusal  # noqa: F401

pytestmark = pytest.mark.timeout(30)
ROOT = {"name": "root", "hostPath": {"path": "/run/gpupool/mps", "type": "Directory"}}


def mounting(name: str, mount: dict, *, env_from=(), env=(), node: str = "gpu-a") -> dict:
    container = {
        "name": "main",
        "image": "x",
        "volumeMounts": [{"name": "root", "mountPath": "/run/nvidia-mps", **mount}],
        "envFrom": list(env_from),
        "env": list(env),
    }
    return {
        "metadata": {"name": name},
        "spec": {"containers": [container], "volumes": [ROOT], "nodeName": node},
    }


def test_sub_path_and_sub_path_expr_together_are_refused(api):  # noqa: F811
    both = mounting("both", {"subPath": "a", "subPathExpr": "$(A)"})
    status, said = refusal(api.create_namespaced_pod, "default", both)
    assert (status, said) == (
        422,
        'spec.containers[0].volumeMounts[0].subPathExpr: Invalid value: "$(A)": '
        "subPathExpr and subPath are mutually exclusive",
    )


@pytest.mark.parametrize("field", ["subPath", "subPathExpr"])
@pytest.mark.parametrize(
    ("value", "why"),
    [("/$(A)/pipe", "must be a relative path"), ("$(A)/../other", "must not contain '..'")],
    ids=["absolute", "parent"],
)
def test_an_absolute_sub_path_or_one_with_a_parent_part_is_refused(api, field, value, why):  # noqa: F811
    status, said = refusal(api.create_namespaced_pod, "default", mounting("bad", {field: value}))
    assert (status, said) == (
        422,
        f'spec.containers[0].volumeMounts.{field}: Invalid value: "{value}": {why}',
    )


@pytest.mark.parametrize("field", ["subPath", "subPathExpr"])
def test_a_name_with_dots_in_it_is_no_parent_part(api, fake, field):  # noqa: F811
    api.create_namespaced_pod("default", mounting("dots", {field: "a..b/pipe"}))
    assert fake.pod("default", "dots") is not None


def test_an_init_containers_sub_path_is_checked_too(api):  # noqa: F811
    body = mounting("init", {})
    body["spec"]["initContainers"] = [
        {"name": "setup", "image": "x",
         "volumeMounts": [{"name": "root", "mountPath": "/m", "subPathExpr": "/x"}]}
    ]  # fmt: skip
    status, said = refusal(api.create_namespaced_pod, "default", body)
    assert status == 422 and "must be a relative path" in said


def test_the_kubelet_expands_sub_path_expr_from_the_containers_environment(api, fake):  # noqa: F811
    api.create_namespaced_config_map(
        "default", {"metadata": {"name": "gpu"}, "data": {"PIPE": "GPU-a/pipe"}}
    )
    api.create_namespaced_config_map(
        "default", {"metadata": {"name": "later"}, "data": {"PIPE": "GPU-b/pipe"}}
    )
    gpu, later = {"configMapRef": {"name": "gpu"}}, {"configMapRef": {"name": "later"}}
    expr = {"subPathExpr": "$(PIPE)"}
    api.create_namespaced_pod("default", mounting("mine", expr, env_from=[gpu]))
    assert fake.pod("default", "mine")["status"]["phase"] == "Running"
    assert fake.sub_paths[("default", "mine")] == {("main", "/run/nvidia-mps"): "GPU-a/pipe"}
    # A later envFrom source wins; the container's env wins over every one.
    api.create_namespaced_pod("default", mounting("later", expr, env_from=[gpu, later]))
    assert fake.sub_paths[("default", "later")] == {("main", "/run/nvidia-mps"): "GPU-b/pipe"}
    own = [{"name": "PIPE", "value": "GPU-c/pipe"}]
    api.create_namespaced_pod("default", mounting("own", expr, env_from=[gpu], env=own))
    assert fake.sub_paths[("default", "own")] == {("main", "/run/nvidia-mps"): "GPU-c/pipe"}
    prefixed = {**gpu, "prefix": "X_"}
    api.create_namespaced_pod("default", mounting("prefixed", expr, env_from=[prefixed]))
    pod = fake.pod("default", "prefixed")
    waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
    assert pod["status"]["phase"] == "Pending"
    assert waiting == {"reason": "CreateContainerConfigError", "message": "missing value for PIPE"}
    empty = [{"name": "PIPE", "value": ""}]
    api.create_namespaced_pod("default", mounting("empty", expr, env=empty))
    assert fake.pod("default", "empty")["status"]["phase"] == "Pending"
    assert ("default", "empty") not in fake.sub_paths
