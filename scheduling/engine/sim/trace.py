"""Reading a workload trace (CSV) into immutable trace jobs.

Columns: submit_time (seconds, or an ISO date-time), duration_s (empty = never ends), team,
gpus, and optionally id, pods, gpu_model (models separated by `|`), cpu, memory_gib,
priority, preemptible, topology_level, topology_required, min_pods, max_pods,
handles_resize. With a `pods` (or `max_pods`) column, gpus is per pod; without it gpus is the
job's total and a job over one node's worth is split into a gang of equal pods. gpus = 0 is
a CPU-only job (it must ask for cpu or memory_gib). A `min_pods` below the pods makes the
job elastic: it runs with min_pods .. pods pods, its work scaling with its size, and
restarts from its checkpoint when its size changes unless handles_resize says yes.
A `mig_profile` (a MIG profile such as 3g.40gb, or `auto` with `gpu_memory_mib`: the
smallest profile that holds that memory) makes each pod take one MIG instance; gpus is
then empty or 1, and the job counts as the profile's slices / 7 of a GPU.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from scheduling.engine.mig import AUTO, known_profile, pod_fraction
from scheduling.engine.types import PodRequest

TRUE_WORDS = frozenset({"1", "true", "yes", "y", "t"})
FALSE_WORDS = frozenset({"0", "false", "no", "n", "f"})
# Topology levels the simulated nodes carry (specs.NodeSpec.rack); a job may ask that its
# gang stay inside one domain of these.
TOPOLOGY_LEVELS = ("rack",)
MAX_GPU_MEMORY_MIB = 1 << 20  # a MIG request by memory: at most 1 TiB


class TraceError(ValueError):
    """A row of the trace cannot be read; the message names the row."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of the trace. submit is seconds after the trace's first submission."""

    id: str
    team: str
    submit: float
    duration: float | None  # None: runs until the simulation ends
    pods: int
    gpus_per_pod: float  # an integer count, or a fraction of one GPU below 1
    gpu_models: tuple[str, ...] = ()
    cpu: float = 0.0  # cores per pod
    memory_gib: float = 0.0  # per pod
    priority: int = 0
    preemptible: bool = True
    topology_level: str = ""  # keep the gang inside one domain of this level ("" = anywhere)
    topology_required: bool = True  # False: only preferred
    min_pods: int | None = None  # elastic: runs with min_pods .. pods pods
    handles_resize: bool = False  # elastic: a size change costs no restart
    mig_profile: str = ""  # each pod takes one MIG instance of this profile ("auto": by memory)
    gpu_memory_mib: int = 0  # with mig_profile "auto": the memory the instance must hold

    @property
    def elastic(self) -> bool:
        """True when the job may run with fewer pods than it asks for."""
        return self.min_pods is not None and self.min_pods < self.pods

    @property
    def gpus(self) -> float:
        """GPUs the whole job holds while it runs."""
        return self.pods * self.gpus_per_pod

    @property
    def is_cpu_only(self) -> bool:
        """True when the pods ask for no GPU at all."""
        return self.gpus_per_pod == 0

    @property
    def is_fractional(self) -> bool:
        """True when each pod takes part of one shared GPU (MIG pods take an instance)."""
        return 0 < self.gpus_per_pod < 1 and not self.mig_profile


def parse_time(text: str) -> float:
    """Seconds from a number or an ISO date-time (naive times are taken as UTC)."""
    try:
        return float(text)
    except ValueError:
        pass
    moment = datetime.fromisoformat(text.strip())
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def parse_bool(text: str, default: bool) -> bool:
    """A yes/no cell; empty keeps the default."""
    word = text.strip().lower()
    if not word:
        return default
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"not a yes/no value: {text!r}")


def parse_gpus(text: str) -> float:
    """An integer GPU count, or a fraction strictly between 0 and 1."""
    value = float(text)
    if value < 0 or (value >= 1 and not value.is_integer()):
        raise ValueError(f"gpus must be an integer or a fraction below 1, not {text!r}")
    return value


def split_gang(total_gpus: float, gpus_per_node: int) -> tuple[int, float]:
    """(pods, gpus per pod) for a job given as a total: over one node it becomes a gang."""
    if total_gpus <= gpus_per_node:
        return 1, total_gpus
    pods = math.ceil(total_gpus / gpus_per_node)
    return pods, float(math.ceil(total_gpus / pods))


def _cell(row: dict[str, str | None], name: str) -> str:
    return (row.get(name) or "").strip()


def _optional_float(row: dict[str, str | None], name: str) -> float:
    text = _cell(row, name)
    return float(text) if text else 0.0


