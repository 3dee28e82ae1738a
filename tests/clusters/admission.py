"""What a real API server's admission checks of a pod, for the fake API server.

- Pod Security (the `PodSecurity` admission plugin, on in every cluster since 1.25): the
  level a namespace enforces (label `pod-security.kubernetes.io/enforce`, else the
  cluster's default), with the checks and the message of k8s.io/pod-security-admission.
- Priority: a pod's priorityClassName must name an existing PriorityClass.
- RBAC: what a ClusterRole's rules allow, and the Forbidden message of the authorizer; the
  rules a namespace's RoleBindings grant; a RoleBinding's create refused as an escalation.
"""

from __future__ import annotations

from collections.abc import Iterable

LEVELS = ("privileged", "baseline", "restricted")
ENFORCE = "pod-security.kubernetes.io/enforce"
ENFORCE_VERSION = "pod-security.kubernetes.io/enforce-version"
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip


def _who(names: list[str]) -> str:
    quoted = ", ".join(f'"{n}"' for n in names)
    return f"container {quoted}" if len(names) == 1 else f"containers {quoted}"


def _containers(spec: dict) -> list[dict]:
    return (spec.get("initContainers") or []) + (spec.get("containers") or [])


def baseline_violations(spec: dict) -> list[str]:
    out = []
    host = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    if host:
        out.append(f"host namespaces ({', '.join(host)})")
    privileged = [
        c["name"] for c in _containers(spec) if (c.get("securityContext") or {}).get("privileged")
    ]
    if privileged:
        out.append(f"privileged ({_who(privileged)} must not set securityContext.privileged=true)")
    for c in _containers(spec):
        added = ((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or []
        extra = [a for a in added if a not in BASELINE_CAPABILITIES]
        if extra:
            said = ", ".join(f'"{a}"' for a in extra)
            out.append(
                f'non-default capabilities (container "{c["name"]}" must not include {said} '
                "in securityContext.capabilities.add)"
            )
    host_paths = [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]
    if host_paths:
        out.append(f"hostPath volumes (volume {', '.join(map(repr, host_paths))})")
    return out


def restricted_violations(spec: dict) -> list[str]:
    out = []
    pod_sc = spec.get("securityContext") or {}
    containers = _containers(spec)

    def unset(check: object) -> list[str]:
        return [c["name"] for c in containers if check(c.get("securityContext") or {})]

    escalating = unset(lambda sc: sc.get("allowPrivilegeEscalation") is not False)
    if escalating:
        out.append(
            f"allowPrivilegeEscalation != false ({_who(escalating)} must set "
            "securityContext.allowPrivilegeEscalation=false)"
        )
    undropped = unset(lambda sc: "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []))
    if undropped:
        out.append(
            f"unrestricted capabilities ({_who(undropped)} must set "
            'securityContext.capabilities.drop=["ALL"])'
        )
    root = pod_sc.get("runAsNonRoot") is not True
    rooted = unset(
        lambda sc: sc.get("runAsNonRoot") is False or (root and sc.get("runAsNonRoot") is None)
    )
    if rooted:
        out.append(
            f"runAsNonRoot != true (pod or {_who(rooted)} must set "
            "securityContext.runAsNonRoot=true)"
        )
    if pod_sc.get("runAsUser") == 0:
        out.append("runAsUser=0 (pod must not set runAsUser=0)")
    uid_zero = unset(lambda sc: sc.get("runAsUser") == 0)
    if uid_zero:
        out.append(f"runAsUser=0 ({_who(uid_zero)} must not set runAsUser=0)")
    allowed = ("RuntimeDefault", "Localhost")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    unconfined = unset(
        lambda sc: (sc.get("seccompProfile") or {}).get("type", pod_seccomp) not in allowed
    )
    if unconfined:
        out.append(
            f"seccompProfile (pod or {_who(unconfined)} must set "
            'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")'
        )
    for volume in spec.get("volumes") or []:
        kinds = [k for k in volume if k != "name" and k not in RESTRICTED_VOLUMES]
        if kinds:
            out.append(
                f'restricted volume types (volume "{volume["name"]}" uses restricted '
                f'volume type "{kinds[0]}")'
            )
    return out


def pod_security_violation(pod: dict, namespace_labels: dict, default: str) -> str | None:
    """The Forbidden message for a pod the namespace's enforced level refuses, or None."""
    level = namespace_labels.get(ENFORCE, default)
    if level not in LEVELS or level == "privileged":
        return None
    spec = pod.get("spec") or {}
    found = baseline_violations(spec)
    if level == "restricted":
        found += restricted_violations(spec)
    if not found:
        return None
    version = namespace_labels.get(ENFORCE_VERSION, "latest")
    name = pod["metadata"].get("name", "")
    return f'pods "{name}" is forbidden: violates PodSecurity "{level}:{version}": ' + ", ".join(
        found
    )


def rbac_allows(
    rules: Iterable[dict], verb: str, group: str, resource: str, name: str = ""
) -> bool:
    """`resource` with its subresource ("pods/log"). A rule with resourceNames allows only a
    request that names one of them: never a create, a list or a watch (no name)."""
    for rule in rules:
        names = rule.get("resourceNames")
        if (
            _has(rule.get("verbs"), verb)
            and _has(rule.get("apiGroups"), group)
            and _has(rule.get("resources"), resource)
            and (not names or name in names)
        ):
            return True
    return False


def _has(values: Iterable[str] | None, wanted: str) -> bool:
    return any(v in ("*", wanted) for v in values or [])


def rbac_forbidden(user: str, verb: str, group: str, resource: str, ns: str, name: str) -> str:
    """The authorizer's message, as a real API server words it."""
    base = resource.partition("/")[0]
    target = f'{base} "{name}"' if name else base
    scope = f'in the namespace "{ns}"' if ns else "at the cluster scope"
    return (
        f'{target} is forbidden: User "{user}" cannot {verb} resource "{resource}" '
        f'in API group "{group}" {scope}'
    )


RBAC_GROUP = "rbac.authorization.k8s.io"
RBAC_STORE = f"{RBAC_GROUP}/v1"
# Granted to every authenticated user by the built-in system:basic-user ClusterRole.
EVERYONE_MAY = {("create", "authentication.k8s.io", "selfsubjectreviews")}
AUTHENTICATED = ("system:authenticated",)


def user_groups(user: str) -> list[str]:
    """The groups the authenticator gives a user: a ServiceAccount's, and everyone's."""
    parts = user.split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
        return ["system:serviceaccounts", f"system:serviceaccounts:{parts[2]}", *AUTHENTICATED]
    return list(AUTHENTICATED)


def _subject_is(subject: dict, user: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "ServiceAccount":
        return user == f"system:serviceaccount:{subject.get('namespace')}:{name}"
    if kind == "Group":
        return name in user_groups(user)
    return kind == "User" and name == user


def bound_rules(objects: dict, user: str, ns: str) -> list[dict]:
    """The rules the RoleBindings of namespace `ns` grant `user` there (their Role, or the
    ClusterRole they name, as stored; a binding to a role not there grants nothing)."""
    if not ns:
        return []
    found: list[dict] = []
    for (where, _), binding in (objects.get(f"{RBAC_STORE}/rolebindings") or {}).items():
        if where != ns or not any(_subject_is(s, user) for s in binding.get("subjects") or []):
            continue
        found += role_rules(objects, binding.get("roleRef") or {}, ns) or []
    return found


def role_plural(ref: dict) -> str:
    return "clusterroles" if ref.get("kind") == "ClusterRole" else "roles"


def role_rules(objects: dict, ref: dict, ns: str) -> list[dict] | None:
    """The rules of the Role (in `ns`) or ClusterRole a roleRef names; None if not there."""
    plural = role_plural(ref)
    key = ("" if plural == "clusterroles" else ns, ref.get("name"))
    role = (objects.get(f"{RBAC_STORE}/{plural}") or {}).get(key)
    return None if role is None else list(role.get("rules") or [])


def escalation_refusal(
    objects: dict, rules: list[dict], user: str, ns: str, binding: dict
) -> tuple[int, str, str] | None:
    """A RoleBinding's create by a user who may not `bind` the role it names, refused as
    the real RBAC storage refuses it (code, reason, message) unless the user holds every
    permission that role grants (no privilege escalation); None: allowed."""
    ref = binding.get("roleRef") or {}
    plural = role_plural(ref)
    wanted = role_rules(objects, ref, ns)
    if wanted is None:
        return 404, "NotFound", f'{plural}.{RBAC_GROUP} "{ref.get("name")}" not found'
    missing = [
        rule
        for rule in wanted
        if not all(
            rbac_allows(rules, verb, group, resource)
            for verb in rule.get("verbs") or []
            for group in rule.get("apiGroups") or []
            for resource in rule.get("resources") or []
        )
    ]
    if not missing:
        return None
    name = (binding.get("metadata") or {}).get("name", "")
    groups = " ".join(f'"{g}"' for g in user_groups(user))
    held = "\n".join(
        f"{{APIGroups:{_go(r.get('apiGroups'))}, Resources:{_go(r.get('resources'))}, "
        f"Verbs:{_go(r.get('verbs'))}}}"
        for r in missing
    )
    return (
        403,
        "Forbidden",
        (
            f'rolebindings.{RBAC_GROUP} "{name}" is forbidden: user "{user}" (groups=[{groups}]) '
            f"is attempting to grant RBAC permissions not currently held:\n{held}"
        ),
    )


def _go(values: Iterable[str] | None) -> str:
    return "[" + " ".join(f'"{v}"' for v in values or []) + "]"
