"""Dynamic MIG on a Kubernetes node: the agent applies the layout the portal published on
its Node object and reports the MIG devices back (clusters/agent/miglayout.py: the format).

`NodeMig.sync()`, each time the agent refreshes its pods:
1. read this node's Node object from the API server with the pod's service account token
   (RBAC: `get` on nodes, deploy/agent/rbac.yaml) and decode its `gpupool.io/mig-layout`;
2. make each GPU the layout names hold its instances (clusters/agent/mig.py, through NVML);
   a GPU NVML refuses (not in MIG mode, a placement refused) becomes an error in the report;
3. post {layout id, GPUs in MIG mode, devices, errors} to the portal (Shipper.report_mig)
   when it changed, or RESEND_S after the last one the portal accepted.
A Node that cannot be read changes nothing on the GPUs; the last report stands.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from clusters.agent.mig import MIG_ENABLED, MigError, MigInstances
from clusters.agent.miglayout import ANNOTATION, MAX_ERRORS, MAX_GPUS, LayoutInvalid, layout_decode

log = logging.getLogger("gpupool.agent")
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# An unchanged report is sent again this often: a portal that lost it (restored) hears it.
RESEND_S = 600.0


def in_cluster_api() -> str:
    """The API server as a pod reaches it (the variables the kubelet sets in every pod)."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return ""
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


@dataclass
class KubeNode:
    """This node's Node object, read with the pod's service account token (re-read each
    time: the kubelet rotates it)."""

    api: str
    name: str
    token_file: Path = SA_DIR / "token"
    ca_file: Path = SA_DIR / "ca.crt"
    timeout_s: float = 10.0
    session: requests.Session = field(default_factory=requests.Session)

    def annotation(self, key: str) -> str | None:
        """The annotation's value ("" when absent); None when the Node cannot be read."""
        try:
            token = self.token_file.read_text().strip()
            verify: Any = str(self.ca_file) if self.ca_file.exists() else True
            response = self.session.get(
                f"{self.api.rstrip('/')}/api/v1/nodes/{self.name}",
                headers={"Authorization": f"Bearer {token}"},
                timeout=self.timeout_s,
                verify=verify,
            )
            response.raise_for_status()
            annotations = response.json().get("metadata", {}).get("annotations") or {}
        except (OSError, requests.RequestException, ValueError, AttributeError) as exc:
            log.warning("cannot read node %s from the API server: %s", self.name, exc)
            return None
        return str(annotations.get(key, ""))


class NodeMig:
    def __init__(self, node: KubeNode, nvml: Any):
        self.node, self.nvml = node, nvml
        self.instances = MigInstances(nvml)
        self.reported: dict[str, Any] | None = None  # the last report the portal accepted
        self.reported_at = float("-inf")
        self.resend_s = RESEND_S

    def sync(self, shipper: Any) -> dict[str, Any] | None:
        """Steps 1-3 of the module docstring; the report, or None when the Node is unread."""
        text = self.node.annotation(ANNOTATION)
        if text is None:
            return None
        report: dict[str, Any] = {"layout": "", "mig_mode": self.mig_mode(), "devices": {},
                                  "errors": []}  # fmt: skip
        if text:
            try:
                layout = layout_decode(text)
            except LayoutInvalid as exc:
                report["errors"].append(
                    f"the MIG layout on node {self.node.name} is invalid: {exc}"
                )
            else:
                report["layout"] = layout["id"]
                self.apply(layout, report)
        report["errors"] = report["errors"][:MAX_ERRORS]
        due = time.monotonic() - self.reported_at >= self.resend_s
        if (report != self.reported or due) and shipper.report_mig(report):
            self.reported, self.reported_at = report, time.monotonic()
        return report

    def apply(self, layout: dict[str, Any], report: dict[str, Any]) -> None:
        for index, wanted in sorted(layout["gpus"].items()):
            try:
                result = self.instances.sync(index, wanted, destroy=layout["destroy"])
            except (MigError, self.nvml.NVMLError) as exc:
                report["errors"].append(f"GPU {index}: {exc}")
                continue
            report["errors"] += result.errors
            if result.devices:
                report["devices"][str(index)] = {str(s): u for s, u in result.devices.items()}

    def mig_mode(self) -> list[int]:
        """The GPUs in MIG mode: the portal offers MIG only on those."""
        found = []
        try:
            count = min(int(self.nvml.nvmlDeviceGetCount()), MAX_GPUS)
        except self.nvml.NVMLError as exc:
            log.warning("NVML cannot count the GPUs: %s", exc)
            return found
        for index in range(count):
            try:
                handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
                if self.nvml.nvmlDeviceGetMigMode(handle)[0] == MIG_ENABLED:
                    found.append(index)
            except self.nvml.NVMLError:
                continue  # not MIG-capable (NOT_SUPPORTED), or lost
        return found
