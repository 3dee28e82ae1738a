"""The agent's buffer on disk, so that samples survive a restart of the agent.

While the portal is away the buffer is written to the spool file now and then (at most
once per `every_s`) and when the agent stops; an agent that starts finds the file, takes
its samples back into the buffer, oldest first, and sends them before new ones. The file
is replaced atomically (written beside it, then renamed), so a crash mid-write leaves
the previous copy whole. A line that cannot be read is skipped and counted, not fatal.
Once everything is delivered the file is removed.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("gpupool.agent")


@dataclass
class Spool:
    path: Path
    every_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    saved_at: float = field(default=float("-inf"))
    holds: bool = False  # whether the file may hold samples not yet delivered

    def load(self) -> list[dict[str, Any]]:
        """The samples a previous run left, oldest first ([] when there is no file)."""
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.error("cannot read the spool %s: %s", self.path, exc)
            return []
        samples, bad = [], 0
        for line in lines:
            try:
                sample = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if isinstance(sample, dict):
                samples.append(sample)
            else:
                bad += 1
        if bad:
            log.warning("spool %s: skipped %d unreadable lines", self.path, bad)
        self.holds = True
        log.info("spool %s: %d samples from an earlier run", self.path, len(samples))
        return samples

    def save(self, samples: Iterable[dict[str, Any]], *, now: bool = False) -> None:
        """Write the samples still buffered; unless `now`, at most once per every_s."""
        if not now and self.clock() - self.saved_at < self.every_s:
            return
        self.saved_at = self.clock()
        partial = self.path.with_name(self.path.name + ".partial")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with partial.open("w") as out:
                for sample in samples:
                    out.write(json.dumps(sample, separators=(",", ":")) + "\n")
                out.flush()
                os.fsync(out.fileno())
            os.replace(partial, self.path)
            self.holds = True
        except OSError as exc:
            log.error("cannot write the spool %s: %s", self.path, exc)

    def clear(self) -> None:
        """Everything was delivered: the file has nothing left to give."""
        if not self.holds:
            return
        try:
            self.path.unlink(missing_ok=True)
            self.holds = False
        except OSError as exc:
            log.error("cannot remove the spool %s: %s", self.path, exc)
