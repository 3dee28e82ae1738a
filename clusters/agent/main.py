"""The agent's loop and command line."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clusters.agent.kubenode import KubeNode, NodeMig, in_cluster_api
from clusters.agent.mps import MpsDaemons
from clusters.agent.nvml import NoGpu, Reading, Sampler, load_nvml
from clusters.agent.procmap import ProcessMap
from clusters.agent.shipper import Shipper
from clusters.agent.spool import Spool

log = logging.getLogger("gpupool.agent")


def to_samples(readings: list[Reading], procmap: ProcessMap) -> list[dict[str, Any]]:
    """Readings as ingestion dicts; a GPU's workload is that of its largest process."""
    samples = []
    for r in readings:
        procs = []
        for p in sorted(r.processes, key=lambda p: -p.used_mib):
            owner = procmap.owner(p.pid)
            procs.append({
                "pid": p.pid, "used_mib": p.used_mib,
                "workload_id": owner.workload_id if owner else None,
                "pod_index": owner.pod_index if owner else None,
            })  # fmt: skip
        first = next((p for p in procs if p["workload_id"] is not None), None)
        samples.append({
            "gpu_index": r.gpu_index, "ts": r.ts, "util_pct": r.util_pct,
            "mem_used_mib": r.mem_used_mib, "mem_total_mib": r.mem_total_mib,
            "power_w": r.power_w, "temp_c": r.temp_c, "processes": procs,
            "workload_id": first["workload_id"] if first else None,
            "pod_index": first["pod_index"] if first else None,
        })  # fmt: skip
    return samples


def mps_wanted(pods: list[dict[str, Any]]) -> dict[str, str]:
    """The devices this node's sharers use, each needing its MPS daemon. Only asked when
    the portal answered: an agent cut off from it stops nothing."""
    return {
        str(p["mps_device"]): str(p["mps_device"])
        for p in pods
        if p.get("shared_gpu_index") is not None and p.get("mps_device")
    }


def mps_running(pods: list[dict[str, Any]], daemons: MpsDaemons) -> dict[str, list[int]]:
    """The devices whose daemon runs now, each with the allocations (`id`) the portal said
    share it: a native sharer is bound once its own is listed (clusters/mps_report.py)."""
    running: dict[str, list[int]] = {}
    for device in sorted(set(mps_wanted(pods))):
        if daemons.pid(device) is not None:
            running[device] = sorted(
                int(p["id"])
                for p in pods
                if p.get("mps_device") == device
                and p.get("shared_gpu_index") is not None
                and isinstance(p.get("id"), int)
            )
    return running


