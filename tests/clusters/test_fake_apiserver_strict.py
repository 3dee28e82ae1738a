"""The fake API server refuses what a real one refuses and adds what a real one adds, where
GPUPool depends on it. Each message is the real API server's (Kubernetes 1.30+)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from tests.clusters.fake_apiserver import FakeApiServer

pytestmark = pytest.mark.timeout(30)
RBAC = Path(__file__).resolve().parents[2] / "deploy" / "base" / "rbac.yaml"
RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "seccompProfile": {"type": "RuntimeDefault"},
}
LOCKED_DOWN = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


@pytest.fixture
def fake():
    with FakeApiServer() as server:
        server.add_node("gpu-a", gpus=2)
        yield server


@pytest.fixture
def api(fake):
    return k8s.CoreV1Api(k8s_config.new_client_from_config_dict(fake.kubeconfig()))


def refusal(call, *args, **kwargs) -> tuple[int, str]:
    with pytest.raises(ApiException) as err:
        call(*args, **kwargs)
    return err.value.status, json.loads(err.value.body)["message"]


def pod(name: str, *, container: str = "main", pod_sc=None, container_sc=None, **spec):
    body = {
        "metadata": {"name": name},
        "spec": {
            "nodeName": "gpu-a",
            "containers": [{"name": container, "image": "x", "securityContext": container_sc}],
            **spec,
        },
    }
    if pod_sc is not None:
        body["spec"]["securityContext"] = pod_sc
    return body


def namespace(api, name: str, level: str | None = None) -> None:
    labels = {"pod-security.kubernetes.io/enforce": level} if level else {}
    api.create_namespace({"metadata": {"name": name, "labels": labels}})


def test_a_log_is_of_a_container_the_pod_has(api, fake):
    namespace(api, "sys")
    api.create_namespaced_pod("sys", pod("gp-reserve-a-0", container="hold"))
    fake.logs[("sys", "gp-reserve-a-0")] = "GPU-x\n"
    status, message = refusal(
        api.read_namespaced_pod_log, "gp-reserve-a-0", "sys", container="main"
    )
    assert (status, message) == (400, "container main is not valid for pod gp-reserve-a-0")
    assert api.read_namespaced_pod_log("gp-reserve-a-0", "sys", container="hold") == "GPU-x\n"
    # With one container the name may be left out; with two it may not.
    assert api.read_namespaced_pod_log("gp-reserve-a-0", "sys") == "GPU-x\n"
    two = pod("two")
    two["spec"]["containers"].append({"name": "side", "image": "x"})
    api.create_namespaced_pod("sys", two)
    status, message = refusal(api.read_namespaced_pod_log, "two", "sys")
    assert message == "a container name must be specified for pod two, choose one of: [main side]"


def test_a_log_of_a_container_that_has_not_started_is_refused(api, fake):
    fake.auto_run = False
    namespace(api, "sys")
    api.create_namespaced_pod("sys", pod("waiting"))
    status, message = refusal(api.read_namespaced_pod_log, "waiting", "sys", container="main")
    assert status == 400
    assert message == 'container "main" in pod "waiting" is waiting to start: ContainerCreating'


def test_namespaces_carry_their_name_label_and_the_system_ones_exist(api):
    namespace(api, "team")
    labels = api.read_namespace("team").metadata.labels
    assert labels["kubernetes.io/metadata.name"] == "team"
    # A patch cannot take it away or change it.
    patch = {"metadata": {"labels": {"kubernetes.io/metadata.name": None, "a": "b"}}}
    api.patch_namespace("team", patch)
    assert api.read_namespace("team").metadata.labels["kubernetes.io/metadata.name"] == "team"
    names = {n.metadata.name for n in api.list_namespace().items}
    assert {"default", "kube-system", "kube-public", "kube-node-lease"} <= names
    assert api.read_namespace("kube-system").metadata.uid


def test_a_new_node_is_tainted_not_ready_until_it_reports_ready(api, fake):
    fake.add_node("late", ready=False)
    node = api.read_node("late")
    assert [(t.key, t.effect) for t in node.spec.taints] == [
        ("node.kubernetes.io/not-ready", "NoSchedule")
    ]
    fake.set_ready("late", True)
    node = api.read_node("late")
    assert not node.spec.taints
    assert [(c.type, c.status) for c in node.status.conditions] == [("Ready", "True")]
    # The node came up through NotReady: a watcher saw the taint first.
    kinds = [kind for _, resource, kind, obj in fake.history if obj["metadata"]["name"] == "late"]
    assert kinds == ["ADDED", "MODIFIED"]


def test_a_dry_run_create_is_admitted_and_answered_but_not_stored(api, fake):
    """dryRun=All runs validation and admission (Pod Security too) and answers the object,
    storing nothing; GPUPool checks a submitted Job's pod template so."""
    namespace(api, "locked", "restricted")
    status, message = refusal(api.create_namespaced_pod, "locked", pod("bare"), dry_run="All")
    assert status == 403
    assert message.startswith('pods "bare" is forbidden: violates PodSecurity "restricted:latest"')
    fine = pod("fine", pod_sc=RESTRICTED, container_sc=LOCKED_DOWN)
    assert api.create_namespaced_pod("locked", fine, dry_run="All").metadata.name == "fine"
    assert fake.pods() == []


