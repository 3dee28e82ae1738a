"""deploy/: the Kubernetes manifests that install GPUPool itself.

They are rendered by a small kustomize (the subset the manifests use: resources, namespace,
labels, patches by path, images), checked against `kubectl kustomize` where a kubectl with
kustomize v5 is installed, validated against the Kubernetes OpenAPI schemas
(kubernetes-validate, strict: unknown fields fail) and created in the in-suite API server
through the official client, as `kubectl create` would.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import dj_database_url
import kubernetes_validate
import pytest
import yaml
from cryptography.fernet import Fernet
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException
from kubernetes.utils import create_from_dict

from clusters.agent.main import parse_args as agent_args
from clusters.backends.kubernetes import KubernetesBackend
from tests.clusters.fake_apiserver import FakeApiServer

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
TRIAL, PRODUCTION = DEPLOY / "overlays" / "trial", DEPLOY / "overlays" / "production"
SCHEMA_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())  # oldest supported, newest
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass"}
KUSTOMIZATION_FIELDS = {
    "apiVersion",
    "kind",
    "resources",
    "namespace",
    "labels",
    "patches",
    "images",
}
# Made at install time, not by the manifests: by the trial's Job or the admin (docs/deploy.md).
MADE_AT_INSTALL = {"gpupool-secrets", "gpupool-agent-tokens"}
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


# --- the kustomize subset -------------------------------------------------------------------
def render(folder: Path) -> list[dict]:
    """1. load the resources (files, or folders with a kustomization); 2. the namespace;
    3. the labels; 4. the patches; 5. the images. Anything outside this subset is refused."""
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(spec) - KUSTOMIZATION_FIELDS
    assert not unknown, f"{folder}: kustomize fields outside the tested subset: {unknown}"
    # kustomize orders namespace and patches in ways this subset does not model: not both.
    assert not ("namespace" in spec and "patches" in spec), folder
    objects: list[dict] = []
    for entry in spec.get("resources", []):
        path = folder / entry
        objects += render(path) if path.is_dir() else _documents(path)
    if "namespace" in spec:
        _set_namespace(objects, spec["namespace"])
    for group in spec.get("labels", []):
        assert set(group) == {"pairs"}, f"{folder}: only plain label pairs are in the subset"
        for obj in objects:
            obj["metadata"].setdefault("labels", {}).update(group["pairs"])
    for patch in spec.get("patches", []):
        assert set(patch) == {"path"}, f"{folder}: only patches by path are in the subset"
        for document in _documents(folder / patch["path"]):
            _merge(_target(objects, document), document)
    for image in spec.get("images", []):
        _set_image(objects, image)
    return objects


def _documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _set_namespace(objects: list[dict], namespace: str) -> None:
    """kustomize's namespace: every namespaced object's, and the name of the Namespace."""
    for obj in objects:
        if obj["kind"] == "Namespace":
            obj["metadata"]["name"] = namespace
        elif obj["kind"] not in CLUSTER_SCOPED:
            obj["metadata"]["namespace"] = namespace
    assert sum(obj["kind"] == "Namespace" for obj in objects) <= 1


def _key(obj: dict) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"]


def _target(objects: list[dict], patch: dict) -> dict:
    found = [obj for obj in objects if _key(obj) == _key(patch)]
    assert len(found) == 1, f"the patch {_key(patch)} matches {len(found)} objects"
    return found[0]


def _merge(obj: dict, patch: dict) -> None:
    """A strategic merge patch of maps only: lists merge by keys this subset does not model."""
    for key, value in patch.items():
        assert not isinstance(value, list), f"a list in a patch ({key}) is outside the subset"
        if isinstance(value, dict) and isinstance(obj.get(key), dict):
            _merge(obj[key], value)
        else:
            obj[key] = copy.deepcopy(value)


def pod_specs(obj: dict) -> list[dict]:
    template = (obj.get("spec") or {}).get("template")
    return [template["spec"]] if template else []


def containers(obj: dict) -> list[dict]:
    return [
        c for spec in pod_specs(obj) for c in spec.get("initContainers", []) + spec["containers"]
    ]


def _set_image(objects: list[dict], image: dict) -> None:
    assert set(image) == {"name", "newName", "newTag"}, image
    for obj in objects:
        for container in containers(obj):
            if re.fullmatch(rf"{re.escape(image['name'])}([:@].*)?", container["image"]):
                container["image"] = f"{image['newName']}:{image['newTag']}"


# --- rendered once per module -----------------------------------------------------------------
@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {
        "deploy": render(DEPLOY),
        "trial": render(TRIAL),
        "production": render(PRODUCTION),
    }


def by_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == kind}


def test_deploy_renders_the_trial_by_default(rendered):
    assert rendered["deploy"] == rendered["trial"]
    assert "gpupool-postgres" in by_kind(rendered["trial"], "StatefulSet")
    assert not by_kind(rendered["production"], "StatefulSet")


def test_both_setups_have_gpupools_processes(rendered):
    for objects in (rendered["trial"], rendered["production"]):
        names = {(obj["kind"], obj["metadata"]["name"]) for obj in objects}
        assert {
            ("Namespace", "gpupool"),
            ("Namespace", "gpupool-agent"),
            ("ServiceAccount", "gpupool"),
            ("ClusterRole", "gpupool-controller"),
            ("ClusterRole", "gpupool-manifests"),
            ("ClusterRoleBinding", "gpupool-controller"),
            ("PriorityClass", "gpupool-reservation"),
            ("ConfigMap", "gpupool-config"),
            ("Deployment", "gpupool-portal"),
            ("Service", "gpupool-portal"),
            ("Deployment", "gpupool-worker"),
            ("Deployment", "gpupool-beat"),
            ("Job", "gpupool-migrate"),
            ("DaemonSet", "gpupool-agent"),
        } <= names


def _kubectl_kustomize_v5() -> str | None:
    kubectl = shutil.which("kubectl")
    if not kubectl:
        return None
    out = subprocess.run(
        [kubectl, "version", "--client"], capture_output=True, text=True, check=False
    ).stdout
    match = re.search(r"Kustomize Version: v(\d+)", out)
    return kubectl if match and int(match.group(1)) >= 5 else None


@pytest.mark.parametrize("folder", [DEPLOY, TRIAL, PRODUCTION], ids=["deploy", "trial", "prod"])
def test_the_subset_renders_what_kubectl_kustomize_renders(folder):
    kubectl = _kubectl_kustomize_v5()
    if kubectl is None:
        pytest.skip("no kubectl with kustomize v5 here; the subset renderer stands alone")
    out = subprocess.run(
        [kubectl, "kustomize", str(folder)], capture_output=True, text=True, check=True
    ).stdout
    theirs = sorted((d for d in yaml.safe_load_all(out) if d), key=_key)
    assert sorted(render(folder), key=_key) == theirs


def test_the_renderer_refuses_what_is_outside_its_subset(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: []\ncommonLabels: {a: b}\n")
    with pytest.raises(AssertionError, match="outside the tested subset"):
        render(tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "resources: [cm.yaml]\npatches: [{path: p.yaml}]\n"
    )
    (tmp_path / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n")
    (tmp_path / "p.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\nitems: [1]\n"
    )
    with pytest.raises(AssertionError, match="a list in a patch"):
        render(tmp_path)


# --- the schema -------------------------------------------------------------------------------
@pytest.mark.parametrize("setup", ["trial", "production"])
@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_every_object_is_valid_against_the_kubernetes_openapi_schema(rendered, setup, version):
    for obj in rendered[setup]:
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_schema_check_catches_a_misspelt_field(rendered):
    portal = copy.deepcopy(by_kind(rendered["trial"], "Deployment")["gpupool-portal"])
    portal["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(portal, SCHEMA_VERSIONS[-1], strict=True)


# --- the in-suite API server accepts them ---------------------------------------------------
def apply(api: FakeApiServer, objects: list[dict]) -> k8s.ApiClient:
    """Namespaces first, then the rest in their order, as `kubectl apply` does."""
    api_client = k8s_config.new_client_from_config_dict(api.kubeconfig())
    ordered = sorted(objects, key=lambda obj: obj["kind"] != "Namespace")
    for obj in ordered:
        namespace = obj["metadata"].get("namespace", "default")
        create_from_dict(api_client, copy.deepcopy(obj), namespace=namespace)
    return api_client


def read_back(api_client: k8s.ApiClient, obj: dict) -> dict:
    """GET the object at its REST path, as `kubectl get` would."""
    group = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
    kind = obj["kind"].lower()
    plural = (
        kind[:-1] + "ies" if kind.endswith("y") else kind + ("es" if kind.endswith("s") else "s")
    )
    namespace = obj["metadata"].get("namespace")
    scope = f"/namespaces/{namespace}" if namespace else ""
    path = f"{group}{scope}/{plural}/{obj['metadata']['name']}"
    response = api_client.call_api(
        path, "GET", _preload_content=False, auth_settings=["BearerToken"]
    )
    return json.loads(response[0].data)


@pytest.mark.parametrize("setup", ["trial", "production"])
def test_the_api_server_accepts_every_object(rendered, setup):
    with FakeApiServer() as api:
        api_client = apply(api, rendered[setup])
        for obj in rendered[setup]:
            stored = read_back(api_client, obj)
            assert _key(stored) == _key(obj)
            assert stored["metadata"]["uid"] and stored["metadata"]["resourceVersion"]
            assert stored["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpupool"
        # Applying the same objects again is refused: they exist (kubectl apply patches them).
        with pytest.raises(Exception, match="AlreadyExists"):
            apply(api, by_kind(rendered[setup], "ConfigMap").values())


def test_the_trial_makes_its_secrets_once_and_keeps_them(rendered, tmp_path):
    script = by_kind(rendered["trial"], "ConfigMap")["gpupool-make-secrets"]["data"]
    (tmp_path / "make_secrets.py").write_text(script["make_secrets.py"])
    with FakeApiServer() as api:
        api_client = apply(api, rendered["trial"])
        (tmp_path / "kubeconfig").write_text(json.dumps(api.kubeconfig()))
        env = {**os.environ, "KUBECONFIG": str(tmp_path / "kubeconfig"), "POD_NAMESPACE": "gpupool"}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        run = [sys.executable, str(tmp_path / "make_secrets.py")]
        first = subprocess.run(run, env=env, capture_output=True, text=True, check=False)
        assert first.returncode == 0, first.stderr
        secret = k8s.CoreV1Api(api_client).read_namespaced_secret("gpupool-secrets", "gpupool")
        second = subprocess.run(run, env=env, capture_output=True, text=True, check=True)
        again = k8s.CoreV1Api(api_client).read_namespaced_secret("gpupool-secrets", "gpupool")
    assert first.stdout.strip() == "gpupool/gpupool-secrets created"
    assert second.stdout.strip() == "gpupool/gpupool-secrets exists: kept as it is"
    assert again.data == secret.data
    values = {k: base64.b64decode(v).decode() for k, v in secret.data.items()}
    assert set(values) == secret_keys_used(rendered["trial"]) | {"POSTGRES_PASSWORD"} | {
        "SECRET_KEY", "DATABASE_URL", "REDIS_URL", "GPUPOOL_KUBECONFIG_KEY", "GPUPOOL_METRICS_TOKEN"
    }  # fmt: skip
    database = dj_database_url.parse(values["DATABASE_URL"])
    assert (database["HOST"], database["PORT"], database["NAME"]) == (
        "gpupool-postgres",
        5432,
        "gpupool",
    )
    assert database["PASSWORD"] == values["POSTGRES_PASSWORD"]
    assert values["REDIS_URL"] == f"redis://:{values['REDIS_PASSWORD']}@gpupool-redis:6379/0"
    Fernet(values["GPUPOOL_KUBECONFIG_KEY"].encode())  # a usable key
    assert len(values["SECRET_KEY"]) >= 50


def secret_keys_used(objects: list[dict]) -> set[str]:
    return {
        env["valueFrom"]["secretKeyRef"]["key"]
        for obj in objects
        for container in containers(obj)
        for env in container.get("env", [])
        if "secretKeyRef" in env.get("valueFrom", {})
    }


# --- what the objects must say ----------------------------------------------------------------
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip


def restricted_violations(spec: dict) -> list[str]:
    """What the `restricted` Pod Security level (v1.29+) refuses in a pod spec."""
    pod = spec.get("securityContext") or {}
    found = [f"{host}" for host in ("hostPID", "hostIPC", "hostNetwork") if spec.get(host)]
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']}: {sorted(kinds)}")
    for c in spec.get("initContainers", []) + spec["containers"]:
        ctx = c.get("securityContext") or {}
        caps = ctx.get("capabilities") or {}
        if ctx.get("privileged") or ctx.get("allowPrivilegeEscalation") is not False:
            found.append(f"{c['name']}: privilege escalation is not off")
        if "ALL" not in caps.get("drop", []) or set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{c['name']}: capabilities")
        if not ctx.get("runAsNonRoot", pod.get("runAsNonRoot")):
            found.append(f"{c['name']}: runAsNonRoot")
        if ctx.get("runAsUser", pod.get("runAsUser")) == 0:
            found.append(f"{c['name']}: runAsUser 0")
        seccomp = (ctx.get("seccompProfile") or pod.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{c['name']}: seccomp {seccomp}")
        if any(port.get("hostPort") for port in c.get("ports", [])):
            found.append(f"{c['name']}: hostPort")
    return found


@pytest.mark.parametrize("setup", ["trial", "production"])
def test_every_pod_in_the_gpupool_namespace_meets_the_restricted_level(rendered, setup):
    namespace = by_kind(rendered[setup], "Namespace")["gpupool"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    checked = 0
    for obj in rendered[setup]:
        if obj["metadata"].get("namespace") == "gpupool":
            for spec in pod_specs(obj):
                assert restricted_violations(spec) == [], obj["metadata"]["name"]
                checked += 1
    assert checked >= 4  # portal, worker, beat, migrations (+ the trial's)
    for c in (c for obj in rendered[setup] for c in containers(obj)):
        assert c["securityContext"]["readOnlyRootFilesystem"] is True, c["name"]
        assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]


def test_the_agent_is_outside_the_restricted_namespace_because_it_needs_the_host(rendered):
    agent = by_kind(rendered["trial"], "DaemonSet")["gpupool-agent"]
    assert agent["metadata"]["namespace"] == "gpupool-agent"
    assert restricted_violations(pod_specs(agent)[0]) == [
        "hostPID", "hostIPC", "volume spool: ['hostPath']", "volume mps: ['hostPath']",
        "agent: capabilities", "agent: runAsNonRoot", "agent: runAsUser 0",
    ]  # fmt: skip
    ns = by_kind(rendered["trial"], "Namespace")["gpupool-agent"]["metadata"]["labels"]
    assert ns["pod-security.kubernetes.io/enforce"] == "privileged"


def test_the_agent_runs_on_gpu_nodes_with_nvml_and_its_nodes_token(rendered):
    agent = by_kind(rendered["production"], "DaemonSet")["gpupool-agent"]
    spec = pod_specs(agent)[0]
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    gpu_present = {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
    assert term["nodeSelectorTerms"] == [{"matchExpressions": [gpu_present]}]
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"  # MPS binaries too
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "nvidia.com/gpu" not in str(container["resources"])  # it takes no GPU
    assert container["args"][:3] == ["python", "-m", "clusters.agent"]
    args = agent_args([a.replace("$(NODE_NAME)", "gpu-7") for a in container["args"][3:]])
    assert args.portal == "http://gpupool-portal.gpupool.svc:8000"
    assert args.token_file == "/etc/gpupool/tokens/gpu-7"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts["/etc/gpupool/tokens"]]["secret"]["secretName"] == "gpupool-agent-tokens"
    assert Path(args.spool).parent.as_posix() in mounts
    config = by_kind(rendered["production"], "ConfigMap")["gpupool-config"]["data"]
    assert "gpupool-portal.gpupool.svc" in config["ALLOWED_HOSTS"].split(",")


def test_beat_is_one_replica_that_is_stopped_before_its_successor_starts(rendered):
    for setup in ("trial", "production"):
        beat = by_kind(rendered[setup], "Deployment")["gpupool-beat"]
        assert beat["spec"]["replicas"] == 1
        assert beat["spec"]["strategy"] == {"type": "Recreate"}
    deployments = by_kind(rendered["production"], "Deployment")
    assert deployments["gpupool-portal"]["spec"]["replicas"] == 2


def _entrypoint_commands() -> set[str]:
    text = (ROOT / "scripts" / "docker-entrypoint.sh").read_text()
    return set(re.findall(r"^\s+([a-z-]+)\)", text, re.MULTILINE))


def test_gpupool_containers_run_entrypoint_commands_and_wait_for_migrations(rendered):
    commands = _entrypoint_commands()
    assert {"web", "worker", "beat", "migrate", "wait-for-migrations"} <= commands
    for obj in rendered["trial"]:
        for c in containers(obj):
            if c["image"].startswith("gpupool:"):
                assert c["args"][0] in commands | {"python"}, c["name"]
    for name in ("gpupool-portal", "gpupool-worker", "gpupool-beat"):
        spec = pod_specs(by_kind(rendered["trial"], "Deployment")[name])[0]
        assert [c["args"] for c in spec["initContainers"]] == [["wait-for-migrations"]]
    config = by_kind(rendered["trial"], "ConfigMap")["gpupool-config"]["data"]
    assert config["GPUPOOL_MIGRATE_ON_START"] == "0"  # the Job migrates, not each portal


def test_every_reference_resolves(rendered):
    """ConfigMaps, Secrets, ServiceAccounts and Services name objects that exist (or are
    made at install time), and every Service selects a pod template of its namespace."""
    for objects in (rendered["trial"], rendered["production"]):
        names = {
            (obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])
            for obj in objects
        }
        for obj in objects:
            ns = obj["metadata"].get("namespace")
            for spec in pod_specs(obj):
                if "serviceAccountName" in spec:
                    assert ("ServiceAccount", ns, spec["serviceAccountName"]) in names
                for volume in spec.get("volumes", []):
                    if "configMap" in volume:
                        assert ("ConfigMap", ns, volume["configMap"]["name"]) in names
                    if "secret" in volume:
                        assert volume["secret"]["secretName"] in MADE_AT_INSTALL
            for c in containers(obj):
                for source in c.get("envFrom", []):
                    if "configMapRef" in source:
                        assert ("ConfigMap", ns, source["configMapRef"]["name"]) in names
                    else:
                        assert source["secretRef"]["name"] in MADE_AT_INSTALL
            if obj["kind"] == "Service":
                selector = obj["spec"]["selector"].items()
                assert any(
                    selector <= (o["spec"]["template"]["metadata"]["labels"]).items()
                    for o in objects
                    if pod_specs(o) and o["metadata"].get("namespace") == ns
                ), obj["metadata"]["name"]


def _settings_variables() -> set[str]:
    """Every variable the settings read: env_*("NAME" ...) in portal/ and clusters/."""
    names = set()
    for path in [*ROOT.glob("portal/*.py"), *ROOT.glob("clusters/**/conf.py")]:
        names |= set(re.findall(r"env_[a-z]+\(\s*\"([A-Z0-9_]+)\"", path.read_text()))
    return names


def test_the_config_map_names_every_setting(rendered):
    """A setting is set in the ConfigMap, named in its comments (left at its default or in
    the Secret), or set by the image; a new setting must be added to deploy/base/config.yaml."""
    documented = (DEPLOY / "base" / "config.yaml").read_text() + (ROOT / "Dockerfile").read_text()
    variables = _settings_variables()
    assert {"DEBUG", "SECRET_KEY", "DATABASE_URL", "GPUPOOL_METRICS_IDLE_PCT"} <= variables
    missing = {name for name in variables if not re.search(rf"\b{name}\b", documented)} - {
        "CELERY_TASK_ALWAYS_EAGER"
    }  # tests only
    assert missing == set()


# --- registering the cluster GPUPool runs in ------------------------------------------------
def test_the_in_cluster_kubeconfig_authenticates_with_the_pods_service_account_token(tmp_path):
    kubeconfig = yaml.safe_load((DEPLOY / "in-cluster-kubeconfig.yaml").read_text())
    cluster, user = kubeconfig["clusters"][0]["cluster"], kubeconfig["users"][0]["user"]
    assert cluster["server"] == "https://kubernetes.default.svc"
    assert cluster["certificate-authority"] == f"{SA_DIR}/ca.crt"
    assert user == {"tokenFile": f"{SA_DIR}/token"}
    # The same kubeconfig with the mounted files placed here and the fake server's address.
    (tmp_path / "token").write_text("rotated-service-account-token")  # as the kubelet writes it
    user["tokenFile"] = str(tmp_path / "token")
    with FakeApiServer() as api:
        cluster["server"] = api.url
        del cluster["certificate-authority"]  # plain http here
        api.add_node("gpu-1", gpus=8)
        backend = KubernetesBackend(SimpleNamespace(name="here", config={}), kubeconfig=kubeconfig)
        assert backend.test_connection() == "Kubernetes v1.31.0-gpupool-fake: 1 nodes"
        headers = backend.api.api_client.configuration.api_key
        assert headers["authorization"] == "Bearer rotated-service-account-token"


# --- the API server's added kinds hold the line ----------------------------------------------
def _deployment(**changes) -> dict:
    obj = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx"}]},
            },
        },
    }
    for path, value in changes.items():
        target = obj
        *parents, last = path.split(".")
        for part in parents:
            target = target[part]
        target[last] = value
    return obj


@pytest.fixture
def apps():
    with FakeApiServer() as api:
        api_client = k8s_config.new_client_from_config_dict(api.kubeconfig())
        k8s.CoreV1Api(api_client).create_namespace({"metadata": {"name": "team"}})
        yield api, api_client


@pytest.mark.parametrize(
    ("changes", "status", "message"),
    [
        ({}, 201, ""),
        ({"spec.selector": {"matchLabels": {"app": "other"}}}, 422, "does not match"),
        ({"spec.selector": {}}, 422, "spec.selector: Required value"),
        ({"metadata.name": "Web_1"}, 422, "metadata.name: Invalid value"),
        ({"metadata.labels": {"app": "x" * 64}}, 422, "metadata.labels"),
        ({"spec.template.spec.containers": []}, 422, "spec.template.spec.containers"),
        ({"spec.template.spec.restartPolicy": "Never"}, 422, "restartPolicy"),
        ({"kind": "DaemonSet"}, 400, "not a apps/v1 Deployment"),
    ],
)
def test_the_api_server_refuses_a_deployment_the_real_one_refuses(apps, changes, status, message):
    api, api_client = apps
    body = _deployment(**changes)
    if status == 201:
        made = k8s.AppsV1Api(api_client).create_namespaced_deployment("team", body)
        assert made.metadata.uid and made.metadata.generation == 1
        assert made.metadata.namespace == "team"
        return
    with pytest.raises(ApiException) as caught:
        k8s.AppsV1Api(api_client).create_namespaced_deployment("team", body)
    assert caught.value.status == status
    assert message in json.loads(caught.value.body)["message"]


def test_the_api_server_refuses_unknown_namespaces_and_duplicates(apps):
    _, api_client = apps
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "c"}}
    core = k8s.CoreV1Api(api_client)
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_secret("nowhere", secret)
    assert caught.value.status == 404
    core.create_namespaced_secret("team", secret)
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_secret("team", secret)
    assert caught.value.status == 409
    bad_key = {**secret, "metadata": {"name": "d"}, "stringData": {"bad key": "x"}}
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_secret("team", bad_key)
    assert caught.value.status == 422
    assert [c.metadata.name for c in core.list_namespaced_secret("team").items] == ["c"]


def test_the_api_server_adds_what_the_real_one_adds(apps):
    _, api_client = apps
    core, batch = k8s.CoreV1Api(api_client), k8s.BatchV1Api(api_client)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
              "stringData": {"PASSWORD": "hunter2"}}  # fmt: skip
    made = core.create_namespaced_secret("team", secret)
    assert made.data == {"PASSWORD": base64.b64encode(b"hunter2").decode()}
    assert made.string_data is None and made.type == "Opaque"
    job = _deployment()
    job.update(apiVersion="batch/v1", kind="Job")
    del job["spec"]["selector"]
    job["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    made_job = batch.create_namespaced_job("team", job)
    (uid_label,) = made_job.spec.selector.match_labels.items()
    assert uid_label[0] == "batch.kubernetes.io/controller-uid"
    assert made_job.spec.template.metadata.labels[uid_label[0]] == uid_label[1]


def test_the_api_server_refuses_a_cluster_role_binding_to_a_service_account_without_namespace(apps):
    _, api_client = apps
    rbac = k8s.RbacAuthorizationV1Api(api_client)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "b"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "r"},
        "subjects": [{"kind": "ServiceAccount", "name": "gpupool"}],
    }
    with pytest.raises(ApiException) as caught:
        rbac.create_cluster_role_binding(binding)
    assert caught.value.status == 422 and "subjects[0].namespace" in caught.value.body
    binding["subjects"][0]["namespace"] = "team"
    assert rbac.create_cluster_role_binding(binding).metadata.uid
    assert rbac.read_cluster_role_binding("b").subjects[0].namespace == "team"


def test_the_image_user_is_the_numeric_user_the_pods_run_as(rendered):
    """runAsNonRoot can be checked only against a numeric USER."""
    (user,) = re.findall(r"^USER (\S+)$", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    deployments = by_kind(rendered["production"], "Deployment").values()
    assert {pod_specs(d)[0]["securityContext"]["runAsUser"] for d in deployments} == {10001}
    assert user == "10001:10001"


def test_the_guide_has_production_create_every_secret_the_trial_makes(rendered):
    guide = (ROOT / "docs" / "deploy.md").read_text()
    command = guide[guide.index("create secret generic gpupool-secrets") :].split("\n\n")[0]
    given = set(re.findall(r"--from-literal=([A-Z_]+)=", command))
    script = by_kind(rendered["trial"], "ConfigMap")["gpupool-make-secrets"]["data"]
    made = set(re.findall(r'^\s+"([A-Z_]+)": ', script["make_secrets.py"], re.MULTILINE))
    assert given == made - {"POSTGRES_PASSWORD", "REDIS_PASSWORD"}  # the trial's own servers
    assert len(given) == 5


def test_only_the_pods_that_hold_the_database_url_may_reach_the_trials_data(rendered):
    policy = by_kind(rendered["trial"], "NetworkPolicy")["gpupool-data"]["spec"]
    (guarded,) = policy["podSelector"]["matchExpressions"]
    (rule,) = policy["ingress"]
    ((allowed,),) = [peer["podSelector"]["matchExpressions"] for peer in rule["from"]]
    components = {}
    for obj in (o for o in rendered["trial"] if pod_specs(o)):
        labels = obj["spec"]["template"]["metadata"]["labels"]
        refs = [
            s.get("secretRef", {}).get("name")
            for c in containers(obj)
            for s in c.get("envFrom", [])
        ]
        components[labels["app.kubernetes.io/component"]] = "gpupool-secrets" in refs
    assert set(guarded["values"]) == {"postgres", "redis"} <= set(components)
    assert set(allowed["values"]) == {name for name, uses in components.items() if uses}


def test_the_agent_runs_the_mps_daemons_where_the_sharing_pods_find_their_pipes(rendered):
    """The agent's --mps-root is the host folder the sharing pods mount their GPU's pipe
    from (clusters.backends.kubernetes.manifests.MPS_ROOT), shares the host's IPC namespace
    as the pods do, and may start MPS servers as their users (SETUID/SETGID), nothing more."""
    from clusters.backends.kubernetes.manifests import MPS_ROOT

    agent = by_kind(rendered["production"], "DaemonSet")["gpupool-agent"]
    spec = pod_specs(agent)[0]
    (container,) = spec["containers"]
    args = agent_args([a.replace("$(NODE_NAME)", "gpu-7") for a in container["args"][3:]])
    assert args.mps_root == MPS_ROOT
    assert spec["hostIPC"] is True
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts[MPS_ROOT]]["hostPath"] == {"path": MPS_ROOT, "type": "DirectoryOrCreate"}
    caps = container["securityContext"]["capabilities"]
    assert caps == {"drop": ["ALL"], "add": ["SETUID", "SETGID"]}


def test_the_agent_reads_its_own_node_for_mig_with_a_role_that_only_gets_nodes(rendered):
    """Its service account is mounted (the API server's token, rotated by the kubelet) and
    bound to a ClusterRole of one rule: get nodes. --mig-node is its own node's name."""
    agent = by_kind(rendered["production"], "DaemonSet")["gpupool-agent"]
    spec = pod_specs(agent)[0]
    namespace = agent["metadata"]["namespace"]
    assert spec["automountServiceAccountToken"] is True
    account = by_kind(rendered["production"], "ServiceAccount")[spec["serviceAccountName"]]
    assert account["metadata"]["namespace"] == namespace
    role = by_kind(rendered["production"], "ClusterRole")["gpupool-agent"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    binding = by_kind(rendered["production"], "ClusterRoleBinding")["gpupool-agent"]
    assert binding["roleRef"]["name"] == "gpupool-agent"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": spec["serviceAccountName"], "namespace": namespace}
    ]
    (container,) = spec["containers"]
    args = agent_args([a.replace("$(NODE_NAME)", "gpu-7") for a in container["args"][3:]])
    assert args.mig_node == "gpu-7"
    assert args.kube_token_file == f"{SA_DIR}/token"
    controller = by_kind(rendered["production"], "ClusterRole")["gpupool-controller"]
    node_rules = [r for r in controller["rules"] if r["resources"] == ["nodes"]]
    assert node_rules == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "patch"]}]
