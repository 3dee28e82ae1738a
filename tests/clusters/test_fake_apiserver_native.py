"""The fake API server does what native scheduling needs as a real one (Kubernetes 1.30+)
does: bindings, pod status and its conditions, Events, the Eviction API with
PodDisruptionBudgets, a Job controller, field selectors and ownerReferences. Each test talks
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
from tests.clusters.fake_generic import clone

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


# --- pods/binding: BindingREST.Create and setPodHostAndAnnotations (pkg/registry/core/pod/
# storage/storage.go) -------------------------------------------------------------------------
def test_a_binding_sets_the_node_copies_its_annotations_and_marks_the_pod_scheduled(api, fake):
    api.create_namespaced_pod(NS, pod("p"))
    answer = bind(api, "p", binding("p", annotations={"gpupool.io/bound-by": "i.c"}))
    assert answer.status == 201
    assert json.loads(answer.data)["status"] == "Success"
    stored = fake.pod(NS, "p")
    assert stored["spec"]["nodeName"] == "gpu-a"
    assert stored["metadata"]["annotations"] == {"gpupool.io/bound-by": "i.c"}
    conditions = {c["type"]: c for c in stored["status"]["conditions"]}
    assert conditions["PodScheduled"]["status"] == "True"
    assert conditions["PodScheduled"]["lastTransitionTime"]


def test_the_device_plugin_gives_out_each_gpu_once_and_takes_it_back_with_the_pod(api):
    """The kubelet's device plugin: a bound pod gets the node's lowest free GPUs (its log
    names them, as nvidia-smi would); with none free the pod fails at admission
    (UnexpectedAdmissionError); a deleted pod's GPUs go to the next pod."""
    gpu = [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    for name in ("a", "b", "c"):
        api.create_namespaced_pod(NS, pod(name, containers=gpu))
        bind(api, name)
    assert [api.read_namespaced_pod_log(n, NS) for n in ("a", "b")] == [
        "GPU-gpu-a-0\n",
        "GPU-gpu-a-1\n",
    ]
    refused = api.read_namespaced_pod("c", NS).status
    assert (refused.phase, refused.reason) == ("Failed", "UnexpectedAdmissionError")
    api.delete_namespaced_pod("a", NS, grace_period_seconds=0)
    api.create_namespaced_pod(NS, pod("d", containers=gpu))
    bind(api, "d")
    assert api.read_namespaced_pod_log("d", NS) == "GPU-gpu-a-0\n"


def test_a_watch_shows_each_version_of_a_pod_as_it_was_then(api):
    """The watch cache keeps each version as written (etcd's revisions): a Binding that
    changes the stored pod afterwards does not change the ADDED event already kept."""
    since = api.list_namespaced_pod(NS).metadata.resource_version
    api.create_namespaced_pod(NS, pod("p"))
    bind(api, "p")
    stream = k8s_watch.Watch().stream(
        api.list_namespaced_pod, NS, resource_version=since, timeout_seconds=1
    )
    seen = [(e["type"], e["object"].spec.node_name, e["object"].metadata.resource_version)
            for e in stream]  # fmt: skip
    assert [(kind, node) for kind, node, _ in seen] == [("ADDED", None), ("MODIFIED", "gpu-a")]
    assert int(seen[0][2]) < int(seen[1][2])


def test_the_servers_copies_share_nothing_with_what_it_stores():
    """clone: what the server keeps and what it answers are separate documents, value for
    value (booleans stay booleans); a type marshal cannot write is copied all the same."""
    shared = {"a": [1, 2]}
    document = {"x": shared, "y": shared, "flag": True, "n": None, "f": 0.5}
    copied = clone(document)
    assert copied == document and type(copied["flag"]) is bool
    copied["x"]["a"].append(3)
    assert shared == {"a": [1, 2]}
    assert copied["y"]["a"] == [1, 2, 3]  # shared within the copy, as deepcopy keeps it

    class Labels(dict):
        pass

    odd = clone({"labels": Labels(k="v")})
    assert type(odd["labels"]) is Labels and odd["labels"] == {"k": "v"}


def test_the_kubelet_keeps_a_pods_conditions(api, fake):
    """generateAPIPodStatus: a started pod is PodScheduled, Initialized, ready; a finished
    one is not ready any more, reason PodCompleted."""
    api.create_namespaced_pod(NS, pod("p", nodeName="gpu-a"))  # pinned: no Binding

    def conditions() -> dict[str, tuple[str, str | None]]:
        stored = fake.pod(NS, "p")["status"]["conditions"]
        return {c["type"]: (c["status"], c.get("reason")) for c in stored}

    assert conditions() == {
        "PodScheduled": ("True", None),
        "PodReadyToStartContainers": ("True", None),
        "Initialized": ("True", None),
        "ContainersReady": ("True", None),
        "Ready": ("True", None),
    }
    fake.finish(NS, "p", 0)
    assert conditions()["Ready"] == ("False", "PodCompleted")
    assert conditions()["ContainersReady"] == ("False", "PodCompleted")


def test_a_pod_bound_already_cannot_be_bound_again(api):
    api.create_namespaced_pod(NS, pod("p"))
    bind(api, "p")
    status, message = refusal(bind, api, "p", node="gpu-b")
    assert status == 409
    assert message == (
        'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node '
        '"gpu-a"'
    )


def test_a_pod_with_scheduling_gates_cannot_be_bound(api):
    """Kubernetes 1.30+: a gated pod is not ready for scheduling; its binding is a 409."""
    api.create_namespaced_pod(NS, pod("p", schedulingGates=[{"name": "example.com/wait"}]))
    status, message = refusal(bind, api, "p")
    assert status == 409
    assert message.endswith("pod p has non-empty .spec.schedulingGates")


def test_a_binding_to_a_node_that_does_not_exist_is_accepted(api, fake):
    """The API server does not look the node up; only that node's kubelet would run it."""
    api.create_namespaced_pod(NS, pod("p"))
    assert bind(api, "p", node="no-such-node").status == 201
    stored = fake.pod(NS, "p")
    assert stored["spec"]["nodeName"] == "no-such-node"
    assert stored["status"]["phase"] == "Pending"
    # No kubelet runs it, so PodScheduled is the Binding's own doing.
    (condition,) = stored["status"]["conditions"]
    assert (condition["type"], condition["status"]) == ("PodScheduled", "True")
    assert condition["lastTransitionTime"]


def test_a_binding_must_name_its_pod_and_a_node(api):
    api.create_namespaced_pod(NS, pod("p"))
    status, message = refusal(bind, api, "p", binding("q"))
    assert (status, message) == (400, "name in URL does not match name in Binding object")
    # ValidatePodBinding's errors are no StatusError: the real server answers 500.
    status, message = refusal(bind, api, "p", binding("p", node=""))
    assert (status, message) == (500, "target.name: Required value")


def test_a_pod_being_deleted_cannot_be_bound():
    with serve(deferred_delete=True) as fake:
        api = k8s.CoreV1Api(k8s_config.new_client_from_config_dict(fake.kubeconfig()))
        api.create_namespace({"metadata": {"name": NS}})
        api.create_namespaced_pod(NS, pod("p"))
        api.create_namespaced_pod(NS, pod("running", nodeName="gpu-a"))
        api.delete_namespaced_pod("running", NS)
        status, message = refusal(bind, api, "running")
        assert status == 409
        assert message.endswith("is being deleted, cannot be assigned to a host")


def test_a_pod_gets_the_real_defaults_of_its_spec(api, fake):
    """SetDefaults_PodSpec and the Priority admission: the default scheduler, and the rest."""
    bare = pod("p")
    bare["spec"].pop("schedulerName")
    api.create_namespaced_pod(NS, bare)
    spec = fake.pod(NS, "p")["spec"]
    assert spec["schedulerName"] == "default-scheduler"
    assert (spec["restartPolicy"], spec["dnsPolicy"], spec["priority"]) == (
        "Always",
        "ClusterFirst",
        0,
    )
    api.create_namespaced_pod(NS, pod("q", restartPolicy="Never"))
    assert fake.pod(NS, "q")["spec"]["schedulerName"] == "gpupool"  # what is given stays
    assert fake.pod(NS, "q")["spec"]["restartPolicy"] == "Never"


# --- pod updates: ValidatePodUpdate (pkg/apis/core/validation/validation.go) ---------------
def test_a_scheduling_gate_can_only_be_removed_and_then_the_pod_can_be_bound(api, fake):
    api.create_namespaced_pod(NS, pod("p", schedulingGates=[{"name": "example.com/wait"}]))
    more = {"spec": {"schedulingGates": [{"name": "example.com/wait"}, {"name": "x.io/b"}]}}
    status, message = refusal(api.patch_namespaced_pod, "p", NS, more)
    assert (status, message) == (
        422,
        'Pod "p" is invalid: spec.schedulingGates: Forbidden: only deletion is allowed, but '
        "found new scheduling gate 'x.io/b'",
    )
    # While gated, the pod's nodeSelector may gain a term (PodSchedulingReadiness).
    api.patch_namespaced_pod("p", NS, {"spec": {"nodeSelector": {"pool": "a100"}}})
    api.patch_namespaced_pod("p", NS, [{"op": "remove", "path": "/spec/schedulingGates"}])
    assert bind(api, "p").status == 201
    assert fake.pod(NS, "p")["spec"]["nodeSelector"] == {"pool": "a100"}


def test_a_pods_spec_changes_only_where_the_real_server_lets_it(api, fake):
    api.create_namespaced_pod(NS, pod("p", labels={"a": "1", "b": "2"}))
    status, message = refusal(api.patch_namespaced_pod, "p", NS, {"spec": {"nodeName": "gpu-a"}})
    assert status == 422
    assert message.startswith('Pod "p" is invalid: spec: Forbidden: pod updates may not change')
    status, _ = refusal(api.patch_namespaced_pod, "p", NS, {"spec": {"nodeSelector": {"x": "y"}}})
    assert status == 422  # not gated: the node selector is fixed
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    api.patch_namespaced_pod("p", NS, {"spec": {"tolerations": [toleration]}})
    image = [{"op": "replace", "path": "/spec/containers/0/image", "value": "y"}]
    api.patch_namespaced_pod("p", NS, image)
    merging = k8s_config.new_client_from_config_dict(fake.kubeconfig())
    merging.set_default_header("Content-Type", "application/merge-patch+json")
    k8s.CoreV1Api(merging).patch_namespaced_pod("p", NS, {"metadata": {"labels": {"a": None}}})
    stored = fake.pod(NS, "p")
    assert stored["spec"]["tolerations"] == [toleration]
    assert stored["spec"]["containers"][0]["image"] == "y"
    assert stored["metadata"]["labels"] == {"b": "2"}
    assert stored["status"]["phase"] == "Pending"  # a PATCH of the pod leaves its status


def test_a_json_patch_that_cannot_apply_is_422(api):
    api.create_namespaced_pod(NS, pod("p"))
    api.patch_namespaced_pod("p", NS, {"metadata": {"annotations": {"a": "1"}}})
    for operations in (
        [{"op": "remove", "path": "/spec/schedulingGates"}],
        [{"op": "test", "path": "/spec/schedulerName", "value": "other"}],
        [{"op": "replace", "path": "/metadata/annotations/missing", "value": "x"}],
    ):
        status, message = refusal(api.patch_namespaced_pod, "p", NS, operations)
        assert (status, message) == (
            422,
            "the server rejected our request due to an error in our request",
        )


# --- pods/status: podStatusStrategy (status only), validatePodConditions ---------------------
UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "Needs 2 GPUs in pool a100; 1 is free",
}


