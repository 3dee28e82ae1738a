"""The replay of kept engine inputs (scheduling/engine/evictions_replay.py): it schedules
each kept cycle again and follows the workloads evicted more than once."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

from scheduling.engine.evictions_replay import main, replay
from scheduling.engine.types import SchedulerConfig
from tests.engine.test_guarantee import NOW, _borrower


def keep(folder: Path, *snapshots: object) -> None:
    for number, snapshot in enumerate(snapshots, start=1):
        with (folder / f"cycle-{number:04d}.pickle").open("wb") as out:
            pickle.dump((snapshot, SchedulerConfig(), NOW), out)


def test_a_workload_evicted_in_two_cycles_is_followed_with_who_took_its_gpus(tmp_path, capsys):
    # The same snapshot twice: p1's borrowed 8-GPU job is evicted in both for its small one.
    snapshot = _borrower()
    keep(tmp_path, snapshot, snapshot)
    found = replay(tmp_path)
    assert [c["evictions"] for c in found["cycles"]] == [1, 1]
    assert [c["workloads_gone"] for c in found["cycles"]] == [None, 0]
    assert (found["evicted"], found["evicted_twice"]) == (1, 1)
    (example,) = found["examples"]
    assert example["workload"] == "big"
    assert [(h["cycle"], h["evicted"], h["for"]) for h in example["history"]] == [
        (1, "borrowed", "small"),
        (2, "borrowed", "small"),
    ]
    assert main([str(tmp_path), "--examples", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["examples"] == []


def test_a_workload_evicted_once_is_no_example(tmp_path):
    keep(tmp_path, _borrower())
    found = replay(tmp_path)
    assert (found["evicted"], found["evicted_twice"], found["examples"]) == (1, 0, [])
    assert found["cycles"] == [
        {"cycle": 1, "evictions": 1, "admissions": 1, "workloads_gone": None, "workloads_new": None}
    ]
