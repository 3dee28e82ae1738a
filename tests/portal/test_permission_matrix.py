"""Every organisation page against the four personas and an anonymous visitor.

200 = may open it; 403 = an admin page they may not open; 404 = something outside their view
(projects of other departments stay unnamed); 405 = the page only takes POST.
"""

from __future__ import annotations

import re
import secrets
from types import SimpleNamespace

import pytest
from cryptography.fernet import Fernet
from django.conf import settings
from django.db import transaction
from django.test import override_settings
from django.urls import URLPattern, URLResolver, get_resolver

from clusters.crypto import kubeconfig_encrypt
from clusters.metrics.services import node_token_issue
from clusters.models import Backend, Cluster, Node, NodePool
from portal import org_urls, services
from portal.models import Department, DepartmentQuota, Project, ProjectQuota, User
from portal.tokens import api_token_issue
from scheduling.models import Workload, WorkloadKind, WorkloadPolicy, WorkloadState
from tests import factories as f
from tests.workspaces.helpers import make_running_workspace
from workspaces.models import Environment, Workspace

ANON = "anonymous"
ORDER = ("platform_admin", "dept_admin", "researcher", "outsider")


def row(admin: int, dana: int, rita: int, otto: int) -> dict[str, int]:
    return dict(zip(ORDER, (admin, dana, rita, otto), strict=True))


def _membership(o) -> int:
    return _membership_of(o.researcher)


def _membership_of(user) -> int:
    return user.memberships.get().pk


# name -> (url builder over the `org` fixture, expected status per persona)
MATRIX = {
    "home": (lambda o: "/", row(200, 200, 200, 200)),
    "home_live": (lambda o: "/home/fragment/", row(200, 200, 200, 200)),
    "department_list": (lambda o: "/departments/", row(200, 200, 403, 403)),
    "department_create": (lambda o: "/departments/new/", row(200, 403, 403, 403)),
    "department_edit": (lambda o: f"/departments/{o.dept_a.pk}/", row(200, 200, 403, 403)),
    "department_edit:other": (lambda o: f"/departments/{o.dept_b.pk}/", row(200, 404, 403, 403)),
    "department_quotas": (
        lambda o: f"/departments/{o.dept_a.pk}/quotas/",
        row(200, 403, 403, 403),
    ),
    "department_delete": (
        lambda o: f"/departments/{o.dept_a.pk}/delete/",
        row(200, 403, 403, 403),
    ),
    "project_list": (lambda o: "/projects/", row(200, 200, 200, 200)),
    "project_create": (lambda o: "/projects/new/", row(200, 200, 403, 403)),
    "project_detail": (lambda o: f"/projects/{o.project_a.pk}/", row(200, 200, 200, 404)),
    "project_detail:other": (lambda o: f"/projects/{o.project_b.pk}/", row(200, 404, 404, 200)),
    "project_edit": (lambda o: f"/projects/{o.project_a.pk}/edit/", row(200, 200, 403, 404)),
    "project_edit:other": (lambda o: f"/projects/{o.project_b.pk}/edit/", row(200, 404, 404, 403)),
    "project_quotas": (lambda o: f"/projects/{o.project_a.pk}/quotas/", row(200, 200, 403, 404)),
    "project_delete": (lambda o: f"/projects/{o.project_a.pk}/delete/", row(200, 200, 403, 404)),
    "node_pool_list": (lambda o: "/node-pools/", row(200, 403, 403, 403)),
    "node_pool_create": (lambda o: "/node-pools/new/", row(200, 403, 403, 403)),
    "node_pool_edit": (lambda o: f"/node-pools/{o.pool.pk}/", row(200, 403, 403, 403)),
    "user_list": (lambda o: "/users/", row(200, 200, 403, 403)),
    "user_invite": (lambda o: "/users/invite/", row(200, 200, 403, 403)),
    "user_edit": (lambda o: f"/users/{o.researcher.pk}/", row(200, 200, 403, 403)),
    "user_edit:other": (lambda o: f"/users/{o.outsider.pk}/", row(200, 404, 403, 403)),
    "user_edit:platform_admin": (
        lambda o: f"/users/{o.platform_admin.pk}/",
        row(200, 404, 403, 403),
    ),
    "membership_add": (
        lambda o: f"/users/{o.researcher.pk}/memberships/",
        row(405, 405, 403, 403),
    ),
    "membership_remove": (
        lambda o: f"/users/{o.researcher.pk}/memberships/{_membership(o)}/remove/",
        row(405, 405, 403, 403),
    ),
    "user_deactivate": (
        lambda o: f"/users/{o.researcher.pk}/deactivate/",
        row(200, 200, 403, 403),
    ),
    "user_deactivate:other": (
        lambda o: f"/users/{o.outsider.pk}/deactivate/",
        row(200, 404, 403, 403),
    ),
    "user_reactivate": (
        lambda o: f"/users/{o.researcher.pk}/reactivate/",
        row(405, 405, 403, 403),
    ),
    "audit_log": (lambda o: "/audit/", row(200, 200, 403, 403)),
    # Everyone's own profile (SSH keys); a key is removed by POST, and only its owner's.
    "profile": (lambda o: "/accounts/profile/", row(200, 200, 200, 200)),
    "ssh_key_delete": (lambda o: "/accounts/profile/ssh-keys/1/delete/", row(405, 405, 405, 405)),
}

CASES = [(name, persona) for name in MATRIX for persona in (*ORDER, ANON)]


def test_the_matrix_covers_every_organisation_page():
    named = {
        p.name for p in [*org_urls.organisation, *org_urls.people_urls] if isinstance(p, URLPattern)
    }
    assert named == {name.split(":")[0] for name in MATRIX}
    assert list(MORE_PAGES) == list(MATRIX)


@pytest.mark.parametrize(("name", "persona"), CASES, ids=[f"{n}-{p}" for n, p in CASES])
def test_each_page_answers_each_persona_as_the_matrix_says(client_as, org, name, persona):
    build, expected = MATRIX[name]
    url = build(org)
    response = client_as(None if persona == ANON else getattr(org, persona)).get(url)
    if persona == ANON:
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")
    else:
        assert response.status_code == expected[persona], f"{persona} GET {url}"