class Agent:
    def __init__(
        self,
        sampler: Sampler,
        shipper: Shipper,
        procmap: ProcessMap | None = None,
        interval_s: float = 10.0,
        pods_every_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        mps: MpsDaemons | None = None,
        mig: NodeMig | None = None,
    ):
        self.sampler, self.shipper, self.mps, self.mig = sampler, shipper, mps, mig
        self.procmap = procmap or ProcessMap()
        self.interval_s, self.pods_every_s, self.sleep = interval_s, pods_every_s, sleep
        self.pods_at = float("-inf")

    def tick(self) -> bool:
        """1. refresh the pod map now and then, the MPS daemons of shared GPUs (and say which
        run, for which allocations) and (on Kubernetes) the MIG instances its Node asks for;
        2. sample; 3. buffer; 4. send."""
        if time.monotonic() - self.pods_at >= self.pods_every_s:
            pods = self.shipper.pods()
            if pods is not None:
                self.procmap.update(pods)
                self.pods_at = time.monotonic()
                if self.mps is not None:
                    self.mps.sync(mps_wanted(pods))
                    self.shipper.report_mps(mps_running(pods, self.mps))
                if self.mig is not None:
                    self.mig.sync(self.shipper)
        self.shipper.add(to_samples(self.sampler.read(), self.procmap))
        return self.shipper.flush()

    def run(self, ticks: int | None = None) -> None:
        done = 0
        while ticks is None or done < ticks:
            started = time.monotonic()
            self.tick()
            done += 1
            if ticks is None or done < ticks:
                self.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="python -m clusters.agent", description=__doc__)
    parser.add_argument("--portal", default=env("GPUPOOL_PORTAL_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token", default=env("GPUPOOL_AGENT_TOKEN", ""))
    parser.add_argument("--token-file", default=env("GPUPOOL_AGENT_TOKEN_FILE", ""))
    parser.add_argument(
        "--interval", type=float, default=float(env("GPUPOOL_AGENT_INTERVAL_S", "10"))
    )
    parser.add_argument("--buffer", type=int, default=100_000, help="samples kept while away")
    parser.add_argument(
        "--spool",
        default=env("GPUPOOL_AGENT_SPOOL", ""),
        help="file that keeps buffered samples across restarts of the agent",
    )
    parser.add_argument("--ticks", type=int, default=None, help="stop after this many samples")
    parser.add_argument(
        "--mps-root",
        default=env("GPUPOOL_AGENT_MPS_ROOT", ""),
        help="run an MPS control daemon per shared GPU, its pipe and log folders under "
        "this host folder (Kubernetes nodes: /run/gpupool/mps); empty: none",
    )
    parser.add_argument(
        "--mig-node",
        default=env("GPUPOOL_AGENT_MIG_NODE", ""),
        help="apply the MIG layout the portal publishes on this Kubernetes Node (its "
        "gpupool.io/mig-layout annotation) and report the MIG devices; empty: no MIG",
    )
    parser.add_argument(
        "--kube-api",
        default=env("GPUPOOL_AGENT_KUBE_API", "") or in_cluster_api(),
        help="the Kubernetes API server (default: the one this pod runs under)",
    )
    parser.add_argument(
        "--kube-token-file",
        default=env(
            "GPUPOOL_AGENT_KUBE_TOKEN_FILE", "/var/run/secrets/kubernetes.io/serviceaccount/token"
        ),
        help="the service account token the Node is read with",
    )
    parser.add_argument(
        "--direct",
        metavar="CLUSTER/NODE",
        default=env("GPUPOOL_AGENT_DIRECT", ""),
        help="write into the portal's database as this node (no HTTP, no token)",
    )
    return parser.parse_args(argv)


def direct_shipper(node: str, capacity: int) -> Shipper:
    """Django is only loaded in direct mode: an HTTP agent on a GPU node needs none of it."""
    import django  # noqa: PLC0415

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    django.setup()
    from clusters.agent.direct import DirectShipper, node_id_for  # noqa: PLC0415

    return DirectShipper("(database)", "", capacity=capacity, node_id=node_id_for(node))


def main(argv: list[str] | None = None, nvml: Any = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    token = args.token or (Path(args.token_file).read_text().strip() if args.token_file else "")
    try:
        sampler = Sampler(nvml or load_nvml())
    except NoGpu as exc:
        print(f"gpupool agent: no GPU to watch ({exc}); exiting.")
        return 0
    if args.direct:
        shipper = direct_shipper(args.direct, args.buffer)
    elif token:
        shipper = Shipper(args.portal.rstrip("/"), token, capacity=args.buffer)
    else:
        print("gpupool agent: no node token (--token, --token-file or GPUPOOL_AGENT_TOKEN)")
        return 2
    if args.spool:
        shipper.spool = Spool(Path(args.spool))
        shipper.restore()
    log.info("watching %d GPUs, posting to %s", len(sampler.handles), shipper.portal)
    stopping = on_sigterm()
    # The daemons outlive a restart of the agent (sharers keep running); the next agent
    # finds them by their pid files and stops only those of GPUs no longer shared.
    mps = MpsDaemons(Path(args.mps_root)) if args.mps_root else None
    mig = node_mig(args, sampler.nvml)
    try:
        Agent(sampler, shipper, interval_s=args.interval, mps=mps, mig=mig).run(args.ticks)
    except KeyboardInterrupt:
        pass
    finally:
        sampler.close()
        if not shipper.flush():  # a last try for what is buffered
            shipper.keep()
        if stopping is not None:
            signal.signal(signal.SIGTERM, stopping)
    log.info("stopped; %d samples sent, %d still buffered", shipper.sent, len(shipper.buffer))
    return 0


def node_mig(args: argparse.Namespace, nvml: Any) -> NodeMig | None:
    """With --mig-node and an API server to read it from: the Kubernetes node's MIG sync."""
    if not args.mig_node:
        return None
    if not args.kube_api:
        log.error("--mig-node %s without an API server (--kube-api): no MIG", args.mig_node)
        return None
    node = KubeNode(args.kube_api, args.mig_node, token_file=Path(args.kube_token_file))
    node.ca_file = node.token_file.parent / "ca.crt"
    return NodeMig(node, nvml)


def on_sigterm() -> Any:
    """Stop on SIGTERM (systemd, Kubernetes) as on Ctrl-C: close NVML, send what is
    buffered, exit 0. Returns the handler it replaced (None off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, stop)
