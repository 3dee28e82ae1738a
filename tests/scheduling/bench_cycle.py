"""Time the scheduling cycle against a real database: N nodes of 8 GPUs, P projects with
W training workloads each. Runs in its own database (set GPUPOOL_VAR_DIR to an empty
folder for SQLite, or run under tests.services for PostgreSQL):

    GPUPOOL_VAR_DIR=$(mktemp -d) .venv/bin/python -m tests.scheduling.bench_cycle 250 40 50
    .venv/bin/python -m tests.services -- .venv/bin/python -m tests.scheduling.bench_cycle 250 40 50
"""

from __future__ import annotations

import os
import sys
from decimal import Decimal

import django


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    django.setup()
    from django.core.management import call_command

    from portal.celery import app
    from scheduling import services, tasks
    from scheduling.cycle import cycle_run
    from scheduling.models import Workload
    from tests import factories as f
    from tests.scheduling.conftest import make_nodes

    call_command("migrate", verbosity=0)
    # No broker here: the cycle is run by hand below.
    app.conf.CELERY_TASK_ALWAYS_EAGER = False
    tasks.request_cycle = services.request_cycle = lambda: None
    nodes, projects, per_project = (int(a) for a in sys.argv[1:4])
    pool = f.make_pool("a100")
    admin = f.make_user("admin", platform_admin=True)
    make_nodes(pool, nodes, 8)
    depts = [f.make_department(f"d{i}") for i in range(4)]
    for d in depts:
        f.make_department_quota(d, pool, gpus=nodes * 8 // 4)
    rows = []
    for i in range(projects):
        p = f.make_project(depts[i % 4], f"p{i}")
        f.make_project_quota(p, pool, gpus=nodes * 8 // projects)
        rows += [
            Workload(project=p, submitted_by=admin, kind="training", name=f"w{j}", image="x",
                     gpus=Decimal((j % 4) + 1), priority=50)
            for j in range(per_project)
        ]  # fmt: skip
    Workload.objects.bulk_create(rows, batch_size=1000)
    print(f"{len(rows)} workloads, {nodes * 8} GPUs")
    for k in range(3):
        r = cycle_run()
        print(
            f"cycle {k}: total {r.duration_ms:.0f} ms, engine {r.engine_ms:.0f} ms, "
            f"admitted {r.admitted}, evicted {r.evicted}, pending {r.pending}, ok {r.ok}"
        )


if __name__ == "__main__":
    main()