def test_a_restricted_namespace_refuses_a_pod_with_the_plugins_message(api):
    namespace(api, "locked", "restricted")
    status, message = refusal(api.create_namespaced_pod, "locked", pod("bare"))
    assert status == 403
    assert message == (
        'pods "bare" is forbidden: violates PodSecurity "restricted:latest": '
        'allowPrivilegeEscalation != false (container "main" must set '
        "securityContext.allowPrivilegeEscalation=false), unrestricted capabilities "
        '(container "main" must set securityContext.capabilities.drop=["ALL"]), '
        'runAsNonRoot != true (pod or container "main" must set '
        'securityContext.runAsNonRoot=true), seccompProfile (pod or container "main" must '
        'set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")'
    )
    fine = pod("fine", pod_sc=RESTRICTED, container_sc=LOCKED_DOWN)
    assert api.create_namespaced_pod("locked", fine).metadata.name == "fine"
    rooted = pod("rooted", pod_sc={**RESTRICTED, "runAsUser": 0}, container_sc=LOCKED_DOWN)
    status, message = refusal(api.create_namespaced_pod, "locked", rooted)
    assert "runAsUser=0 (pod must not set runAsUser=0)" in message
    host = pod("host", pod_sc=RESTRICTED, container_sc=LOCKED_DOWN)
    host["spec"]["volumes"] = [{"name": "dev", "hostPath": {"path": "/dev"}}]
    _, message = refusal(api.create_namespaced_pod, "locked", host)
    assert 'restricted volume types (volume "dev" uses restricted volume type "hostPath")' in (
        message
    )


def test_baseline_refuses_privilege_but_not_root_and_privileged_refuses_nothing(api, fake):
    namespace(api, "base", "baseline")
    assert api.create_namespaced_pod("base", pod("root")).metadata.name == "root"
    privileged = pod("priv", container_sc={"privileged": True})
    status, message = refusal(api.create_namespaced_pod, "base", privileged)
    assert (status, message) == (
        403,
        'pods "priv" is forbidden: violates PodSecurity "baseline:latest": privileged '
        '(container "main" must not set securityContext.privileged=true)',
    )
    namespace(api, "open")
    assert api.create_namespaced_pod("open", privileged).metadata.name == "priv"
    # The cluster's default level holds where a namespace sets none.
    fake.pod_security_default = "restricted"
    namespace(api, "defaulted")
    assert refusal(api.create_namespaced_pod, "defaulted", pod("bare"))[0] == 403


def test_a_webhook_denial_is_forbidden_with_its_reason(api, fake):
    namespace(api, "hooked")
    fake.webhooks["images.example.com"] = lambda p: "image x is not signed"
    status, message = refusal(api.create_namespaced_pod, "hooked", pod("p"))
    assert (status, message) == (
        403,
        'admission webhook "images.example.com" denied the request: image x is not signed',
    )


