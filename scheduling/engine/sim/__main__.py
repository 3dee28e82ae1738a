"""`python -m scheduling.engine.sim`: see scheduling.engine.sim.cli."""

from __future__ import annotations

import sys

from scheduling.engine.sim.cli import main

sys.exit(main())
