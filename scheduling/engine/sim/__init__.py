"""Trace replay: a discrete-event simulation of a GPU cluster under a scheduling policy.

Entry point: `python -m scheduling.engine.sim --cluster C.json --trace T.csv --out DIR`;
from Python, `simulate()` in scheduling.engine.sim.cli. Formats: docs/simulator.md.
"""

from __future__ import annotations
