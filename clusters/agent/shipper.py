"""A bounded buffer of samples and the HTTP posts that empty it.

Samples leave the buffer only after the portal has accepted them (2xx), so a portal that
is away loses nothing as long as the buffer holds; when it overflows, the oldest samples
go first and are counted. A batch the portal rejects as invalid (400) is dropped and
logged, since sending it again would block everything behind it forever.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import requests

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
    session: requests.Session = field(default_factory=requests.Session)

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
        return response.status_code

    def flush(self) -> bool:
        """Send everything buffered, oldest first. False when the portal is away."""
        while self.buffer:
            batch = [self.buffer[i] for i in range(min(self.batch_size, len(self.buffer)))]
            status = self._post(batch)
            if status is None or status >= 500 or status in (401, 403, 429):
                if status is not None:
                    log.warning("portal answered %s; %d samples buffered", status, len(self.buffer))
                return False
            for _ in batch:
                self.buffer.popleft()
            if status == 400:
                self.rejected += len(batch)
                log.error("portal rejected %d samples as invalid; dropped them", len(batch))
            else:
                self.sent += len(batch)
        return True

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