# The organisation pages for the viewer, the peer and the member of nothing (see MORE below).
MORE_PAGES = {
    "home": (200, 200, 200),
    "home_live": (200, 200, 200),
    "department_list": (403, 403, 403),
    "department_create": (403, 403, 403),
    "department_edit": (403, 403, 403),
    "department_edit:other": (403, 403, 403),
    "department_quotas": (403, 403, 403),
    "department_delete": (403, 403, 403),
    "project_list": (200, 200, 200),
    "project_create": (403, 403, 403),
    "project_detail": (200, 404, 404),
    "project_detail:other": (404, 404, 404),
    "project_edit": (403, 404, 404),
    "project_edit:other": (404, 404, 404),
    "project_quotas": (403, 404, 404),
    "project_delete": (403, 404, 404),
    "node_pool_list": (403, 403, 403),
    "node_pool_create": (403, 403, 403),
    "node_pool_edit": (403, 403, 403),
    "user_list": (403, 403, 403),
    "user_invite": (403, 403, 403),
    "user_edit": (403, 403, 403),
    "user_edit:other": (403, 403, 403),
    "user_edit:platform_admin": (403, 403, 403),
    "membership_add": (403, 403, 403),
    "membership_remove": (403, 403, 403),
    "user_deactivate": (403, 403, 403),
    "user_deactivate:other": (403, 403, 403),
    "user_reactivate": (403, 403, 403),
    "audit_log": (403, 403, 403),
    "profile": (200, 200, 200),
    "ssh_key_delete": (405, 405, 405),
}


@pytest.mark.parametrize("name", list(MATRIX))
def test_each_page_answers_the_viewer_the_peer_and_the_member_of_nothing(client_as, site, name):
    build, _ = MATRIX[name]
    url = build(site)
    answers = tuple(client_as(getattr(site, persona)).get(url).status_code for persona in MORE)
    assert answers == MORE_PAGES[name], f"{MORE} GET {url}"


def test_a_researcher_never_sees_another_departments_projects_anywhere(client_as, org):
    client = client_as(org.researcher)
    for url in ("/", "/projects/"):
        # Without the CSRF tokens: a random token may hold "nlp" (it did, once in CI).
        body = re.sub(r'value="[A-Za-z0-9]{32,}"', "", client.get(url).content.decode())
        assert "ml-vision" in body
        assert org.project_b.name not in body.replace("ml-vision", "")
        assert "gp-nlp" not in body


def test_a_department_admin_sees_only_their_departments_people_and_audit_rows(client_as, org):
    services.department_update(actor=org.platform_admin, department=org.dept_b, name="tongues")
    services.department_update(actor=org.platform_admin, department=org.dept_a, name="sight")
    client = client_as(org.dept_admin)
    users = client.get("/users/").content.decode()
    assert "rita" in users
    assert "otto" not in users
    audit = client.get("/audit/").content.decode()
    assert "sight" in audit
    assert "tongues" not in audit


# --- Every other URL of the site: the other apps' pages, the REST API, sign-in --------------
# The same four personas and the anonymous visitor, over GET, or POST for the URLs that take
# only POST (a GET there would answer 405 and say nothing about who may act). LOGIN: sent to
# the login page; 401: the API (or a token-only endpoint) refuses the unauthenticated request.
# ':other' rows use department B's workload or workspace, which department A's people never see.

LOGIN = "login"


def full(admin: int, dana: int, rita: int, otto: int, anonymous: int | str = LOGIN):
    return {**row(admin, dana, rita, otto), ANON: anonymous}


def same(status: int | str) -> dict[str, int | str]:
    return full(status, status, status, status, status)


@pytest.fixture
def site(org):
    """The org, plus work in both departments, a cluster and an environment."""
    workspace = make_running_workspace(owner=org.researcher, project=org.project_a)
    workspace_b = make_running_workspace(owner=org.outsider, project=org.project_b, name="lab-b")

    def job(project, user, name):
        return Workload.objects.create(
            project=project,
            submitted_by=user,
            kind=WorkloadKind.TRAINING,
            name=name,
            image="pytorch/pytorch:2.3",
            command=["python", "train.py"],
            state=WorkloadState.PENDING,
        )

    viewer, peer, nobody = f.make_user("vera"), f.make_user("pete"), f.make_user("nina")
    f.make_membership(viewer, role=f.Role.VIEWER, project=org.project_a)
    f.make_membership(peer, role=f.Role.RESEARCHER, project=org.project_a2)
    return SimpleNamespace(
        **vars(org),
        viewer=viewer,
        peer=peer,
        nobody=nobody,
        job=job(org.project_a, org.researcher, "resnet"),
        job_b=job(org.project_b, org.outsider, "bert"),
        ws=workspace.workload_id,
        ws_b=workspace_b.workload_id,
        cluster=Cluster.objects.get(name="local"),
        env=Environment.objects.create(name="Lab", image="lab", command=["jupyter", "lab"]),
        secrets=plant_secrets(org, workspace, workspace_b),
    )