def test_a_scheduler_sets_a_condition_with_a_strategic_merge_patch(api, fake):
    """Conditions merge by type (patchMergeKey): a patch of one keeps the others."""
    api.create_namespaced_pod(NS, pod("p"))
    api.patch_namespaced_pod_status(
        "p", NS, {"status": {"conditions": [{"type": "example.com/Gate", "status": "True"}]}}
    )
    patched = api.patch_namespaced_pod_status("p", NS, {"status": {"conditions": [UNSCHEDULABLE]}})
    kinds = {c.type: (c.status, c.reason, c.message) for c in patched.status.conditions}
    assert kinds == {
        "example.com/Gate": ("True", None, None),
        "PodScheduled": ("False", "Unschedulable", "Needs 2 GPUs in pool a100; 1 is free"),
    }
    assert fake.pod(NS, "p")["status"]["phase"] == "Pending"  # the rest of status stays


def test_a_merge_patch_of_status_replaces_the_conditions_whole(api, fake):
    api.create_namespaced_pod(NS, pod("p"))
    first = {"status": {"conditions": [{"type": "example.com/Gate", "status": "True"}]}}
    api.patch_namespaced_pod_status("p", NS, first)
    # This client picks the content type itself; a default header overrides it.
    merging = k8s_config.new_client_from_config_dict(fake.kubeconfig())
    merging.set_default_header("Content-Type", "application/merge-patch+json")
    body = {"status": {"conditions": [UNSCHEDULABLE]}}
    patched = k8s.CoreV1Api(merging).patch_namespaced_pod_status("p", NS, body)
    assert [c.type for c in patched.status.conditions] == ["PodScheduled"]


