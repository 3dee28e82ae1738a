"""A bounded buffer of samples and the HTTP posts that empty it.

Samples leave the buffer only after the portal has accepted them (2xx), so a portal that
is away, or answers anything else, loses nothing as long as the buffer holds; when it
overflows, the oldest samples go first and are counted. A batch the portal refuses as
invalid (400) is split until the bad samples stand alone; those are dropped and logged,
since sending them again would block everything behind them forever. With a spool
(spool.py) the buffer also survives a restart of the agent.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import requests

from clusters.agent.spool import Spool

log = logging.getLogger("gpupool.agent")


@dataclass
class Shipper:
    portal: str
    token: str
    capacity: int = 100_000
    batch_size: int = 2_000
    timeout_s: float = 10.0
    buffer: deque = field(default_factory=deque)
    dropped: int = 0
    rejected: int = 0
    sent: int = 0
    refusal: str = ""  # why the portal last refused a batch, for the log
    session: requests.Session = field(default_factory=requests.Session)
    spool: Spool | None = None

    def restore(self) -> None:
        """Take back what an earlier run left in the spool, before anything new."""
        if self.spool is not None:
            self.add(self.spool.load())

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def add(self, samples: list[dict[str, Any]]) -> None:
        for sample in samples:
            if len(self.buffer) >= self.capacity:
                self.buffer.popleft()
                self.dropped += 1
            self.buffer.append(sample)

    def _post(self, batch: list[dict[str, Any]]) -> int | None:
        try:
            response = self.session.post(
                f"{self.portal}/api/v1/metrics",
                json={"samples": batch},
                headers=self.headers,
                timeout=self.timeout_s,
            )
        except requests.RequestException as exc:
            log.warning("portal unreachable (%s); %d samples buffered", exc, len(self.buffer))
            return None
        if response.status_code in (400, 413):
            self.refusal = response.text[:500]
        return response.status_code

    def _deliver(self, batch: list[dict[str, Any]]) -> int:
        """Post `batch`; how many of its samples, from the start, are settled (accepted, or
        refused one by one as invalid). A refused batch (400, or 413: too large) is split in
        halves so that one bad sample costs only itself; any other answer (the portal away,
        a proxy's 404, a redirect, 401, 429, 5xx) settles nothing and keeps it all."""
        status = self._post(batch)
        if status is not None and 200 <= status < 300:
            self.sent += len(batch)
            return len(batch)
        if status in (400, 413):
            if len(batch) == 1:
                self.rejected += 1
                log.error(
                    "portal refused a sample (%s: %s); dropped it: %.300s",
                    status, self.refusal, batch[0],
                )  # fmt: skip
                return 1
            half = len(batch) // 2
            done = self._deliver(batch[:half])
            return done if done < half else half + self._deliver(batch[half:])
        if status is not None:
            log.warning("portal answered %s; %d samples buffered", status, len(self.buffer))
        return 0

    def flush(self) -> bool:
        """Send everything buffered, oldest first. False when the portal is away."""
        while self.buffer:
            batch = [self.buffer[i] for i in range(min(self.batch_size, len(self.buffer)))]
            done = self._deliver(batch)
            for _ in range(done):
                self.buffer.popleft()
            if done < len(batch):
                if self.spool is not None:
                    self.spool.save(self.buffer)
                return False
        if self.spool is not None:
            self.spool.clear()
        return True

    def keep(self) -> None:
        """The agent stops: write what is still buffered to the spool, if there is one."""
        if self.spool is not None and self.buffer:
            self.spool.save(self.buffer, now=True)
            log.info("%d samples kept in %s for the next run", len(self.buffer), self.spool.path)

    def report_mig(self, report: dict[str, Any]) -> bool:
        """Post this node's MIG devices and errors (clusters/agent/kubenode.py); True once
        the portal stored them. A refused report is logged: the next one replaces it."""
        return self._report("mig-report", report, "MIG report")

    def report_mps(self, running: dict[str, list[int]]) -> bool:
        """Post which MPS daemons run, and for which allocations (clusters/mps_report.py);
        True once the portal stored it. A refused report is logged: the next replaces it."""
        return self._report("mps-report", {"running": running}, "MPS report")

    def _report(self, endpoint: str, body: dict[str, Any], what: str) -> bool:
        try:
            response = self.session.post(
                f"{self.portal}/api/v1/nodes/{endpoint}",
                json=body,
                headers=self.headers,
                timeout=self.timeout_s,
            )
        except requests.RequestException as exc:
            log.warning("portal unreachable for the %s: %s", what, exc)
            return False
        if response.status_code != 200:
            log.error("portal refused the %s (%s): %.300s", what, response.status_code,
                      response.text)  # fmt: skip
        return response.status_code == 200

    def pods(self) -> list[dict[str, Any]] | None:
        """The pods placed on this node, or None when the portal cannot say."""
        try:
            response = self.session.get(
                f"{self.portal}/api/v1/metrics/pods", headers=self.headers, timeout=self.timeout_s
            )
            response.raise_for_status()
            return list(response.json()["pods"])
        except (requests.RequestException, ValueError, KeyError) as exc:
            log.warning("could not fetch this node's pods: %s", exc)
            return None