def plant_secrets(org, *workspaces) -> dict[str, list[str]]:
    """Secrets of every kind, where the platform keeps them; no response may carry one.

    API tokens (plaintext and digest) for every persona, a node agent's token, a cluster's
    kubeconfig (plaintext and ciphertext), SECRET_KEY, and the workspaces' Jupyter tokens (kept
    server-side on the Workspace row only; the pod gets it at start).
    """
    planted: dict[str, list[str]] = {"secret key": [settings.SECRET_KEY], "api tokens": []}
    for user in User.objects.all():
        stored, token = api_token_issue(user=user)
        planted["api tokens"] += [token, stored.digest]
    with override_settings(GPUPOOL_KUBECONFIG_KEY=KUBECONFIG_KEY):
        kubeconfig = KUBECONFIG.replace("SECRET", secrets.token_hex(16))
        encrypted = kubeconfig_encrypt(kubeconfig)
    cluster = Cluster.objects.create(
        name="k8s-secret", backend=Backend.KUBERNETES, kubeconfig_encrypted=encrypted
    )
    node = Node.objects.create(cluster=cluster, name="gpu-secret-1")
    planted["kubeconfigs"] = [kubeconfig.split("token: ")[1].split("}")[0], encrypted]
    planted["node tokens"] = [node_token_issue(actor=org.platform_admin, node=node)[1]]
    planted["jupyter tokens"] = []
    for workspace in workspaces:
        workspace.token = secrets.token_hex(24)
        workspace.save(update_fields=["token"])
        planted["jupyter tokens"].append(workspace.token)
    return planted


def leaked(planted: dict[str, list[str]], response, *, skip: tuple[str, ...] = ()) -> list[str]:
    """The kinds of secret found in the response's body (streamed or not)."""
    body = b"".join(response.streaming_content) if response.streaming else response.content
    text = body.decode(errors="replace")
    return [
        kind
        for kind, values in planted.items()
        if kind not in skip and any(value in text for value in values)
    ]