def test_a_status_write_changes_neither_spec_nor_metadata(api, fake):
    api.create_namespaced_pod(NS, pod("p", labels={"a": "1"}))
    stored = fake.pod(NS, "p")
    stored["spec"]["schedulerName"] = "someone-else"
    stored["metadata"]["labels"] = {"a": "2"}
    stored["status"]["conditions"] = [UNSCHEDULABLE]
    written = api.replace_namespaced_pod_status("p", NS, stored)
    assert written.spec.scheduler_name == "gpupool"
    assert written.metadata.labels == {"a": "1"}
    assert written.status.conditions[0].reason == "Unschedulable"
    assert int(written.metadata.resource_version) > int(stored["metadata"]["resourceVersion"])
    # A stale resourceVersion is a conflict, as on any update.
    status, _ = refusal(api.replace_namespaced_pod_status, "p", NS, stored)
    assert status == 409


def test_a_status_write_is_a_modified_watch_event(api, fake):
    api.create_namespaced_pod(NS, pod("p"))
    since = api.list_namespaced_pod(NS).metadata.resource_version
    api.patch_namespaced_pod_status("p", NS, {"status": {"conditions": [UNSCHEDULABLE]}})
    stream = k8s_watch.Watch().stream(
        api.list_namespaced_pod, NS, resource_version=since, timeout_seconds=1
    )
    events = [(e["type"], e["object"].status.conditions) for e in stream]
    assert [kind for kind, _ in events] == ["MODIFIED"]
    assert events[0][1][0].reason == "Unschedulable"


