"""`manage.py export_trace`: the cluster's history as a trace the simulator replays
(scheduling/trace_export.py; docs/simulator.md, "Your own history")."""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from clusters.models import Cluster
from scheduling.trace_export import quotas_export, trace_export


def moment(option: str, text: str | None) -> dt.datetime | None:
    """An ISO date-time (naive = UTC); CommandError naming the option otherwise."""
    if text is None:
        return None
    try:
        value = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise CommandError(f"{option}: not an ISO date-time: {text!r}") from None
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def write_atomically(path: Path, write: Any) -> Any:
    """Call write(handle) on a temporary file beside `path`, renamed onto it only when
    write returns: a failed export leaves no file (and no half of one)."""
    with tempfile.NamedTemporaryFile(
        "w", dir=path.parent, prefix=f".{path.name}.", delete=False, newline=""
    ) as handle:
        try:
            result = write(handle)
        except BaseException:
            os.unlink(handle.name)
            raise
    os.replace(handle.name, path)
    return result


def _target(option: str, text: str) -> Path:
    path = Path(text)
    if not path.parent.is_dir():
        raise CommandError(f"{option}: no such directory: {str(path.parent)!r}")
    return path


class Command(BaseCommand):
    help = "Write the workloads submitted in a window as the trace simulator's CSV."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--since", help="first submission time (ISO; naive = UTC)")
        parser.add_argument("--until", help="end of the window, excluded (ISO; default now)")
        parser.add_argument("--cluster", help="only workloads placed on this cluster")
        parser.add_argument("--output", help="the CSV file (default: standard output)")
        parser.add_argument("--quotas", help="also write the projects' quotas as quotas JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        since = moment("--since", options["since"])
        until = moment("--until", options["until"])
        if since and until and until <= since:
            raise CommandError(f"--until: must be after --since ({since.isoformat()})")
        cluster = options["cluster"]
        if cluster is not None and not Cluster.objects.filter(name=cluster).exists():
            raise CommandError(f"--cluster: no cluster named {cluster!r}")
        output = _target("--output", options["output"]) if options["output"] else None
        quotas = _target("--quotas", options["quotas"]) if options["quotas"] else None

        def export(handle: Any) -> Any:
            return trace_export(handle, since=since, until=until, cluster=cluster)

        def export_some(handle: Any) -> Any:
            stats = export(handle)
            if not stats.rows:
                raise CommandError("no workload was submitted in the window: nothing to replay")
            return stats

        stats = write_atomically(output, export_some) if output else export_some(self.stdout)
        if quotas is not None:
            body = json.dumps(quotas_export(stats.teams), indent=2, sort_keys=True) + "\n"
            write_atomically(quotas, lambda handle: handle.write(body))
        notes = [f"{stats.rows} workloads"]
        if stats.left_out:
            notes.append(f"{stats.left_out} left out (ended without running)")
        if stats.topology_dropped:
            dropped = stats.topology_dropped
            notes.append(f"topology dropped from {dropped} (a level other than rack)")
        self.stderr.write("export_trace: " + ", ".join(notes))