def test_env_names_are_what_kubernetes_1_30_takes(api):
    namespace(api, "env")
    ok = pod("ok")
    ok["spec"]["containers"][0]["env"] = [{"name": "1 weird.name-ok!", "value": "x"}]
    assert api.create_namespaced_pod("env", ok).metadata.name == "ok"
    for name, said in [
        ("A=B", 'Invalid value: "A=B": a valid environment variable name must consist only'),
        ("tab\there", "Invalid value"),
        ("", "spec.containers[0].env[0].name: Required value"),
    ]:
        bad = pod("bad")
        bad["spec"]["containers"][0]["env"] = [{"name": name, "value": "x"}]
        status, message = refusal(api.create_namespaced_pod, "env", bad)
        assert status == 422 and said in message, name


def test_priority_classes_must_exist_and_stay_below_the_system_range(api, fake):
    scheduling = k8s.SchedulingV1Api(api.api_client)
    namespace(api, "prio")
    status, message = refusal(
        api.create_namespaced_pod, "prio", pod("p", priorityClassName="missing")
    )
    assert (status, message) == (
        403,
        'pods "p" is forbidden: no PriorityClass with name missing was found',
    )
    too_high = {"metadata": {"name": "huge"}, "value": 2_000_000_000}
    status, message = refusal(scheduling.create_priority_class, too_high)
    assert status == 422 and "maximum allowed value of a user defined priority" in message
    reserved = {"metadata": {"name": "system-mine"}, "value": 1}
    assert refusal(scheduling.create_priority_class, reserved)[0] == 422
    scheduling.create_priority_class({"metadata": {"name": "high"}, "value": 1000})
    assert refusal(scheduling.create_priority_class, {"metadata": {"name": "high"}, "value": 1})[
        0
    ] == (409)
    made = api.create_namespaced_pod("prio", pod("p", priorityClassName="high"))
    assert made.spec.priority == 1000


def test_pods_get_their_qos_class_and_requests_above_limits_are_invalid(api):
    namespace(api, "qos")

    def with_resources(name: str, resources: dict) -> dict:
        body = pod(name)
        body["spec"]["containers"][0]["resources"] = resources
        return body

    equal = {"cpu": "10m", "memory": "64Mi"}
    cases = {
        "guaranteed": ({"requests": equal, "limits": equal}, "Guaranteed"),
        "limits-only": ({"limits": {**equal, "nvidia.com/gpu": "1"}}, "Guaranteed"),
        "burstable": ({"requests": equal, "limits": {"memory": "64Mi"}}, "Burstable"),
        "besteffort": ({}, "BestEffort"),
    }
    for name, (resources, qos) in cases.items():
        made = api.create_namespaced_pod("qos", with_resources(name, resources))
        assert made.status.qos_class == qos, name
    over = with_resources("over", {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}})
    status, message = refusal(api.create_namespaced_pod, "qos", over)
    assert status == 422 and "must be less than or equal to cpu limit of 1" in message
    gpu = {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}}
    status, message = refusal(api.create_namespaced_pod, "qos", with_resources("gpu", gpu))
    assert status == 422 and "must be equal to nvidia.com/gpu limit of 2" in message


def test_rbac_refuses_what_the_role_does_not_allow_with_the_authorizers_message(api, fake):
    namespace(api, "rbac")
    fake.allow([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}])
    assert api.list_pod_for_all_namespaces().items == []
    status, message = refusal(api.create_namespaced_pod, "rbac", pod("p"))
    assert (status, message) == (
        403,
        'pods is forbidden: User "system:serviceaccount:gpupool:gpupool" cannot create '
        'resource "pods" in API group "" in the namespace "rbac"',
    )
    status, message = refusal(api.read_namespaced_pod_log, "p", "rbac")
    assert message.startswith('pods "p" is forbidden') and 'resource "pods/log"' in message
    _, message = refusal(api.list_node)
    assert message.endswith('cannot list resource "nodes" in API group "" at the cluster scope')
    assert fake.denied == [
        ("create", "pods", "rbac"),
        ("get", "pods/log", "rbac"),
        ("list", "nodes", ""),
    ]
    assert fake.allowed == {("list", "", "pods")}
    # /version is readable by anyone, as system:public-info-viewer allows.
    assert k8s.VersionApi(api.api_client).get_code().git_version


