"""A small generated trace of MIG jobs whose mix of shapes changes, for dynamic vs static MIG.

    python -m scheduling.engine.sim.mig_trace --out sim/mig-trace.csv

Two phases of `phase_s` each: first mostly small instances (1g.10gb, and `auto` memory
requests that map to it), then mostly large ones (3g.40gb). Arrivals are Poisson with the
rate that keeps the MIG slices of `gpus` H100 80 GB devices `load` busy on average for the
phase's mix; durations are exponential with mean `mean_s`, clipped to [5 min, 4 h]; two
teams, drawn at random. The defaults (seed 14) made sim/mig-trace.csv, replayed on
sim/mig-cluster.json (docs/simulator.md, "Dynamic vs static MIG").
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
from dataclasses import dataclass
from pathlib import Path

# Each phase: (profile, weight); "auto" asks 9000 MiB, which maps to 1g.10gb on an H100.
SMALL = (("1g.10gb", 0.55), ("auto", 0.15), ("2g.20gb", 0.2), ("3g.40gb", 0.1))
LARGE = (("1g.10gb", 0.1), ("auto", 0.1), ("2g.20gb", 0.2), ("3g.40gb", 0.6))
SLICES = {"1g.10gb": 1, "auto": 1, "2g.20gb": 2, "3g.40gb": 3}
AUTO_MIB = 9000
COLUMNS = ("id", "submit_time", "duration_s", "team", "gpus", "mig_profile", "gpu_memory_mib")


@dataclass(frozen=True, slots=True)
class Params:
    seed: int = 14
    gpus: int = 16  # MIG devices the load is sized for (7 compute slices each)
    load: float = 0.9  # of their slices, on average, in each phase
    phase_s: float = 4 * 3600.0
    mean_s: float = 3600.0


def rows(params: Params) -> list[tuple[object, ...]]:
    """The trace's rows, by submission time."""
    rng = random.Random(params.seed)
    found: list[tuple[object, ...]] = []
    for phase, mix in enumerate((SMALL, LARGE)):
        mean_slices = sum(SLICES[name] * weight for name, weight in mix)
        rate = params.load * params.gpus * 7 / (mean_slices * params.mean_s)
        t = phase * params.phase_s
        while True:
            t += rng.expovariate(rate)
            if t >= (phase + 1) * params.phase_s:
                break
            profile = rng.choices([n for n, _ in mix], [w for _, w in mix])[0]
            duration = min(max(rng.expovariate(1 / params.mean_s), 300.0), 4 * 3600.0)
            memory = AUTO_MIB if profile == "auto" else ""
            team = rng.choice(("vision", "speech"))
            found.append(
                (f"m{len(found):04d}", round(t, 1), round(duration), team, "", profile, memory)
            )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    defaults = Params()
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--gpus", type=int, default=defaults.gpus)
    parser.add_argument("--load", type=float, default=defaults.load)
    args = parser.parse_args(argv)
    params = Params(seed=args.seed, gpus=args.gpus, load=args.load)
    with args.out.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        writer.writerows(rows(params))
    return 0


if __name__ == "__main__":
    sys.exit(main())