def test_a_condition_of_the_pods_own_needs_a_qualified_type(api):
    """The real server checks no status value, only that a non-system type is a qualified
    name (so never empty)."""
    api.create_namespaced_pod(NS, pod("p"))
    body = {"status": {"conditions": [{"type": "", "status": "True"}]}}
    status, message = refusal(api.patch_namespaced_pod_status, "p", NS, body)
    assert status == 422
    assert message == 'status.conditions[0].Type: Invalid value: "": name part must be non-empty'


# --- core/v1 Events: legacyValidateEvent (pkg/apis/core/validation/events.go) ---------------
def event(name: str | None, *, involved_ns: str = NS, **fields) -> dict:
    meta = {"name": name} if name else {"generateName": "p."}
    involved = {"kind": "Pod", "name": "p", "namespace": involved_ns, "apiVersion": "v1"}
    return {
        "metadata": meta,
        "involvedObject": involved,
        "reason": "Unschedulable",
        "message": "Needs 2 GPUs",
        "type": "Warning",
        **fields,
    }


def test_events_are_created_read_listed_and_patched(api, fake):
    api.create_namespace({"metadata": {"name": "team-b"}})
    first = event("p.1", count=1, firstTimestamp="2026-01-01T00:00:00Z")
    api.create_namespaced_event(NS, first)
    api.create_namespaced_event("team-b", event("q.1", involved_ns="team-b"))
    generated = api.create_namespaced_event(NS, event(None))
    assert generated.metadata.name.startswith("p.")
    assert len(generated.metadata.name) == len("p.") + 5
    assert api.read_namespaced_event("p.1", NS).reason == "Unschedulable"
    assert {e.metadata.name for e in api.list_namespaced_event(NS).items} == {
        "p.1",
        generated.metadata.name,
    }
    assert len(api.list_event_for_all_namespaces().items) == 3
    bumped = api.patch_namespaced_event("p.1", NS, {"count": 2})
    assert (bumped.count, bumped.reason, bumped.first_timestamp.year) == (2, "Unschedulable", 2026)
    assert [e["metadata"]["name"] for e in fake.events("team-b")] == ["q.1"]
    assert [e["count"] for e in fake.events(NS) if e["metadata"]["name"] == "p.1"] == [2]


def test_events_are_listed_by_their_object_as_kubectl_describe_does(api):
    """The event strategy's ToSelectableFields: involvedObject.*, reason, source, type."""
    api.create_namespaced_event(NS, event("p.1"))
    other = event("q.1")
    other["involvedObject"]["name"] = "q"
    api.create_namespaced_event(NS, {**other, "type": "Normal", "source": {"component": "x"}})

    def names(selector: str) -> list[str]:
        return [
            e.metadata.name for e in api.list_namespaced_event(NS, field_selector=selector).items
        ]

    assert names("involvedObject.kind=Pod,involvedObject.name=p") == ["p.1"]
    assert names("type!=Warning") == ["q.1"]
    assert names("source=x,reason=Unschedulable") == ["q.1"]
    status, message = refusal(api.list_namespaced_event, NS, field_selector="message=x")
    assert (status, message) == (400, "field label not supported: message")


def test_an_event_is_about_an_object_of_its_own_namespace(api):
    api.create_namespace({"metadata": {"name": "team-b"}})
    status, message = refusal(api.create_namespaced_event, NS, event("e", involved_ns="team-b"))
    assert status == 422
    assert (
        message
        == 'involvedObject.namespace: Invalid value: "team-b": does not match event.namespace'
    )
    # A cluster-scoped object (empty namespace) has its events in "default" only.
    status, _ = refusal(api.create_namespaced_event, NS, event("e", involved_ns=""))
    assert status == 422
    api.create_namespaced_event("default", event("node-event", involved_ns=""))


def test_an_event_needs_a_name(api):
    body = event("x")
    body["metadata"] = {}
    status, message = refusal(api.create_namespaced_event, NS, body)
    assert (status, message) == (
        422,
        "metadata.name: Required value: name or generateName is required",
    )


def test_only_an_event_with_event_time_has_bounded_reason_and_message(api):
    """core/v1 leaves a legacy event's message and type free; a "new" one (eventTime set)
    needs its reporting fields and at most 1024 characters of message."""
    api.create_namespaced_event(NS, event("legacy", message="x" * 2000, type="Custom"))
    new = {
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingComponent": "gpupool",
        "reportingInstance": "gpupool-0",
        "action": "Scheduling",
    }
    api.create_namespaced_event(NS, event("fits", message="x" * 1024, **new))
    status, message = refusal(
        api.create_namespaced_event, NS, event("long", message="x" * 1025, **new)
    )
    assert (status, message) == (
        422,
        'message: Invalid value: "": can have at most 1024 characters',
    )
    no_action = {**new, "action": ""}
    status, message = refusal(api.create_namespaced_event, NS, event("bare", **no_action))
    assert (status, message) == (422, "action: Required value")


