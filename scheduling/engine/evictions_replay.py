"""Replay kept cycles' engine inputs and follow the workloads evicted more than once.

    python -m scheduling.engine.evictions_replay FOLDER [--examples N]

FOLDER holds what `manage.py bench_controlplane` pickles with GPUPOOL_BENCH_SNAPSHOT_DIR set
(cycle-0001.pickle ...: each cycle's snapshot, config and time). Each is scheduled again
from scratch (`schedule()`, the decisions the cycle made: the kept engine decides exactly
as it does), in order; the JSON printed says, per cycle, how many evictions and
admissions it decided and how many workloads came and went since the cycle before (a
change in demand), and for the first N workloads evicted twice or more, each eviction
(cycle, reason, for whom, the event's numbers) and each admission between them (as the
beneficiary of evictions, or placed on free GPUs): what a reader needs to tell work
evicted back and forth from work evicted again for a new reason.

Only unpickle folders you made: a pickle runs code as it loads.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from scheduling.engine.cycle import schedule
from scheduling.engine.types import CycleResult, Snapshot


def replay(folder: Path, examples: int = 5) -> dict[str, Any]:
    """The cycles' figures and the histories of the first `examples` workloads evicted
    twice or more (ordered by id)."""
    cycles: list[dict[str, Any]] = []
    history: dict[str, list[dict[str, Any]]] = defaultdict(list)
    evictions: dict[str, int] = defaultdict(int)
    names: dict[str, str] = {}
    seen: set[str] | None = None
    for number, path in enumerate(sorted(folder.glob("cycle-*.pickle")), start=1):
        with path.open("rb") as kept:
            snapshot, config, now = pickle.load(kept)
        ids = {wl.id for wl in snapshot.workloads}
        names.update((wl.id, wl.name or wl.id) for wl in snapshot.workloads)
        result = schedule(snapshot, config, now)
        cycles.append(
            {
                "cycle": number,
                "evictions": len(result.evictions),
                "admissions": len(result.admissions),
                "workloads_gone": None if seen is None else len(seen - ids),
                "workloads_new": None if seen is None else len(ids - seen),
            }
        )
        seen = ids
        _record(number, snapshot, result, history, evictions, names)
    twice = sorted(wid for wid, count in evictions.items() if count > 1)
    return {
        "cycles": cycles,
        "evicted": len(evictions),
        "evicted_twice": len(twice),
        "examples": [{"workload": names[wid], "history": history[wid]} for wid in twice[:examples]],
    }


def _record(
    number: int,
    snapshot: Snapshot,
    result: CycleResult,
    history: dict[str, list[dict[str, Any]]],
    evictions: dict[str, int],
    names: dict[str, str],
) -> None:
    """One cycle's evictions and admissions, into each workload's history."""
    workloads = {wl.id: wl for wl in snapshot.workloads}
    victims: dict[str | None, list[str]] = defaultdict(list)
    for eviction in result.evictions:
        victim = workloads[eviction.workload_id]
        evictions[victim.id] += 1
        victims[eviction.beneficiary].append(victim.id)
        history[victim.id].append(
            {
                "cycle": number,
                "evicted": str(eviction.reason),
                "for": names.get(eviction.beneficiary or "", eviction.beneficiary),
                "detail": eviction.detail,
                "queue": victim.queue_id,
                "priority": victim.priority,
                "restarts": victim.restarts,
            }
        )
    placed = {admission.workload_id for admission in result.admissions}
    for wid in placed | (set(victims) - {None}):
        admitted = {"cycle": number, "queue": workloads[wid].queue_id}  # type: ignore[index]
        if wid in victims:  # placed onto what its victims free (the portal nominates it)
            admitted["after_evicting"] = [names[v] for v in victims[wid]]
        history[wid].append(admitted | {"placed": wid in placed})  # type: ignore[index]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--examples", type=int, default=5)
    args = parser.parse_args(argv)
    json.dump(replay(args.folder, args.examples), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