def _mig_cells(row: dict[str, str | None]) -> tuple[str, int, float | None]:
    """(mig_profile, gpu_memory_mib, GPUs per pod) of a row; GPUs None when it asks no MIG."""
    profile = _cell(row, "mig_profile")
    memory_text = _cell(row, "gpu_memory_mib")
    if not profile:
        if memory_text:
            raise ValueError("gpu_memory_mib: asks MIG by memory, so needs mig_profile auto")
        return "", 0, None
    try:
        memory = int(memory_text) if memory_text else 0
    except ValueError:
        raise ValueError(f"gpu_memory_mib: not a whole number of MiB: {memory_text!r}") from None
    if profile == AUTO and not 0 < memory <= MAX_GPU_MEMORY_MIB:
        raise ValueError(f"gpu_memory_mib: mig_profile auto needs 1 .. {MAX_GPU_MEMORY_MIB} MiB")
    if profile != AUTO and memory:
        raise ValueError("gpu_memory_mib: goes with mig_profile auto only")
    if not known_profile(profile, memory):
        raise ValueError(f"mig_profile: no MIG-capable GPU offers {profile!r}")
    if _cell(row, "gpus") not in ("", "1"):
        raise ValueError("gpus: must be empty or 1 with a mig_profile (one instance per pod)")
    return profile, memory, pod_fraction(PodRequest(mig_profile=profile, gpu_memory_mib=memory))


def _job_from_row(row: dict[str, str | None], number: int, gpus_per_node: int) -> TraceJob:
    mig_profile, gpu_memory, mig_gpus = _mig_cells(row)
    gpus = mig_gpus if mig_gpus is not None else parse_gpus(_cell(row, "gpus"))
    pods_text = _cell(row, "max_pods") or _cell(row, "pods")
    if _cell(row, "max_pods") and _cell(row, "pods") and _cell(row, "pods") != pods_text:
        raise ValueError("pods and max_pods differ; give one of them")
    if pods_text:
        pods, per_pod = int(pods_text), gpus
    else:
        pods, per_pod = split_gang(gpus, gpus_per_node)
    cpu, memory = _optional_float(row, "cpu"), _optional_float(row, "memory_gib")
    if pods < 1:
        raise ValueError("a job needs at least one pod")
    if per_pod == 0 and cpu <= 0 and memory <= 0:
        raise ValueError("a CPU-only job (gpus = 0) must ask for cpu or memory_gib")
    level = _cell(row, "topology_level")
    if level and level not in TOPOLOGY_LEVELS:
        raise ValueError(
            f"topology_level must be one of {', '.join(TOPOLOGY_LEVELS)}, not {level!r}"
        )
    required_text = _cell(row, "topology_required")
    if required_text and not level:
        raise ValueError("topology_required needs a topology_level")
    duration_text = _cell(row, "duration_s")
    models = tuple(m.strip() for m in _cell(row, "gpu_model").split("|") if m.strip())
    priority_text = _cell(row, "priority")
    min_text = _cell(row, "min_pods")
    min_pods = int(min_text) if min_text else None
    if min_pods is not None and not 1 <= min_pods <= pods:
        raise ValueError(f"min_pods must be between 1 and the pods ({pods}), not {min_pods}")
    return TraceJob(
        id=_cell(row, "id") or f"j{number:05d}",
        team=_cell(row, "team") or "default",
        submit=parse_time(_cell(row, "submit_time")),
        duration=float(duration_text) if duration_text else None,
        pods=pods,
        gpus_per_pod=per_pod,
        gpu_models=models,
        cpu=cpu,
        memory_gib=memory,
        priority=int(priority_text) if priority_text else 0,
        preemptible=parse_bool(_cell(row, "preemptible"), default=True),
        topology_level=level,
        topology_required=parse_bool(required_text, default=True),
        min_pods=min_pods,
        handles_resize=parse_bool(_cell(row, "handles_resize"), default=False),
        mig_profile=mig_profile,
        gpu_memory_mib=gpu_memory,
    )


def made_elastic(
    jobs: list[TraceJob], from_gpus: float, unit: int = 1, handles_resize: bool = False
) -> list[TraceJob]:
    """The trace with every job of at least `from_gpus` whole GPUs made elastic: pods of
    `unit` GPUs each (a data-parallel worker per `unit` GPUs), able to run at half its
    size or more (min_pods = half its pods, rounded up); `handles_resize`: resized without
    a restart. Other jobs are unchanged."""
    found = []
    for job in jobs:
        gpus = job.gpus
        if job.is_fractional or gpus < from_gpus or gpus % unit:
            found.append(job)
            continue
        pods = int(gpus) // unit
        half = -(-pods // 2)
        elastic = replace(job, pods=pods, gpus_per_pod=float(unit), min_pods=half)
        found.append(replace(elastic, handles_resize=handles_resize))
    return found


def read_trace(path: Path, gpus_per_node: int = 8) -> tuple[list[TraceJob], float]:
    """The trace's jobs sorted by submission, times shifted so the first submit is 0.

    Returns the jobs and the absolute time of the first submission (the origin).
    """
    jobs: list[TraceJob] = []
    with path.open(newline="") as handle:
        for number, row in enumerate(csv.DictReader(handle), start=1):
            try:
                jobs.append(_job_from_row(row, number, gpus_per_node))
            except (ValueError, KeyError) as error:
                raise TraceError(f"{path}: row {number + 1}: {error}") from error
    if not jobs:
        raise TraceError(f"{path}: the trace has no jobs")
    if len({job.id for job in jobs}) != len(jobs):
        raise TraceError(f"{path}: job ids are not unique")
    origin = min(job.submit for job in jobs)
    shifted = [replace(job, submit=job.submit - origin) for job in jobs]
    shifted.sort(key=lambda job: (job.submit, job.id))
    return shifted, origin