# --- the Eviction API: EvictionREST (pkg/registry/core/pod/storage/eviction.go) ---------------
def eviction(name: str, grace: int | None = None) -> dict:
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
    if grace is not None:
        body["deleteOptions"] = {"gracePeriodSeconds": grace}
    return body


def budget(api_client, name: str, **spec) -> None:
    body = {"metadata": {"name": name}, "spec": {"selector": {"matchLabels": {"app": "t"}}, **spec}}
    k8s.PolicyV1Api(api_client).create_namespaced_pod_disruption_budget(NS, body)


def running(api, count: int) -> None:
    for index in range(count):
        api.create_namespaced_pod(NS, pod(f"t-{index}", labels={"app": "t"}, nodeName="gpu-a"))


def test_an_eviction_without_a_budget_deletes_the_pod_with_its_grace_period():
    with serve(deferred_delete=True) as fake:
        api = k8s.CoreV1Api(k8s_config.new_client_from_config_dict(fake.kubeconfig()))
        api.create_namespace({"metadata": {"name": NS}})
        running(api, 1)
        answer = api.create_namespaced_pod_eviction(
            "t-0", NS, eviction("t-0", grace=7), _preload_content=False
        )
        assert (answer.status, json.loads(answer.data)["status"]) == (201, "Success")
        assert fake.pod(NS, "t-0")["metadata"]["deletionGracePeriodSeconds"] == 7


def test_an_eviction_names_an_existing_pod(api):
    status, _ = refusal(api.create_namespaced_pod_eviction, "gone", NS, eviction("gone"))
    assert status == 404
    running(api, 1)
    status, message = refusal(api.create_namespaced_pod_eviction, "t-0", NS, eviction("t-1"))
    assert (status, message) == (400, "name in URL does not match name in Eviction object")


def test_an_eviction_that_would_break_a_budget_is_429(api, api_client, fake):
    running(api, 3)
    budget(api_client, "keep-two", minAvailable=2)
    api.create_namespaced_pod_eviction("t-0", NS, eviction("t-0"))
    assert fake.pod(NS, "t-0") is None
    with pytest.raises(ApiException) as err:
        api.create_namespaced_pod_eviction("t-1", NS, eviction("t-1"))
    body = json.loads(err.value.body)
    assert (err.value.status, body["reason"]) == (429, "TooManyRequests")
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"]["causes"] == [
        {
            "reason": "DisruptionBudget",
            "message": "The disruption budget keep-two needs 2 healthy pods and has 2 currently",
        }
    ]
    assert fake.pod(NS, "t-1") is not None


def test_a_percentage_budget_rounds_up_and_counts_a_terminating_pod_as_gone():
    """maxUnavailable 50% of 3 pods: 2 may be unavailable (rounded up); a pod being deleted
    (here by kubectl, not evicted) is one of them, so one eviction is left."""
    with serve(deferred_delete=True) as fake:
        client = k8s_config.new_client_from_config_dict(fake.kubeconfig())
        api = k8s.CoreV1Api(client)
        api.create_namespace({"metadata": {"name": NS}})
        running(api, 3)
        budget(client, "half", maxUnavailable="50%")
        api.delete_namespaced_pod("t-0", NS)
        api.create_namespaced_pod_eviction("t-1", NS, eviction("t-1"))
        status, _ = refusal(api.create_namespaced_pod_eviction, "t-2", NS, eviction("t-2"))
        assert status == 429
        read = k8s.PolicyV1Api(client).read_namespaced_pod_disruption_budget("half", NS)
        assert list(read.status.disrupted_pods) == ["t-1"]
        assert (read.status.expected_pods, read.status.desired_healthy) == (3, 1)


def test_a_pending_pod_is_evicted_whatever_its_budget(api, api_client, fake):
    api.create_namespaced_pod(NS, pod("waiting", labels={"app": "t"}))
    budget(api_client, "all", minAvailable=5)
    api.create_namespaced_pod_eviction("waiting", NS, eviction("waiting"))
    assert fake.pod(NS, "waiting") is None


def test_a_pod_under_two_budgets_cannot_be_evicted(api, api_client):
    running(api, 1)
    budget(api_client, "one", minAvailable=0)
    budget(api_client, "two", maxUnavailable=1)
    status, message = refusal(api.create_namespaced_pod_eviction, "t-0", NS, eviction("t-0"))
    assert status == 500
    assert message.startswith("This pod has more than one PodDisruptionBudget")


