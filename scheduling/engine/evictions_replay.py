"""Replay kept cycles' engine inputs and follow the workloads evicted more than once.

    python -m scheduling.engine.evictions_replay FOLDER [--examples N]
    python -m scheduling.engine.evictions_replay FOLDER --settle-from K [--searches S]

FOLDER holds what `manage.py bench_controlplane` pickles with GPUPOOL_BENCH_SNAPSHOT_DIR set
(cycle-0001.pickle ...: each cycle's snapshot, config and time). Each is scheduled again
from scratch (`schedule()`, the decisions the cycle made: the kept engine decides exactly
as it does), in order; the JSON printed says, per cycle, how many evictions and
admissions it decided and how many workloads came and went since the cycle before (a
change in demand), and for the first N workloads evicted twice or more, each eviction
(cycle, reason, for whom, the event's numbers) and each admission between them (as the
beneficiary of evictions, or placed on free GPUs): what a reader needs to tell work
evicted back and forth from work evicted again for a new reason.

With --settle-from K, the engine alone runs on from cycle K's input, each result applied
(`settle()`), until a cycle decides nothing: how the engine itself settles that state
(with S victim searches a cycle), in the same terms.

Only unpickle folders you made: a pickle runs code as it loads.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

from scheduling.engine.apply import apply_result
from scheduling.engine.cycle import Engine, schedule
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
    return _summary(cycles, history, evictions, names, examples)


def settle(
    path: Path,
    examples: int = 5,
    searches: int | None = None,
    limit: int = 60,
    period: float = 10.0,
) -> dict[str, Any]:
    """The engine alone from one kept cycle's input: each result applied to the snapshot
    (apply_result: victims gone and beneficiaries running at once, an eviction counted as
    a restart) and the next cycle run `period` seconds later, until one decides nothing
    (at most `limit` cycles). How the engine settles that state by itself, with `searches`
    victim searches a cycle (the kept config's when None), in replay()'s terms, with
    `settled` saying whether it got there."""
    with path.open("rb") as kept:
        snapshot, config, now = pickle.load(kept)
    if searches is not None:
        config = replace(config, max_victim_searches=searches)
    engine = Engine()
    cycles: list[dict[str, Any]] = []
    history: dict[str, list[dict[str, Any]]] = defaultdict(list)
    evictions: dict[str, int] = defaultdict(int)
    names = {wl.id: wl.name or wl.id for wl in snapshot.workloads}
    settled = False
    for number in range(1, limit + 1):
        result = engine.schedule(snapshot, config, now)
        cycles.append(
            {
                "cycle": number,
                "evictions": len(result.evictions),
                "admissions": len(result.admissions),
            }
        )
        _record(number, snapshot, result, history, evictions, names)
        if not result.evictions and not result.admissions:
            settled = True
            break
        snapshot = apply_result(snapshot, result, now)
        now += period
    return {"settled": settled} | _summary(cycles, history, evictions, names, examples)


def _summary(
    cycles: list[dict[str, Any]],
    history: dict[str, list[dict[str, Any]]],
    evictions: dict[str, int],
    names: dict[str, str],
    examples: int,
) -> dict[str, Any]:
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
    parser.add_argument(
        "--settle-from",
        type=int,
        metavar="N",
        help="run the engine alone from cycle N's input until it settles (settle())",
    )
    parser.add_argument("--searches", type=int, help="with --settle-from: searches a cycle")
    args = parser.parse_args(argv)
    if args.settle_from is None:
        found = replay(args.folder, args.examples)
    else:
        path = args.folder / f"cycle-{args.settle_from:04d}.pickle"
        found = settle(path, args.examples, args.searches)
    json.dump(found, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