JOBS_ROLE = {
    "metadata": {"name": "jobs"},
    "rules": [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}],
}
SA = {"kind": "ServiceAccount", "name": "gpupool", "namespace": "gpupool"}


def role_binding(name: str, subject: dict, role: str = "jobs") -> dict:
    return {"metadata": {"name": name}, "subjects": [subject],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role}}  # fmt: skip


def test_a_role_binding_grants_its_role_only_in_its_namespace_and_to_its_subjects(api, fake):
    rbac = k8s.RbacAuthorizationV1Api(api.api_client)
    jobs = k8s.BatchV1Api(api.api_client)
    for name in ("team", "other"):
        namespace(api, name)
    rbac.create_cluster_role(JOBS_ROLE)
    someone = {"kind": "ServiceAccount", "name": "gpupool", "namespace": "elsewhere"}
    rbac.create_namespaced_role_binding("other", role_binding("not-us", someone))
    rbac.create_namespaced_role_binding("team", role_binding("us", SA))
    fake.allow([])
    job = {"metadata": {"name": "j"}, "spec": {"template": {"spec": {
        "restartPolicy": "Never", "containers": [{"name": "m", "image": "x"}]}}}}  # fmt: skip
    assert jobs.create_namespaced_job("team", job).metadata.namespace == "team"
    status, message = refusal(jobs.create_namespaced_job, "other", job)
    assert status == 403 and message.endswith(
        'cannot create resource "jobs" in API group "batch" in the namespace "other"'
    )
    assert fake.denied == [("create", "jobs", "other")]
    status, _ = refusal(jobs.list_job_for_all_namespaces)  # a binding is never cluster-wide
    assert status == 403


def test_a_role_binding_is_refused_to_a_user_who_may_not_bind_its_role_nor_holds_it(api, fake):
    """RBAC's escalation check: `bind` on that role (by name), or all its rights held."""
    rbac = k8s.RbacAuthorizationV1Api(api.api_client)
    namespace(api, "team")
    rbac.create_cluster_role(JOBS_ROLE)
    may_bind = {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["rolebindings"],
                "verbs": ["create"]}  # fmt: skip
    bind_other = {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
                  "resourceNames": ["another"], "verbs": ["bind"]}  # fmt: skip
    fake.allow([may_bind, bind_other])
    status, message = refusal(rbac.create_namespaced_role_binding, "team", role_binding("b", SA))
    assert (status, message) == (
        403,
        'rolebindings.rbac.authorization.k8s.io "b" is forbidden: user '
        '"system:serviceaccount:gpupool:gpupool" (groups=["system:serviceaccounts" '
        '"system:serviceaccounts:gpupool" "system:authenticated"]) is attempting to grant '
        'RBAC permissions not currently held:\n{APIGroups:["batch"], Resources:["jobs"], '
        'Verbs:["create"]}',
    )
    status, message = refusal(
        rbac.create_namespaced_role_binding, "team", role_binding("c", SA, "missing")
    )
    assert (status, message) == (
        404,
        'clusterroles.rbac.authorization.k8s.io "missing" not found',
    )
    assert not fake.objects.get("rbac.authorization.k8s.io/v1/rolebindings")
    bind_jobs = {**bind_other, "resourceNames": ["jobs"]}
    fake.allow([may_bind, bind_jobs])
    rbac.create_namespaced_role_binding("team", role_binding("b", SA))
    assert ("bind", "rbac.authorization.k8s.io", "clusterroles") in fake.allowed
    holds = {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}
    fake.allow([may_bind, holds])  # holding all it grants is enough
    rbac.create_namespaced_role_binding("team", role_binding("d", SA))


def test_anyone_may_ask_who_they_are(api, fake):
    fake.allow([])
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    answer = k8s.AuthenticationV1Api(api.api_client).create_self_subject_review(review)
    assert answer.status.user_info.username == "system:serviceaccount:gpupool:gpupool"
    assert answer.status.user_info.groups[-1] == "system:authenticated"
    assert fake.denied == []