KUBECONFIG_KEY = Fernet.generate_key().decode()
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://10.0.0.1:6443"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
users: [{name: u, user: {token: SECRET}}]
"""


GET, POST = "get", "post"
# name -> (method, url builder over the `site` fixture, expected status per persona)
SITE_MATRIX = {
    # Sign-in and password pages are open to everyone.
    "login": (GET, lambda o: "/accounts/login/", same(200)),
    "logout": (POST, lambda o: "/accounts/logout/", same(LOGIN)),  # signed out, to log in
    # Single sign-on is off in the tests: its start and callback are 404; its logout signs out.
    "oidc_authentication_init": (GET, lambda o: "/oidc/authenticate/", same(404)),
    "oidc_authentication_callback": (GET, lambda o: "/oidc/callback/", same(404)),
    "oidc_logout": (POST, lambda o: "/oidc/logout/", same(LOGIN)),
    "password_reset": (GET, lambda o: "/accounts/password-reset/", same(200)),
    "password_reset_done": (GET, lambda o: "/accounts/password-reset/sent/", same(200)),
    "password_reset_confirm": (GET, lambda o: "/accounts/reset/MQ/bad-token/", same(200)),
    "password_reset_complete": (GET, lambda o: "/accounts/reset/done/", same(200)),
    # Platform admins with their portal session; everyone else is sent to its sign-in.
    "admin:index": (GET, lambda o: "/django-admin/", full(200, 302, 302, 302, 302)),
    # throttled on POST; a platform admin already signed in goes on to the index
    "admin-login": (GET, lambda o: "/django-admin/login/", full(302, 200, 200, 200, 200)),
    # The API's description: for signed-in users.
    "api-schema": (GET, lambda o: "/api/schema/", full(200, 200, 200, 200, 401)),
    "api-docs": (GET, lambda o: "/api/docs/", full(200, 200, 200, 200, LOGIN)),
    # REST API, organisation.
    "api-token": (POST, lambda o: "/api/v1/auth/token", same(400)),  # no credentials given
    "api-me": (GET, lambda o: "/api/v1/users/me", full(200, 200, 200, 200, 401)),
    "api-ssh-keys": (GET, lambda o: "/api/v1/users/me/ssh-keys/", full(200, 200, 200, 200, 401)),
    # Only DELETE, of the caller's own keys (tests/portal/test_ssh_keys.py).
    "api-ssh-key": (GET, lambda o: "/api/v1/users/me/ssh-keys/1/", full(405, 405, 405, 405, 401)),
    "api-departments": (GET, lambda o: "/api/v1/departments/", full(200, 200, 200, 200, 401)),
    "api-department": (
        GET,
        lambda o: f"/api/v1/departments/{o.dept_a.pk}/",
        full(200, 200, 200, 404, 401),
    ),
    "api-department:other": (
        GET,
        lambda o: f"/api/v1/departments/{o.dept_b.pk}/",
        full(200, 404, 404, 200, 401),
    ),
    "api-department-quotas": (
        GET,
        lambda o: f"/api/v1/departments/{o.dept_a.pk}/quotas/",
        full(200, 200, 200, 404, 401),
    ),
    "api-department-quotas:other": (
        GET,
        lambda o: f"/api/v1/departments/{o.dept_b.pk}/quotas/",
        full(200, 404, 404, 200, 401),
    ),
    "api-projects": (GET, lambda o: "/api/v1/projects/", full(200, 200, 200, 200, 401)),
    "api-project": (
        GET,
        lambda o: f"/api/v1/projects/{o.project_a.pk}/",
        full(200, 200, 200, 404, 401),
    ),
    "api-project:other": (
        GET,
        lambda o: f"/api/v1/projects/{o.project_b.pk}/",
        full(200, 404, 404, 200, 401),
    ),
    "api-project-quotas": (
        GET,
        lambda o: f"/api/v1/projects/{o.project_a.pk}/quotas/",
        full(200, 200, 200, 404, 401),
    ),
    "api-project-quotas:other": (
        GET,
        lambda o: f"/api/v1/projects/{o.project_b.pk}/quotas/",
        full(200, 404, 404, 200, 401),
    ),
    "api-node-pools": (GET, lambda o: "/api/v1/node-pools/", full(200, 200, 200, 200, 401)),
    "api-node-pool": (
        GET,
        lambda o: f"/api/v1/node-pools/{o.pool.pk}/",
        full(200, 200, 200, 200, 401),
    ),
    # REST API, scheduling.
    "api-workloads": (GET, lambda o: "/api/v1/workloads/", full(200, 200, 200, 200, 401)),
    "api-workload": (
        GET,
        lambda o: f"/api/v1/workloads/{o.job.pk}/",
        full(200, 200, 200, 404, 401),
    ),
    "api-workload:other": (
        GET,
        lambda o: f"/api/v1/workloads/{o.job_b.pk}/",
        full(200, 404, 404, 200, 401),
    ),
    "api-workload-stop": (
        POST,
        lambda o: f"/api/v1/workloads/{o.job.pk}/stop/",
        full(200, 200, 200, 404, 401),
    ),
    "api-workload-stop:other": (
        POST,
        lambda o: f"/api/v1/workloads/{o.job_b.pk}/stop/",
        full(200, 404, 404, 200, 401),
    ),
    # Only the workload's own pod, with its checkpoint token (no account does).
    "api-workload-checkpoint": (
        POST,
        lambda o: f"/api/v1/workloads/{o.job.pk}/checkpoint/",
        same(401),
    ),
    "api-workload-events": (
        GET,
        lambda o: f"/api/v1/workloads/{o.job.pk}/events/",
        full(200, 200, 200, 404, 401),
    ),
    "api-workload-logs": (
        GET,
        lambda o: f"/api/v1/workloads/{o.job.pk}/logs/",
        full(200, 200, 200, 404, 401),
    ),
    "api-workload-logs:other": (
        GET,
        lambda o: f"/api/v1/workloads/{o.job_b.pk}/logs/",
        full(200, 404, 404, 200, 401),
    ),
    "api-queue": (GET, lambda o: "/api/v1/queue/", full(200, 200, 200, 200, 401)),
    "api-policies": (GET, lambda o: "/api/v1/policies/", full(200, 200, 403, 403, 401)),
    "api-policy": (
        GET,
        lambda o: f"/api/v1/policies/project/{o.project_a.pk}/",
        full(200, 200, 403, 404, 401),
    ),
    "api-policy:other": (
        GET,
        lambda o: f"/api/v1/policies/department/{o.dept_b.pk}/",
        full(200, 404, 404, 403, 401),
    ),
    "api-cycles": (GET, lambda o: "/api/v1/cycles/", full(200, 403, 403, 403, 401)),
    # REST API, clusters and metrics.
    "api-clusters": (GET, lambda o: "/api/v1/clusters/", full(200, 403, 403, 403, 401)),
    "api-cluster": (
        GET,
        lambda o: f"/api/v1/clusters/{o.cluster.pk}/",
        full(200, 403, 403, 403, 401),
    ),
    "api-cluster-test": (
        POST,
        lambda o: f"/api/v1/clusters/{o.cluster.pk}/test/",
        full(200, 403, 403, 403, 401),
    ),
    "api-nodes": (GET, lambda o: "/api/v1/nodes/", full(200, 200, 200, 200, 401)),
    # POST only (who may submit: tests/clusters/test_manifest_submit.py).
    "api-manifests": (GET, lambda o: "/api/v1/manifests/", full(405, 405, 405, 405, 401)),
    # Node agents only, with their own token: a signed-in person is not an agent.
    "metrics-ingest": (POST, lambda o: "/api/v1/metrics", same(401)),
    "metrics-agent-pods": (GET, lambda o: "/api/v1/metrics/pods", same(401)),
    "api-node-mig-report": (POST, lambda o: "/api/v1/nodes/mig-report", same(401)),
    "api-node-mps-report": (POST, lambda o: "/api/v1/nodes/mps-report", same(401)),
    # kube-apiserver's pod webhook: POST only, no session (test_admission_webhook.py).
    "pods_admission": (GET, lambda o: f"/k8s/admission/{o.cluster.uid}/pods/", same(405)),
    # REST API, workspaces.
    "api-environments": (GET, lambda o: "/api/v1/environments/", full(200, 200, 200, 200, 401)),
    "api-workspaces": (GET, lambda o: "/api/v1/workspaces/", full(200, 200, 200, 200, 401)),
    "api-workspace": (
        GET,
        lambda o: f"/api/v1/workspaces/{o.ws}/",
        full(200, 200, 200, 404, 401),
    ),
    "api-workspace:other": (
        GET,
        lambda o: f"/api/v1/workspaces/{o.ws_b}/",
        full(200, 404, 404, 200, 401),
    ),
    "api-workspace-keep-running": (
        POST,
        lambda o: f"/api/v1/workspaces/{o.ws}/keep-running/",
        full(200, 200, 200, 404, 401),
    ),
    # Workload pages.
    "workload_list": (GET, lambda o: "/workloads/", row(200, 200, 200, 200)),
    "workload_new": (GET, lambda o: "/workloads/new/training/", row(200, 200, 200, 200)),
    "workload_from_yaml": (GET, lambda o: "/workloads/new-yaml/", row(200, 200, 200, 200)),
    "workload_queue": (GET, lambda o: "/workloads/queue/", row(200, 200, 200, 200)),
    "workload_cycles": (GET, lambda o: "/workloads/cycles/", row(200, 403, 403, 403)),
    "workload_policies": (GET, lambda o: "/workloads/policies/", row(200, 200, 403, 403)),
    "workload_policy_edit": (
        GET,
        lambda o: f"/workloads/policies/project/{o.project_a.pk}/",
        row(200, 200, 403, 403),
    ),
    "workload_policy_edit:other": (
        GET,
        lambda o: f"/workloads/policies/project/{o.project_b.pk}/",
        row(200, 404, 403, 403),
    ),
    "workload_policy_edit:department": (
        GET,
        lambda o: f"/workloads/policies/department/{o.dept_b.pk}/",
        row(200, 404, 403, 403),
    ),
    "workload_detail": (GET, lambda o: f"/workloads/{o.job.pk}/", row(200, 200, 200, 404)),
    "workload_detail:other": (GET, lambda o: f"/workloads/{o.job_b.pk}/", row(200, 404, 404, 200)),
    "workload_status": (GET, lambda o: f"/workloads/{o.job.pk}/status/", row(200, 200, 200, 404)),
    "workload_stop": (POST, lambda o: f"/workloads/{o.job.pk}/stop/", row(302, 302, 302, 404)),
    "workload_stop:other": (
        POST,
        lambda o: f"/workloads/{o.job_b.pk}/stop/",
        row(302, 404, 404, 302),
    ),
    "workload_delete": (GET, lambda o: f"/workloads/{o.job.pk}/delete/", row(200, 200, 200, 404)),
    "workload_clone": (GET, lambda o: f"/workloads/{o.job.pk}/clone/", row(200, 200, 200, 404)),
    "workload_clone:other": (
        GET,
        lambda o: f"/workloads/{o.job_b.pk}/clone/",
        row(200, 404, 404, 200),
    ),
    "workload_logs": (GET, lambda o: f"/workloads/{o.job.pk}/logs/", row(200, 200, 200, 404)),
    "workload_logs_fragment": (
        GET,
        lambda o: f"/workloads/{o.job.pk}/logs/fragment/",
        row(200, 200, 200, 404),
    ),
    "workload_logs_download": (
        GET,
        lambda o: f"/workloads/{o.job.pk}/logs/download/",
        row(200, 200, 200, 404),
    ),
    # Cluster pages: platform admins only; the node list is everyone's.
    "cluster_list": (GET, lambda o: "/clusters/", row(200, 403, 403, 403)),
    "cluster_new": (GET, lambda o: "/clusters/new/", row(200, 403, 403, 403)),
    "node_list": (GET, lambda o: "/clusters/nodes/", row(200, 200, 200, 200)),
    "cluster_edit": (GET, lambda o: f"/clusters/{o.cluster.pk}/edit/", row(200, 403, 403, 403)),
    "cluster_test": (POST, lambda o: f"/clusters/{o.cluster.pk}/test/", row(302, 403, 403, 403)),
    "cluster_sync": (POST, lambda o: f"/clusters/{o.cluster.pk}/sync/", row(302, 403, 403, 403)),
    # Workspace pages: the project's people look; only the owner shares.
    "workspaces:list": (GET, lambda o: "/workspaces/", row(200, 200, 200, 200)),
    "workspaces:launch": (GET, lambda o: "/workspaces/new/", row(200, 200, 200, 200)),
    "workspaces:detail": (GET, lambda o: f"/workspaces/{o.ws}/", row(200, 200, 200, 404)),
    "workspaces:detail:other": (GET, lambda o: f"/workspaces/{o.ws_b}/", row(200, 404, 404, 200)),
    "workspaces:status": (GET, lambda o: f"/workspaces/{o.ws}/status/", row(200, 200, 200, 404)),
    "workspaces:keep_alive": (
        POST,
        lambda o: f"/workspaces/{o.ws}/keep-running/",
        row(302, 302, 302, 404),
    ),
    "workspaces:share": (POST, lambda o: f"/workspaces/{o.ws}/share/", row(403, 403, 302, 404)),
    "workspaces:share:other": (
        POST,
        lambda o: f"/workspaces/{o.ws_b}/share/",
        row(403, 404, 404, 302),
    ),
    "workspaces:stop": (POST, lambda o: f"/workspaces/{o.ws}/stop/", row(302, 302, 302, 404)),
    "workspaces:stop:other": (
        POST,
        lambda o: f"/workspaces/{o.ws_b}/stop/",
        row(302, 404, 404, 302),
    ),
    "workspaces:environments": (
        GET,
        lambda o: "/workspaces/environments/",
        row(200, 403, 403, 403),
    ),
    "workspaces:environment_new": (
        GET,
        lambda o: "/workspaces/environments/new/",
        row(200, 403, 403, 403),
    ),
    "workspaces:environment_edit": (
        GET,
        lambda o: f"/workspaces/environments/{o.env.pk}/",
        row(200, 403, 403, 403),
    ),
    "workspaces:templates": (GET, lambda o: "/workspaces/templates/", row(200, 200, 403, 403)),
    "workspaces:idle_policies": (
        GET,
        lambda o: "/workspaces/idle-policies/",
        row(200, 200, 403, 403),
    ),
    # Metrics pages and reports: everyone, cut to what they may see; prices and agent
    # tokens are the platform's.
    "dashboard": (GET, lambda o: "/dashboard/", row(200, 200, 200, 200)),
    "dashboard_now": (GET, lambda o: "/dashboard/fragment/now/", row(200, 200, 200, 200)),
    "dashboard_chart": (GET, lambda o: "/dashboard/fragment/chart/", row(200, 200, 200, 200)),
    "nodes_heatmap": (GET, lambda o: "/nodes/heatmap/", row(200, 200, 200, 200)),
    "node_tokens": (GET, lambda o: "/nodes/tokens/", row(200, 403, 403, 403)),
    "usage_report": (GET, lambda o: "/reports/usage/", row(200, 200, 200, 200)),
    "usage_report_csv": (GET, lambda o: "/reports/usage.csv", row(200, 200, 200, 200)),
    "gpu_prices": (GET, lambda o: "/reports/prices/", row(200, 403, 403, 403)),
    # The organisation's POST-only actions on someone outside department A (their GET rows
    # above answer 405 to admins, which says nothing about who may act).
    "membership_add:other": (
        POST,
        lambda o: f"/users/{o.outsider.pk}/memberships/",
        row(200, 404, 403, 403),  # 200: the empty form shown again with its errors
    ),
    "membership_remove:other": (
        POST,
        lambda o: f"/users/{o.outsider.pk}/memberships/{_membership_of(o.outsider)}/remove/",
        row(302, 404, 403, 403),
    ),
    "user_deactivate:other": (
        POST,
        lambda o: f"/users/{o.outsider.pk}/deactivate/",
        row(302, 404, 403, 403),
    ),
    "user_reactivate:other": (
        POST,
        lambda o: f"/users/{o.outsider.pk}/reactivate/",
        row(302, 404, 403, 403),
    ),
    # Prometheus scrapes with a bearer token; a session opens nothing.
    "prometheus": (GET, lambda o: "/metrics", same(401)),
}
for _name, (_method, _build, _expected) in SITE_MATRIX.items():
    _expected.setdefault(ANON, LOGIN)

# The same rows for three more personas: vera, a viewer in project A; pete, a researcher in
# project A2 (department A, another project); nina, signed in but a member of nothing.
MORE = ("viewer", "peer", "nobody")
MORE_MATRIX = {
    "login": (200, 200, 200),
    "logout": (LOGIN, LOGIN, LOGIN),
    "oidc_authentication_init": (404, 404, 404),
    "oidc_authentication_callback": (404, 404, 404),
    "oidc_logout": (LOGIN, LOGIN, LOGIN),
    "password_reset": (200, 200, 200),
    "password_reset_done": (200, 200, 200),
    "password_reset_confirm": (200, 200, 200),
    "password_reset_complete": (200, 200, 200),
    "admin:index": (302, 302, 302),
    "admin-login": (200, 200, 200),
    "api-schema": (200, 200, 200),
    "api-docs": (200, 200, 200),
    "api-token": (400, 400, 400),
    "api-me": (200, 200, 200),
    "api-ssh-keys": (200, 200, 200),
    "api-ssh-key": (405, 405, 405),
    "api-departments": (200, 200, 200),
    "api-department": (200, 200, 404),
    "api-department:other": (404, 404, 404),
    "api-department-quotas": (200, 200, 404),
    "api-department-quotas:other": (404, 404, 404),
    "api-projects": (200, 200, 200),
    "api-project": (200, 404, 404),
    "api-project:other": (404, 404, 404),
    "api-project-quotas": (200, 404, 404),
    "api-project-quotas:other": (404, 404, 404),
    "api-node-pools": (200, 200, 200),
    "api-node-pool": (200, 200, 200),
    "api-workloads": (200, 200, 200),
    "api-workload": (200, 404, 404),
    "api-workload:other": (404, 404, 404),
    "api-workload-stop": (403, 404, 404),
    "api-workload-stop:other": (404, 404, 404),
    "api-workload-checkpoint": (401, 401, 401),
    "api-workload-events": (200, 404, 404),
    "api-workload-logs": (200, 404, 404),
    "api-workload-logs:other": (404, 404, 404),
    "api-queue": (200, 200, 200),
    "api-policies": (403, 403, 403),
    "api-policy": (403, 404, 404),
    "api-policy:other": (404, 404, 404),
    "api-cycles": (403, 403, 403),
    "api-clusters": (403, 403, 403),
    "api-cluster": (403, 403, 403),
    "api-cluster-test": (403, 403, 403),
    "api-nodes": (200, 200, 200),
    "api-manifests": (405, 405, 405),
    "metrics-ingest": (401, 401, 401),
    "metrics-agent-pods": (401, 401, 401),
    "api-node-mig-report": (401, 401, 401),
    "api-node-mps-report": (401, 401, 401),
    "pods_admission": (405, 405, 405),
    "api-environments": (200, 200, 200),
    "api-workspaces": (200, 200, 200),
    "api-workspace": (200, 404, 404),
    "api-workspace:other": (404, 404, 404),
    "api-workspace-keep-running": (403, 404, 404),
    "workload_list": (200, 200, 200),
    "workload_new": (200, 200, 200),
    "workload_from_yaml": (200, 200, 200),
    "workload_queue": (200, 200, 200),
    "workload_cycles": (403, 403, 403),
    "workload_policies": (403, 403, 403),
    "workload_policy_edit": (403, 403, 403),
    "workload_policy_edit:other": (403, 403, 403),
    "workload_policy_edit:department": (403, 403, 403),
    "workload_detail": (200, 404, 404),
    "workload_detail:other": (404, 404, 404),
    "workload_status": (200, 404, 404),
    "workload_stop": (403, 404, 404),
    "workload_stop:other": (404, 404, 404),
    "workload_delete": (403, 404, 404),
    "workload_clone": (403, 404, 404),
    "workload_clone:other": (404, 404, 404),
    "workload_logs": (200, 404, 404),
    "workload_logs_fragment": (200, 404, 404),
    "workload_logs_download": (200, 404, 404),
    "cluster_list": (403, 403, 403),
    "cluster_new": (403, 403, 403),
    "node_list": (200, 200, 200),
    "cluster_edit": (403, 403, 403),
    "cluster_test": (403, 403, 403),
    "cluster_sync": (403, 403, 403),
    "workspaces:list": (200, 200, 200),
    "workspaces:launch": (403, 200, 403),
    "workspaces:detail": (200, 404, 404),
    "workspaces:detail:other": (404, 404, 404),
    "workspaces:status": (200, 404, 404),
    "workspaces:keep_alive": (403, 404, 404),
    "workspaces:share": (403, 404, 404),
    "workspaces:share:other": (404, 404, 404),
    "workspaces:stop": (403, 404, 404),
    "workspaces:stop:other": (404, 404, 404),
    "workspaces:environments": (403, 403, 403),
    "workspaces:environment_new": (403, 403, 403),
    "workspaces:environment_edit": (403, 403, 403),
    "workspaces:templates": (403, 403, 403),
    "workspaces:idle_policies": (403, 403, 403),
    "dashboard": (200, 200, 200),
    "dashboard_now": (200, 200, 200),
    "dashboard_chart": (200, 200, 200),
    "nodes_heatmap": (200, 200, 200),
    "node_tokens": (403, 403, 403),
    "usage_report": (200, 200, 200),
    "usage_report_csv": (200, 200, 200),
    "gpu_prices": (403, 403, 403),
    "membership_add:other": (403, 403, 403),
    "membership_remove:other": (403, 403, 403),
    "user_deactivate:other": (403, 403, 403),
    "user_reactivate:other": (403, 403, 403),
    "prometheus": (401, 401, 401),
}
for _name, _statuses in MORE_MATRIX.items():
    SITE_MATRIX[_name][2].update(zip(MORE, _statuses, strict=True))


def _url_names(patterns, namespace: str = ""):
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            inner = f"{namespace}{pattern.namespace}:" if pattern.namespace else namespace
            yield from _url_names(pattern.url_patterns, inner)
        elif pattern.name:
            yield f"{namespace}{pattern.name}"
        else:
            yield f"{namespace}<unnamed {pattern.pattern}>"


def test_the_matrices_cover_every_url_of_the_site():
    """A URL added anywhere must get its row here (Django's own admin: its index only)."""
    site_names = {n for n in _url_names(get_resolver().url_patterns) if not n.startswith("admin:")}
    site_names.add("admin:index")
    covered = {name.split(":")[0] for name in MATRIX} | {
        name.removesuffix(":other").removesuffix(":department") for name in SITE_MATRIX
    }
    assert sorted(site_names - covered) == [], "URLs without a row in the permission matrix"
    assert sorted(covered - site_names) == [], "matrix rows for URLs that no longer exist"
    assert list(MORE_MATRIX) == list(SITE_MATRIX), "rows without the viewer, peer and nobody"


@pytest.mark.parametrize("name", list(SITE_MATRIX))
def test_every_url_answers_each_persona_as_the_site_matrix_says(client_as, site, settings, name):
    settings.GPUPOOL_METRICS_TOKEN = "scrape-token"
    method, build, expected = SITE_MATRIX[name]
    url = build(site)
    answers = {}
    for persona in (*ORDER, *MORE, ANON):
        client = client_as(None if persona == ANON else getattr(site, persona))
        # Each persona meets the same data: a POST's effect is rolled back after it.
        rollback = transaction.savepoint()
        response = getattr(client, method)(url)
        transaction.savepoint_rollback(rollback)
        # Jupyter tokens: see test_no_page_or_endpoint_hands_out_a_jupyter_token.
        assert not leaked(site.secrets, response, skip=("jupyter tokens",)), f"{persona} {url}"
        status = response.status_code
        if status == 302 and response["Location"].startswith("/accounts/login/"):
            status = LOGIN
        answers[persona] = status
    assert answers == expected, f"{method.upper()} {url}"


def _page_paths(patterns, prefix: str = ""):
    """The site's pages without parameters: no API, sign-in, fragments, CSV or scrape URLs."""
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _page_paths(pattern.url_patterns, prefix + str(pattern.pattern))
            continue
        path = "/" + prefix + str(pattern.pattern)
        if "<" in path or "fragment" in path or path.endswith(".csv") or path == "/metrics":
            continue
        if not path.startswith(("/api/", "/django-admin/", "/accounts/")):
            yield path


def _reachable(client, depth: int) -> set[str]:
    """Paths reached by following links from the overview, `depth` clicks deep."""
    seen: set[str] = set()
    frontier = ["/"]
    for _ in range(depth + 1):
        following = []
        for path in frontier:
            if path in seen:
                continue
            seen.add(path)
            response = client.get(path)
            if response.status_code == 200 and "html" in response.get("Content-Type", ""):
                following += re.findall(r'href="(/[^"#?]*)', response.content.decode())
        frontier = [p for p in following if not p.startswith(("/static/", "/api/v1/"))]
    return seen


@pytest.mark.parametrize("persona", ORDER)
def test_every_page_a_persona_may_open_is_linked_within_three_clicks(client_as, org, persona):
    client = client_as(getattr(org, persona))
    openable = [
        p for p in _page_paths(get_resolver().url_patterns) if client.get(p).status_code == 200
    ]
    assert sorted(set(openable) - _reachable(client, depth=3)) == []


# --- Writes with real payloads ---------------------------------------------------------------
# Each write is sent as each persona would send it for real (a valid body), then undone. A 2xx
# must have made the change; anything else must have changed nothing.
PERSONAS = (*ORDER, *MORE)
JSON = "application/json"


def _named(model, **filters):
    return lambda o: model.objects.filter(**filters).exists()


def _workload(o, name: str) -> bool:
    return Workload.objects.filter(name=name).exists()


WRITES = {
    # name: (method, url, body, "did it happen?", expected status per persona in PERSONAS)
    "submit training to project A": (
        "post",
        lambda o: "/api/v1/workloads/",
        lambda o: {"project": "ml-vision", "kind": "training", "name": "w", "image": "img"},
        lambda o: Workload.objects.filter(name="w").exists(),
        (201, 201, 201, 400, 403, 400, 400),
    ),
    "stop project A's job": (
        "post",
        lambda o: f"/api/v1/workloads/{o.job.pk}/stop/",
        lambda o: {},
        lambda o: Workload.objects.get(pk=o.job.pk).state != WorkloadState.PENDING,
        (200, 200, 200, 404, 403, 404, 404),
    ),
    "delete project A's job": (
        "delete",
        lambda o: f"/api/v1/workloads/{o.job.pk}/",
        lambda o: {},
        lambda o: not Workload.objects.filter(pk=o.job.pk).exists(),
        (204, 204, 204, 404, 403, 404, 404),
    ),
    "launch a workspace in project A": (
        "post",
        lambda o: "/api/v1/workspaces/",
        lambda o: {"project": "ml-vision", "environment": "Lab", "name": "nb"},
        lambda o: Workload.objects.filter(name="nb").exists(),
        (201, 201, 201, 403, 403, 403, 403),
    ),
    "keep project A's workspace running": (
        "post",
        lambda o: f"/api/v1/workspaces/{o.ws}/keep-running/",
        lambda o: {},
        lambda o: Workspace.objects.get(workload_id=o.ws).kept_alive_at is not None,
        (200, 200, 200, 404, 403, 404, 404),
    ),
    "describe project A": (
        "patch",
        lambda o: f"/api/v1/projects/{o.project_a.pk}/",
        lambda o: {"description": "changed"},
        lambda o: Project.objects.get(pk=o.project_a.pk).description == "changed",
        (200, 200, 403, 404, 403, 404, 404),
    ),
    "create a project in department A": (
        "post",
        lambda o: "/api/v1/projects/",
        lambda o: {"name": "fresh", "department": o.dept_a.pk},
        lambda o: Project.objects.filter(name="fresh").exists(),
        (201, 201, 403, 403, 403, 403, 403),
    ),
    "delete project A2 (no workloads)": (
        "delete",
        lambda o: f"/api/v1/projects/{o.project_a2.pk}/",
        lambda o: {},
        lambda o: not Project.objects.filter(pk=o.project_a2.pk).exists(),
        (204, 204, 404, 404, 404, 403, 404),
    ),
    "set project A's quota": (
        "put",
        lambda o: f"/api/v1/projects/{o.project_a.pk}/quotas/",
        lambda o: [{"node_pool": "a100", "gpus": "3"}],
        lambda o: ProjectQuota.objects.filter(project=o.project_a, gpus=3).exists(),
        (200, 200, 403, 404, 403, 404, 404),
    ),
    "describe department A": (
        "patch",
        lambda o: f"/api/v1/departments/{o.dept_a.pk}/",
        lambda o: {"description": "changed"},
        lambda o: Department.objects.get(pk=o.dept_a.pk).description == "changed",
        (200, 200, 403, 404, 403, 403, 404),
    ),
    "create a department": (
        "post",
        lambda o: "/api/v1/departments/",
        lambda o: {"name": "physics"},
        lambda o: Department.objects.filter(name="physics").exists(),
        (201, 403, 403, 403, 403, 403, 403),
    ),
    "set department A's quota": (
        "put",
        lambda o: f"/api/v1/departments/{o.dept_a.pk}/quotas/",
        lambda o: [{"node_pool": "a100", "gpus": "7"}],
        lambda o: DepartmentQuota.objects.filter(department=o.dept_a, gpus=7).exists(),
        (200, 403, 403, 404, 403, 403, 404),
    ),
    "set project A's policy": (
        "put",
        lambda o: f"/api/v1/policies/project/{o.project_a.pk}/",
        lambda o: {"max_runtime_s": 3600},
        lambda o: WorkloadPolicy.objects.filter(project=o.project_a).exists(),
        (200, 200, 403, 404, 403, 404, 404),
    ),
    "create a node pool": (
        "post",
        lambda o: "/api/v1/node-pools/",
        lambda o: {"name": "h100"},
        lambda o: NodePool.objects.filter(name="h100").exists(),
        (201, 403, 403, 403, 403, 403, 403),
    ),
    # The pages' forms, posted as a browser does: success is a redirect, a refusal changes nothing.
    "edit project A (page)": (
        "form",
        lambda o: f"/projects/{o.project_a.pk}/edit/",
        lambda o: {"name": "ml-vision", "namespace": o.project_a.namespace, "description": "p"},
        lambda o: Project.objects.get(pk=o.project_a.pk).description == "p",
        (302, 302, 403, 404, 403, 404, 404),
    ),
    "stop project A's job (page)": (
        "form",
        lambda o: f"/workloads/{o.job.pk}/stop/",
        lambda o: {},
        lambda o: Workload.objects.get(pk=o.job.pk).state != WorkloadState.PENDING,
        (302, 302, 302, 404, 403, 404, 404),
    ),
    "delete project A's job (page)": (
        "form",
        lambda o: f"/workloads/{o.job.pk}/delete/",
        lambda o: {},
        lambda o: not Workload.objects.filter(pk=o.job.pk).exists(),
        (302, 302, 302, 404, 403, 404, 404),
    ),
    "register a cluster": (
        "post",
        lambda o: "/api/v1/clusters/",
        lambda o: {"name": "k8s-new", "backend": "kubernetes", "kubeconfig": KUBECONFIG},
        lambda o: Cluster.objects.filter(name="k8s-new").exists(),
        (201, 403, 403, 403, 403, 403, 403),
    ),
}


@pytest.mark.parametrize("name", list(WRITES))
def test_every_write_with_a_real_payload_answers_and_acts_as_the_matrix_says(
    client_as, site, settings, name
):
    settings.GPUPOOL_KUBECONFIG_KEY = KUBECONFIG_KEY
    method, url, body, happened, expected = WRITES[name]
    answers = []
    for persona in PERSONAS:
        client = client_as(getattr(site, persona))
        rollback = transaction.savepoint()
        if method == "form":
            response = client.post(url(site), body(site))
            succeeded = response.status_code == 302
        else:
            response = getattr(client, method)(url(site), body(site), content_type=JSON)
            succeeded = 200 <= response.status_code < 300
        acted = happened(site)
        transaction.savepoint_rollback(rollback)
        answers.append(response.status_code)
        assert acted == succeeded, f"{persona}: {response.content}"
        assert not leaked(site.secrets | {"sent": ["token: SECRET"]}, response), persona
    assert tuple(answers) == expected, f"{PERSONAS} answered {tuple(answers)}"


def test_no_page_or_endpoint_hands_out_a_jupyter_token(client_as, site):
    urls = [
        "/api/v1/workloads/",
        f"/api/v1/workloads/{site.ws}/",
        "/api/v1/workspaces/",
        f"/api/v1/workspaces/{site.ws}/",
        f"/workloads/{site.ws}/",
        f"/workspaces/{site.ws}/",
        "/workspaces/",
    ]
    found = [
        (persona, url)
        for persona in PERSONAS
        for url in urls
        if leaked(site.secrets, client_as(getattr(site, persona)).get(url))
    ]
    assert found == []


@pytest.mark.parametrize(
    "url",
    ["/api/v1/workloads/", "/api/v1/workspaces/", "/api/v1/projects/"],
)
def test_the_lists_hold_nothing_of_project_a_for_the_peer_and_the_member_of_nothing(
    client_as, site, url
):
    names_in_a = {"resnet", "lab", "ml-vision"}
    for persona, sees in (("viewer", True), ("peer", False), ("nobody", False)):
        body = client_as(getattr(site, persona)).get(url).json()
        rows = body["results"] if isinstance(body, dict) else body
        assert (
            {row["name"] for row in rows} & names_in_a
            if sees
            else not ({row["name"] for row in rows} & names_in_a)
        ), f"{persona} {url}: {rows}"
