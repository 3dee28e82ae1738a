"""HPO sweeps: a search space expanded into trial workloads, a few running at a time.

    search = {"method": "grid" | "random",
              "parameters": {"lr": [0.1, 0.01], "wd": {"min": 0.0, "max": 0.1}},
              "trials": 8,          # random search only; grid runs every combination
              "parallelism": 2,     # trials admitted at once
              "seed": 1}

A trial gets its parameters in its environment: one variable per parameter (upper-cased,
e.g. LR=0.01) and GPUPOOL_TRIAL_PARAMS as JSON, so any program can read them.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re
from typing import Any

from scheduling import bounds
from scheduling.bounds import Bound

MAX_TRIALS = int(bounds.TRIALS.high)
PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # matched whole
Errors = dict[str, list[str]]


def clean_search(value: Any, errors: Errors) -> dict[str, Any]:
    """The validated search space; problems go under the `search` field."""
    problems: list[str] = []
    if not isinstance(value, dict):
        errors.setdefault("search", []).append("Give the search method, parameters and trials.")
        return {}
    if too_big := bounds.PARAMS.check(value):  # every trial stores and returns its values
        errors.setdefault("search", []).append(too_big)
        return {}
    method = value.get("method", "grid")
    if method not in ("grid", "random"):
        problems.append("The search method is grid or random.")
    params = value.get("parameters")
    if not isinstance(params, dict) or not params:
        problems.append("Give at least one parameter to search.")
        params = {}
    for name, space in params.items():
        problems.extend(_space_problems(str(name), space, method))
    search = {
        "method": method,
        "parameters": params,
        "parallelism": _whole(value.get("parallelism", 1), "parallelism", bounds.TRIALS, problems),
        "seed": _whole(value.get("seed", 0), "seed", bounds.SEED, problems),
    }
    if method == "random":
        search["trials"] = _whole(value.get("trials", 1), "trials", bounds.TRIALS, problems)
    if not problems and trial_count(search) > MAX_TRIALS:
        problems.append(f"A sweep runs at most {MAX_TRIALS} trials.")
    if problems:
        errors.setdefault("search", []).extend(problems)
    return search


def _space_problems(name: str, space: Any, method: str) -> list[str]:
    if not PARAM_NAME.fullmatch(name):
        return [f"Parameter {name!r} is not a valid variable name."]
    if isinstance(space, list):
        return [] if space else [f"Parameter {name} has no values."]
    if method == "random" and isinstance(space, dict):
        low, high = space.get("min"), space.get("max")
        numbers = isinstance(low, int | float) and isinstance(high, int | float)
        if not numbers or low >= high:
            return [f"Parameter {name} needs numbers min < max."]
        if space.get("log") and low <= 0:
            return [f"Parameter {name} on a log scale needs min > 0."]
        return []
    return [f"Parameter {name}: give a list of values (or min/max for random search)."]


def _whole(value: Any, field: str, bound: Bound, problems: list[str]) -> int:
    number, error = bound.whole(value)
    if number is None:
        problems.append(f"{field.capitalize()}: {error}")
        return int(bound.low)
    return number


def trial_count(search: dict[str, Any]) -> int:
    if search["method"] == "random":
        return int(search["trials"])
    return math.prod(len(values) for values in search["parameters"].values())


def trial_params(search: dict[str, Any]) -> list[dict[str, Any]]:
    """Every trial's parameters, in a fixed order (the seed makes random search repeatable)."""
    names = sorted(search["parameters"])
    spaces = [search["parameters"][name] for name in names]
    if search["method"] == "grid":
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*spaces)]
    rng = random.Random(search["seed"])
    return [
        {name: _draw(rng, space) for name, space in zip(names, spaces, strict=True)}
        for _ in range(search["trials"])
    ]


def _draw(rng: random.Random, space: Any) -> Any:
    if isinstance(space, list):
        return rng.choice(space)
    low, high = space["min"], space["max"]
    if space.get("log"):
        return math.exp(rng.uniform(math.log(low), math.log(high)))
    if isinstance(low, int) and isinstance(high, int):
        return rng.randint(low, high)
    return rng.uniform(low, high)


def trial_env(base: dict[str, str], index: int, params: dict[str, Any]) -> dict[str, str]:
    env = dict(base)
    env.update({name.upper(): str(value) for name, value in params.items()})
    env["GPUPOOL_TRIAL_INDEX"] = str(index)
    env["GPUPOOL_TRIAL_PARAMS"] = json.dumps(params, sort_keys=True)
    return env