# --- the Job controller (pkg/controller/job/job_controller.go, job strategy's selector) ------
@pytest.fixture
def jobs():
    with serve(job_controller=True) as server:
        client = k8s_config.new_client_from_config_dict(server.kubeconfig())
        k8s.CoreV1Api(client).create_namespace({"metadata": {"name": NS}})
        yield server, k8s.CoreV1Api(client), k8s.BatchV1Api(client)


def job(name: str, **spec) -> dict:
    template = {
        "spec": {
            "schedulerName": "gpupool",
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "x"}],
        }
    }
    return {"metadata": {"name": name}, "spec": {"template": template, **spec}}


def unbound(fake, name: str) -> str:
    return next(p for p in job_pods(fake, name) if not p["spec"].get("nodeName"))["metadata"][
        "name"
    ]


def job_pods(fake, name: str) -> list[dict]:
    return [
        p
        for p in fake.pods()
        if p["metadata"]["labels"].get("batch.kubernetes.io/job-name") == name
        and not p["metadata"].get("deletionTimestamp")
    ]


def test_a_job_makes_its_pods_from_the_template_owned_by_it(jobs):
    fake, api, batch = jobs
    created = batch.create_namespaced_job(NS, job("train", parallelism=2, completions=3))
    pods = job_pods(fake, "train")
    assert len(pods) == 2
    uid = created.metadata.uid
    for made in pods:
        assert made["metadata"]["name"].startswith("train-")
        assert len(made["metadata"]["name"]) == len("train-") + 5
        assert made["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": "train",
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        labels = made["metadata"]["labels"]
        assert labels["batch.kubernetes.io/controller-uid"] == labels["controller-uid"] == uid
        assert labels["job-name"] == "train"
        assert made["spec"]["schedulerName"] == "gpupool"
        assert "nodeName" not in made["spec"]  # the Job controller does not schedule
    read = batch.read_namespaced_job("train", NS)
    assert read.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": uid}
    assert (read.status.active, read.spec.backoff_limit) == (2, 6)


def test_a_job_replaces_its_pods_until_enough_succeed_then_completes(jobs):
    fake, api, batch = jobs
    batch.create_namespaced_job(NS, job("train", parallelism=2, completions=3))
    for _ in range(3):
        name = unbound(fake, "train")
        bind(api, name)
        fake.finish(NS, name, 0)
    read = batch.read_namespaced_job("train", NS)
    assert (read.status.succeeded, read.status.active) == (3, 0)
    conditions = {c.type: (c.status, c.reason) for c in read.status.conditions}
    assert conditions == {
        "SuccessCriteriaMet": ("True", "CompletionsReached"),
        "Complete": ("True", "CompletionsReached"),
    }
    assert read.status.completion_time is not None
    assert len(job_pods(fake, "train")) == 3  # finished pods stay


def test_a_deleted_pod_is_replaced_and_counted_as_failed(jobs):
    """isPodFailed: a pod deleted before it succeeded counts against backoffLimit."""
    fake, api, batch = jobs
    batch.create_namespaced_job(NS, job("train", backoffLimit=1))
    (first,) = job_pods(fake, "train")
    api.delete_namespaced_pod(first["metadata"]["name"], NS)
    (second,) = job_pods(fake, "train")
    assert second["metadata"]["name"] != first["metadata"]["name"]
    assert batch.read_namespaced_job("train", NS).status.failed == 1
    bind(api, second["metadata"]["name"])
    fake.finish(NS, second["metadata"]["name"], 1)
    read = batch.read_namespaced_job("train", NS)
    assert (read.status.failed, read.status.active) == (2, 0)
    failed = [c for c in read.status.conditions if c.type == "Failed"]
    assert [(c.status, c.reason) for c in failed] == [("True", "BackoffLimitExceeded")]
    assert job_pods(fake, "train") == [] or all(
        p["status"]["phase"] == "Failed" for p in job_pods(fake, "train")
    )


def test_a_suspended_job_deletes_its_pods_and_a_resumed_one_makes_them_again(jobs):
    fake, api, batch = jobs
    batch.create_namespaced_job(NS, job("train", parallelism=2, completions=2))
    assert len(job_pods(fake, "train")) == 2
    batch.patch_namespaced_job("train", NS, {"spec": {"suspend": True}})
    read = batch.read_namespaced_job("train", NS)
    assert job_pods(fake, "train") == []
    assert (read.status.active, read.status.failed) == (0, 0)  # not failures of the Job's
    suspended = [(c.status, c.reason) for c in read.status.conditions if c.type == "Suspended"]
    assert suspended == [("True", "JobSuspended")]
    batch.patch_namespaced_job("train", NS, {"spec": {"suspend": False}})
    read = batch.read_namespaced_job("train", NS)
    assert len(job_pods(fake, "train")) == 2
    suspended = [(c.status, c.reason) for c in read.status.conditions if c.type == "Suspended"]
    assert suspended == [("False", "JobResumed")]


def test_a_jobs_template_is_immutable(jobs):
    _, _, batch = jobs
    batch.create_namespaced_job(NS, job("train"))
    body = {"spec": {"template": {"spec": {"schedulerName": "other"}}}}
    status, message = refusal(batch.patch_namespaced_job, "train", NS, body)
    assert (status, message) == (422, "spec.template: Invalid value: field is immutable")


def test_deleting_a_job_collects_its_pods(jobs):
    fake, _, batch = jobs
    batch.create_namespaced_job(NS, job("train", parallelism=2, completions=2))
    batch.delete_namespaced_job("train", NS)
    assert job_pods(fake, "train") == []


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


def test_a_job_whose_pods_are_refused_says_so_in_an_event(jobs):
    """The real controller records FailedCreate on the Job with the server's refusal, at
    each try (a try per sync here)."""
    fake, api, batch = jobs
    labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    api.create_namespace({"metadata": {"name": "locked", "labels": labels}})
    batch.create_namespaced_job("locked", job("train"))
    assert job_pods(fake, "train") == []
    refusals = fake.events("locked")
    assert refusals
    for refused in refusals:
        assert (refused["type"], refused["reason"]) == ("Warning", "FailedCreate")
        assert (refused["involvedObject"]["kind"], refused["involvedObject"]["name"]) == (
            "Job",
            "train",
        )
        assert refused["message"].startswith('Error creating: pods "train-')
        assert 'is forbidden: violates PodSecurity "restricted:latest"' in refused["message"]


def test_a_job_created_suspended_makes_no_pods_until_resumed(jobs):
    fake, _, batch = jobs
    batch.create_namespaced_job(NS, job("train", suspend=True))
    assert job_pods(fake, "train") == []
    conditions = batch.read_namespaced_job("train", NS).status.conditions
    assert [(c.type, c.status) for c in conditions] == [("Suspended", "True")]
    batch.patch_namespaced_job("train", NS, {"spec": {"suspend": False}})
    assert len(job_pods(fake, "train")) == 1


# --- custom resources (the operators' kinds: fake_generic.CUSTOM_KINDS) ----------------------
# apiextensions-apiserver: a CR is stored unstructured, checked against its CRD's structural
# schema (pkg/apiserver/schema, validation), its status left to the status subresource
# (pkg/registry/customresource/strategy.go), merge and JSON patches only (no strategic merge).
PYTORCH = ("kubeflow.org", "v1", NS, "pytorchjobs")


def pytorch_job(name: str = "bert", **spec) -> dict:
    replica = {"replicas": 2, "template": {"spec": {"containers": [{"name": "m", "image": "x"}]}}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name},
        "spec": {"pytorchReplicaSpecs": {"Worker": replica}, **spec},
    }


