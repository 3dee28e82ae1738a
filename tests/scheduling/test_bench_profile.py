"""bench_controlplane's optional profile of one arrival's steps (GPUPOOL_BENCH_PROFILE_DIR):
the step runs and answers as without it, and its statistics land where asked."""

from __future__ import annotations

import pstats

from scheduling.bench_controlplane.steps import profiled


def _step() -> int:
    return sum(range(1000))


def test_a_profiled_step_answers_as_without_and_writes_its_statistics(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPOOL_BENCH_PROFILE_DIR", str(tmp_path))
    assert profiled("arrival-targeted-cycle-0", _step) == sum(range(1000))
    stats = pstats.Stats(str(tmp_path / "arrival-targeted-cycle-0.prof"))
    assert any(name == "_step" for _, _, name in stats.stats)  # type: ignore[attr-defined]


def test_without_the_setting_nothing_is_profiled(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUPOOL_BENCH_PROFILE_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert profiled("arrival-targeted-cycle-0", _step) == sum(range(1000))
    assert list(tmp_path.iterdir()) == []
