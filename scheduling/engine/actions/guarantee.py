"""Which running work of a queue its deserved quota guarantees, and which it borrows.

Preempt (a project's work within its guarantee takes back its own borrowed GPUs) and
reclaim (work within its guarantee takes back other projects' borrowed work when no plan
exists within their fair shares) both ask this.
"""

from __future__ import annotations

from scheduling.engine.context import Context, pending_key
from scheduling.engine.fairshare import EPS
from scheduling.engine.statement import slot_amounts
from scheduling.engine.types import Workload


class Guarantee:
    """Which running work of a queue its deserved quota guarantees, per pool.

    The queue's running workloads are taken in its own order (priority, then submit
    time, as it admits them), each joining the guaranteed set while the set stays within
    the deserved quota; the rest is borrowed (it runs on idle GPUs, as a job larger than
    the quota always does). Computed for a queue only when it holds more than its
    deserved quota in the pool (otherwise nothing is borrowed), once per cycle and queue
    until the queue admits something."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.running: dict[str, list[Workload]] | None = None
        self.memo: dict[tuple[str, str], tuple[float, frozenset[str], int]] = {}

    def borrowed_for(self, wl: Workload, pool: str, need: float) -> frozenset[str]:
        """Borrowed work of wl's queue it may evict: none unless wl fits inside the
        deserved quota beside the queue's guaranteed work."""
        ctx = self.ctx
        deserved = ctx.deserved(wl.queue_id, pool)
        if ctx.ledger.get(wl.queue_id, pool) <= deserved + EPS or need > deserved + EPS:
            return frozenset()
        held, borrowed = self.split(wl.queue_id, pool, deserved)
        if held + need > deserved + EPS:
            return frozenset()
        return borrowed

    def forget(self, queue_id: str) -> None:
        for key in [k for k in self.memo if k[0] == queue_id]:
            del self.memo[key]
        self.running = None

    def split(self, queue_id: str, pool: str, deserved: float) -> tuple[float, frozenset[str]]:
        """GPUs the queue's guaranteed work holds in the pool, and its borrowed work."""
        found = self.memo.get((queue_id, pool))
        if found is None or found[2] != len(self.ctx.stmt.evicted):
            held, borrowed = 0.0, set()
            evicted = self.ctx.stmt.evicted
            for wl in sorted(self._running().get(queue_id, ()), key=pending_key):
                if wl.id in evicted:
                    continue
                gpus = _gpus_in(self.ctx, wl.id, pool)
                if gpus <= EPS:
                    continue
                if held + gpus <= deserved + EPS:
                    held += gpus
                else:
                    borrowed.add(wl.id)
            found = (held, frozenset(borrowed), len(evicted))
            self.memo[(queue_id, pool)] = found
        return found[0], found[1]

    def _running(self) -> dict[str, list[Workload]]:
        if self.running is None:
            self.running = {}
            workloads = self.ctx.workloads
            for wid in self.ctx.state.slots:
                wl = workloads.get(wid)
                if wl is not None:
                    self.running.setdefault(wl.queue_id, []).append(wl)
        return self.running


def _gpus_in(ctx: Context, wid: str, pool: str) -> float:
    return sum(slot_amounts(s)[0] for s in ctx.state.slots.get(wid, ()) if s.node.pool == pool)