@pytest.fixture
def objects(fake, api_client):
    return k8s.CustomObjectsApi(api_client)


def test_a_custom_kind_without_its_crd_is_not_found_without_details(fake, objects):
    """A server without the CRD has no such resource: 404, "could not find the requested
    resource", no details; with it, a missing object's 404 names it (details.name)."""
    with pytest.raises(ApiException) as err:
        objects.get_namespaced_custom_object(*PYTORCH, "bert")
    body = json.loads(err.value.body)
    assert (err.value.status, body.get("details")) == (404, None)
    assert "could not find the requested resource" in body["message"]
    fake.install_crds(("kubeflow.org/v1", "pytorchjobs"))
    with pytest.raises(ApiException) as err:
        objects.get_namespaced_custom_object(*PYTORCH, "bert")
    details = json.loads(err.value.body)["details"]
    assert details == {"name": "bert", "group": "kubeflow.org", "kind": "pytorchjobs"}


def test_a_custom_resource_gets_metadata_and_a_generation_and_no_status_from_its_create(
    fake, objects
):
    fake.install_crds()
    made = objects.create_namespaced_custom_object(
        *PYTORCH, {**pytorch_job(), "status": {"conditions": [{"type": "Succeeded"}]}}
    )
    meta = made["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and meta["resourceVersion"]
    assert (meta["generation"], meta["namespace"]) == (1, NS)
    assert "status" not in made


def test_a_custom_resource_must_name_its_kind(fake, objects):
    fake.install_crds()
    body = pytorch_job()
    del body["kind"]
    status, message = refusal(objects.create_namespaced_custom_object, *PYTORCH, body)
    assert status == 400 and message.startswith("Object 'Kind' is missing in")


def test_a_custom_resource_is_checked_against_its_schema(fake, objects):
    fake.install_crds()
    body = pytorch_job()
    body["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "2"
    status, message = refusal(objects.create_namespaced_custom_object, *PYTORCH, body)
    assert status == 422
    assert "spec.pytorchReplicaSpecs.Worker.replicas in body must be of type integer" in message
    body = pytorch_job()
    del body["spec"]["pytorchReplicaSpecs"]
    status, message = refusal(objects.create_namespaced_custom_object, *PYTORCH, body)
    assert (status, message) == (422, "spec.pytorchReplicaSpecs: Required value")
    ray = ("ray.io", "v1", NS, "rayclusters")
    body = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "r"},
            "spec": {"workerGroupSpecs": []}}  # fmt: skip
    assert refusal(objects.create_namespaced_custom_object, *ray, body)[0] == 422


