"""Dynamic MIG on the database side: the instances the cycle's MIG admissions need.

The engine (scheduling/engine/mig.py) chose each MIG pod's instance: an idle one to reuse,
or a new one at a legal start, possibly over idle instances it repartitions. Here those
choices become MigInstance rows, which the nodes then make real (clusters/mig.py): idle
rows under a new instance are deleted, the new row is created. An instance that an
allocation holds is never deleted: a choice that would is refused whole, as an overcommit.
"""

from __future__ import annotations

from clusters.models import Gpu, MigInstance
from scheduling.engine import types as t
from scheduling.engine.mig import profiles_for
from scheduling.models import PodAllocation

Device = tuple[int, int]  # (node id, GPU index)


def mig_instances_apply(admissions: list[t.Admission]) -> str:
    """Create and repartition the instances of the admitted MIG pods; '' when done, or
    why it was refused (nothing is written then)."""
    wanted: dict[Device, list[tuple[str, int, str]]] = {}
    for admission in admissions:
        for pod in admission.pods:
            if pod.mig_gpu is not None:
                key = (int(pod.node_id), pod.mig_gpu)
                wanted.setdefault(key, []).append(
                    (pod.mig_profile, pod.mig_start, admission.workload_id)
                )
    if not wanted:
        return ""
    gpus = {
        (g.node_id, g.index): g
        for g in Gpu.objects.filter(node_id__in={n for n, _ in wanted}).order_by("pk")
    }
    plan: list[tuple[Gpu, list[MigInstance], list[tuple[str, int]]]] = []
    for key, pods in sorted(wanted.items()):
        gpu = gpus.get(key)
        if gpu is None or not gpu.mig_enabled:
            return f"GPU {key} is not MIG-enabled"
        problem, gone, new = _plan_gpu(gpu, pods)
        if problem:
            return problem
        plan.append((gpu, gone, new))
    for gpu, gone, new in plan:
        MigInstance.objects.filter(pk__in=[i.pk for i in gone]).delete()
        MigInstance.objects.bulk_create(MigInstance(gpu=gpu, profile=p, start=s) for p, s in new)
    return ""


def _plan_gpu(
    gpu: Gpu, pods: list[tuple[str, int, str]]
) -> tuple[str, list[MigInstance], list[tuple[str, int]]]:
    """What one GPU's rows must lose and gain for these pods, or why it cannot."""
    profiles = profiles_for(gpu.model, gpu.memory_mib)
    existing = list(MigInstance.objects.filter(gpu=gpu).order_by("start"))
    held = set(
        PodAllocation.objects.filter(
            node_id=gpu.node_id, mig_gpu_index=gpu.index, mig_start__isnull=False
        ).values_list("mig_start", flat=True)
    )
    masks = {i.pk: _mask(profiles, i.profile, i.start) for i in existing}
    gone: list[MigInstance] = []
    new: list[tuple[str, int]] = []
    taken = 0
    for profile, start, wid in pods:
        mask = _mask(profiles, profile, start)
        if not mask:
            return f"{profile} at slice {start} is not a placement of {gpu.model}", [], []
        if mask & taken:
            return f"two MIG pods of this cycle overlap on GPU {gpu.pk}", [], []
        taken |= mask
        same = next((i for i in existing if i.start == start and i.profile == profile), None)
        if same is not None and start not in held:
            continue  # reuse the idle instance
        for inst in existing:
            if masks[inst.pk] & mask:
                if inst.start in held:
                    return f"workload {wid} would destroy a MIG instance in use", [], []
                gone.append(inst)
        new.append((profile, start))
    return "", gone, new


def _mask(profiles: dict, name: str, start: int) -> int:
    profile = profiles.get(name)
    if profile is None or start not in profile.starts:
        return 0
    return profile.mask(start)