def test_the_shipped_cluster_role_is_read_from_deploy(fake):
    role = next(
        doc for doc in yaml.safe_load_all(RBAC.read_text()) if doc and doc["kind"] == "ClusterRole"
    )
    assert role["metadata"]["name"] == "gpupool-controller"
    fake.allow(role["rules"])
    assert fake.rbac_rules == role["rules"]


# --- annotations (the MIG layout the portal publishes on a Node) ----------------------------


@pytest.mark.parametrize(
    ("annotations", "status", "message"),
    [
        ({"gpupool.io/mig-layout": "{}"}, 200, ""),
        ({"gpupool.io/mig-layout": 7}, 400, "cannot unmarshal number"),
        ({"gpupool.io/mig-layout": {"id": "x"}}, 400, "of type string"),
        ({"gpupool.io/mig layout": "x"}, 422, 'Invalid value: "gpupool.io/mig layout"'),
        ({"Bad_Prefix/x": "x"}, 422, "metadata.annotations: Invalid value"),
        ({"-x": "x"}, 422, "must start and end with an alphanumeric"),
        ({"a" * 64: "x"}, 422, "metadata.annotations: Invalid value"),
        ({"big": "x" * (256 * 1024)}, 422, "Too long: must have at most 262144 bytes"),
    ],
)
def test_a_node_annotation_is_refused_as_the_real_server_refuses_it(
    fake, api, annotations, status, message
):
    patch = {"metadata": {"annotations": annotations}}
    if status == 200:
        node = api.patch_node("gpu-a", patch)
        assert node.metadata.annotations == annotations
        return
    assert refusal(api.patch_node, "gpu-a", patch)[0] == status
    with pytest.raises(ApiException) as err:
        api.patch_node("gpu-a", patch)
    assert message in json.loads(err.value.body)["message"]
    assert "annotations" not in fake.objects["nodes"][("", "gpu-a")]["metadata"]  # nothing kept


def test_annotations_count_together_against_the_limit_and_null_removes_one(fake, api):
    half = "x" * (130 * 1024)
    api.patch_node("gpu-a", {"metadata": {"annotations": {"a": half}}})
    status, message = refusal(api.patch_node, "gpu-a", {"metadata": {"annotations": {"b": half}}})
    assert (status, "Too long" in message) == (422, True)
    api.patch_node("gpu-a", {"metadata": {"annotations": {"a": None, "b": half}}})
    assert fake.objects["nodes"][("", "gpu-a")]["metadata"]["annotations"] == {"b": half}


def test_a_pod_removed_at_once_is_answered_marked_for_deletion_with_grace_0(api, fake):
    """The pod registry turns grace 0, a pod never bound to a node and a finished pod into an
    immediate delete, yet answers with the object as it stored it before removing it:
    deletionTimestamp set, deletionGracePeriodSeconds 0. The next read is 404."""
    fake.deferred_delete = True  # the kubelet confirms graceful deletions only when told
    fake.auto_run = False
    namespace(api, "team")
    api.create_namespaced_pod("team", pod("forced"))
    api.create_namespaced_pod("team", pod("unbound", nodeName=None))
    api.create_namespaced_pod("team", pod("done"))
    fake.finish("team", "done", exit_code=0)
    for name, grace in (("forced", 0), ("unbound", 30), ("done", 30)):
        answer = api.delete_namespaced_pod(name, "team", grace_period_seconds=grace)
        assert answer.metadata.deletion_timestamp is not None, name
        assert answer.metadata.deletion_grace_period_seconds == 0, name
        assert refusal(api.read_namespaced_pod, name, "team")[0] == 404, name


def test_a_graceful_pod_delete_is_answered_with_the_pods_own_grace_and_keeps_it(api, fake):
    fake.deferred_delete = True
    namespace(api, "team")
    api.create_namespaced_pod("team", pod("default"))
    api.create_namespaced_pod("team", pod("own", terminationGracePeriodSeconds=90))
    for name, grace in (("default", 30), ("own", 90)):
        answer = api.delete_namespaced_pod(name, "team")
        assert (answer.metadata.deletion_grace_period_seconds, name) == (grace, name)
        assert api.read_namespaced_pod(name, "team").metadata.deletion_timestamp
    assert fake.complete_deletions() == 2