def test_a_custom_resources_spec_patch_is_a_new_generation_and_keeps_its_schema(fake, objects):
    fake.install_crds()
    objects.create_namespaced_custom_object(*PYTORCH, pytorch_job())
    labelled = objects.patch_namespaced_custom_object(
        *PYTORCH, "bert", {"metadata": {"labels": {"team": "a"}}}
    )
    assert labelled["metadata"]["generation"] == 1
    suspended = objects.patch_namespaced_custom_object(
        *PYTORCH, "bert", {"spec": {"runPolicy": {"suspend": True}}}
    )
    assert suspended["metadata"]["generation"] == 2
    assert suspended["spec"]["runPolicy"] == {"suspend": True}
    status, message = refusal(
        objects.patch_namespaced_custom_object,
        *PYTORCH,
        "bert",
        {"spec": {"runPolicy": {"suspend": "yes"}}},
    )
    assert status == 422 and "must be of type boolean" in message


def test_a_custom_resource_takes_no_strategic_merge_patch(fake, objects, api_client):
    fake.install_crds()
    objects.create_namespaced_custom_object(*PYTORCH, pytorch_job())
    with pytest.raises(ApiException) as err:
        api_client.call_api(
            f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs/bert",
            "PATCH",
            header_params={"Content-Type": "application/strategic-merge-patch+json"},
            body={"spec": {"runPolicy": {"suspend": True}}},
            _preload_content=False,
        )
    assert err.value.status == 415


def test_a_cronjob_needs_a_schedule_and_gets_the_real_defaults(api_client):
    batch = k8s.BatchV1Api(api_client)
    template = {"spec": {"template": {"spec": {
        "restartPolicy": "Never", "containers": [{"name": "m", "image": "x"}]}}}}  # fmt: skip
    body = {"metadata": {"name": "nightly"}, "spec": {"jobTemplate": template}}
    status, message = refusal(batch.create_namespaced_cron_job, NS, body)
    assert (status, message) == (422, "spec.schedule: Required value")
    body["spec"]["schedule"] = "0 3 * * *"
    spec = batch.create_namespaced_cron_job(NS, body).spec
    assert (spec.concurrency_policy, spec.suspend, spec.successful_jobs_history_limit) == (
        "Allow",
        False,
        3,
    )
    template["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    body["metadata"]["name"] = "always"
    status, message = refusal(batch.create_namespaced_cron_job, NS, body)
    assert status == 422 and message.startswith("spec.jobTemplate.spec.template.spec.restartPolicy")


def test_a_dry_run_create_of_any_kind_is_checked_and_answered_but_not_stored(fake, objects):
    """dryRun=All (apiserver handlers/create.go: the same validation and admission, the
    storage's dry-run skips the write; a name taken is still 409); any other value is 422
    (ValidateCreateOptions). A kind the server does not serve is its 404 without details,
    dry run or not."""
    apps = ("apps", "v1", NS, "deployments")
    body = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {
                "metadata": {"labels": {"app": "other"}},
                "spec": {"containers": [{"name": "m", "image": "x"}]}}}}  # fmt: skip
    status, message = refusal(objects.create_namespaced_custom_object, *apps, body, dry_run="All")
    assert status == 422 and "selector" in message  # it does not select its own pods
    body["spec"]["template"]["metadata"]["labels"] = {"app": "web"}
    answer = objects.create_namespaced_custom_object(*apps, body, dry_run="All")
    assert (answer["kind"], answer["metadata"]["name"]) == ("Deployment", "web")
    assert fake.objects["apps/v1/deployments"] == {}
    objects.create_namespaced_custom_object(*apps, body)
    status, _ = refusal(objects.create_namespaced_custom_object, *apps, body, dry_run="All")
    assert status == 409
    status, message = refusal(objects.create_namespaced_custom_object, *apps, body, dry_run="x")
    assert status == 422
    assert message == (
        'CreateOptions.meta.k8s.io "" is invalid: dryRun: Unsupported value: []string{"x"}: '
        'supported values: "All"'
    )
    status, _ = refusal(
        objects.create_namespaced_custom_object, *PYTORCH, pytorch_job(), dry_run="All"
    )
    assert status == 404
    fake.install_crds()
    objects.create_namespaced_custom_object(*PYTORCH, pytorch_job(), dry_run="All")
    assert fake.objects["kubeflow.org/v1/pytorchjobs"] == {}
