"""`gpupool`: the command line over the REST API.

    gpupool login --url http://gpupool.example --username rita
    gpupool project list | gpupool project set ml-vision
    gpupool submit training resnet --image pytorch/pytorch:2.3 --gpus 2 -- python train.py
    gpupool submit -f job.yaml [--project P] [--cluster C]   (a Kubernetes manifest)
    gpupool list | describe ID | logs ID | stop ID | delete ID | queue
    gpupool ssh-key add ~/.ssh/id_ed25519.pub; gpupool ssh ID [-- CMD] | ssh-config ID

Settings live in ~/.config/gpupool/config.json (GPUPOOL_CONFIG_DIR moves the folder;
GPUPOOL_URL and GPUPOOL_TOKEN override what is saved). Errors print the API's message
and exit with status 1.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import threading
import time
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import click
import requests
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import connect as ws_connect

from scheduling import bounds
from scheduling.bounds import Bound

TIMEOUT_S = 30
# An object's address in the API (`/api/v1/workloads/12/...`): a 404 there is said as "No
# workload 12 that you can see." (the API answers every 404 alike: "Not found.").
OBJECT_PATH = re.compile(r"^/api/v1/(?P<kind>[a-z-]+?)s/(?P<id>\d+)/")


# --- Configuration and HTTP ------------------------------------------------------------


def config_path() -> Path:
    base = os.environ.get("GPUPOOL_CONFIG_DIR") or Path.home() / ".config" / "gpupool"
    return Path(base) / "config.json"


def load_config() -> dict[str, Any]:
    path = config_path()
    try:
        config = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"Cannot read {path}: {exc}. Log in again.") from exc
    if not isinstance(config, dict):
        raise click.ClickException(f"Cannot read {path}: not a settings object. Log in again.")
    if os.environ.get("GPUPOOL_URL"):
        config["url"] = os.environ["GPUPOOL_URL"]
    if os.environ.get("GPUPOOL_TOKEN"):
        config["token"] = os.environ["GPUPOOL_TOKEN"]
    return config


def save_config(config: dict[str, Any]) -> None:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)  # it holds an API token


class Api:
    """A thin client: every failure becomes a ClickException with the API's message."""

    def __init__(self, config: dict[str, Any]):
        if not config.get("url"):
            raise click.ClickException("Not logged in: run `gpupool login --url URL` first.")
        self.url = config["url"].rstrip("/")
        self.headers = {"Authorization": f"Token {config['token']}"} if config.get("token") else {}

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = requests.request(
                method, f"{self.url}{path}", headers=self.headers, timeout=TIMEOUT_S, **kwargs
            )
        except requests.RequestException as exc:
            raise click.ClickException(f"Cannot reach {self.url}: {exc}") from exc
        if response.status_code == 401 and self.headers:
            raise click.ClickException(
                f"{error_message(response)} The saved token has expired or was revoked: "
                "run `gpupool login` again."
            )
        if response.status_code == 404 and (found := OBJECT_PATH.match(path)):
            kind = found["kind"].replace("-", " ")
            raise click.ClickException(f"No {kind} {found['id']} that you can see.")
        if response.status_code >= 400:
            raise click.ClickException(error_message(response))
        return response.json() if response.content else None


def error_message(response: requests.Response) -> str:
    """The API's own words: field messages as 'field: message', or its detail."""
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}: {response.text[:200]}"
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    if isinstance(body, dict):
        lines = []
        for field, messages in body.items():
            text = " ".join(messages) if isinstance(messages, list) else str(messages)
            lines.append(text if field == "non_field_errors" else f"{field}: {text}")
        return "\n".join(lines)
    return str(body)


# Columns holding GPU amounts: shown as the pages show them (2, 0.5, 2.33), not 2.00.
AMOUNTS = {"gpus", "gpus_allocated", "deserved", "fair_share", "allocated", "over_quota"}


def amount(value: Any) -> str:
    """A GPU amount with at most two decimals and no trailing zeros; other text as is."""
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        return str(value)
    if not number.is_finite():
        return str(value)
    text = f"{number.quantize(Decimal('0.01'), rounding=ROUND_HALF_UP):f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _cell(row: dict[str, Any], column: str) -> str:
    value = row.get(column)
    if value is None:
        return ""
    return amount(value) if column in AMOUNTS else str(value)


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A plain text table, one row per line, columns padded to their widest cell."""
    cells = [[_cell(row, c) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


@click.group()
@click.pass_context
def main(ctx: click.Context) -> None:
    """GPUPool: submit and follow work on the shared GPU pool."""
    try:
        ctx.obj = load_config()
    except click.ClickException:
        if ctx.invoked_subcommand != "login":
            raise
        ctx.obj = {}  # logging in writes a fresh one


def api_of(ctx: click.Context) -> Api:
    return Api(ctx.obj)


# --- login, projects -------------------------------------------------------------------


@main.command()
@click.option("--url", help="The portal's address, e.g. https://gpupool.example.")
@click.option("--username", prompt=True)
@click.option("--password", prompt=True, hide_input=True)
@click.pass_context
def login(ctx: click.Context, url: str | None, username: str, password: str) -> None:
    """Get an API token and save it."""
    config = ctx.obj
    if url:
        config["url"] = url
    config.pop("token", None)
    body = Api(config).call(
        "POST", "/api/v1/auth/token", json={"username": username, "password": password}
    )
    config.update(token=body["token"], username=body["username"])
    save_config(config)
    expiry = f" The token expires at {body['expiry']}." if body.get("expiry") else ""
    click.echo(f"Logged in to {config['url']} as {body['username']}.{expiry}")


@main.group(invoke_without_command=True)
@click.pass_context
def project(ctx: click.Context) -> None:
    """Your projects and the default one for other commands (alone: the default)."""
    if ctx.invoked_subcommand is None:
        current = ctx.obj.get("project")
        click.echo(
            f"Default project: {current}." if current
            else "No default project: `gpupool project set NAME` (`gpupool project list`)."
        )  # fmt: skip


@project.command("list")
@click.pass_context
def project_list(ctx: click.Context) -> None:
    projects = api_of(ctx).call("GET", "/api/v1/projects/")
    current = ctx.obj.get("project")
    for row in projects:
        row["default"] = "*" if row["name"] == current else ""
    click.echo(table(projects, ["default", "name", "department_name", "namespace"]))


@project.command("set")
@click.argument("name")
@click.pass_context
def project_set(ctx: click.Context, name: str) -> None:
    names = [p["name"] for p in api_of(ctx).call("GET", "/api/v1/projects/")]
    if name not in names:
        raise click.ClickException(f"No project {name} among yours: {', '.join(names)}.")
    ctx.obj["project"] = name
    save_config(ctx.obj)
    click.echo(f"Default project: {name}.")


def project_of(ctx: click.Context, given: str | None) -> str:
    name = given or ctx.obj.get("project")
    if not name:
        raise click.ClickException("Give --project or run `gpupool project set NAME`.")
    return name


# --- submit ----------------------------------------------------------------------------


class Bounded(click.ParamType):
    """A number within one of scheduling.bounds' limits, checked before anything is sent:
    whole numbers as int, others as the decimal text the API takes."""

    name = "number"

    def __init__(self, bound: Bound) -> None:
        self.bound = bound

    def convert(self, value: Any, param: Any, ctx: click.Context | None) -> Any:
        number, error = self.bound.check(value)
        if number is None:
            self.fail(error or self.bound.describe(), param, ctx)
        return int(number) if self.bound.places == 0 else bounds.fmt(number)


ID = Bounded(bounds.ID)


class GpuAmount(Bounded):
    """--gpus: a number within bounds.GPUS, or a range of whole GPUs MIN..MAX."""

    name = "gpus"

    def convert(self, value: Any, param: Any, ctx: click.Context | None) -> Any:
        if ".." not in str(value):
            return super().convert(value, param, ctx)
        low, _, high = str(value).partition("..")
        ends = [bounds.GPU_RANGE.check(end.strip()) for end in (low, high)]
        if any(number is None for number, _ in ends):
            self.fail(f"A GPU range is MIN..MAX: {bounds.GPU_RANGE.describe()}", param, ctx)
        return f"{int(ends[0][0] or 0)}..{int(ends[1][0] or 0)}"


def with_options(command: Any, options: list[Any]) -> Any:
    for option in reversed(options):
        command = option(command)
    return command


# What every submission asks for, workspaces included.
RESOURCE_OPTIONS = [
    click.option("--project", help="Defaults to `gpupool project set`."),
    click.option(
        "--gpus",
        type=GpuAmount(bounds.GPUS),
        default="0",
        help="Whole GPUs per pod, a fraction like 0.5, or a range 2..4 (training, one pod).",
    ),
    click.option(
        "--gpu-memory",
        type=Bounded(bounds.GPU_MEMORY_MIB),
        help="GPU memory per pod in MiB (shared GPU).",
    ),
    click.option("--cpu", type=Bounded(bounds.CPU), default="1", help="CPU cores per pod."),
    click.option(
        "--memory", type=Bounded(bounds.MEMORY_MIB), default=4096, help="Memory per pod in MiB."
    ),
    click.option("--env", "-e", multiple=True, help="NAME=value, repeatable."),
]


def resource_options(command: Any) -> Any:
    return with_options(command, RESOURCE_OPTIONS)


def submit_options(command: Any) -> Any:
    """The options every batch kind shares; kind-specific ones are on each command."""
    options = [
        *RESOURCE_OPTIONS,
        click.option("--image", required=True, help="Container image."),
        click.option("--node-pool", multiple=True, help="Allowed pool, in order; repeatable."),
        click.option("--gpu-model", default="", help="e.g. A100|H100."),
        click.option("--priority-class", type=click.Choice(["build", "train", "inference"])),
        click.option("--preemptible/--not-preemptible", default=None),
        click.option(
            "--max-runtime", type=Bounded(bounds.RUNTIME_S), help="Seconds before it is stopped."
        ),
        click.option(
            "--pids-max",
            type=Bounded(bounds.PIDS_MAX),
            help="Processes and threads per pod (local clusters), at most the cluster's limit.",
        ),
        click.option(
            "--duration", type=Bounded(bounds.DURATION_S), help="Simulated clusters: seconds."
        ),
        click.option("--ssh", is_flag=True, help="Start an SSH server with your keys."),
        click.argument("name"),
        click.argument("command", nargs=-1),
    ]
    return with_options(command, options)


def gpu_request(gpus: str, memory: int | None) -> dict[str, Any]:
    """--gpus 2 (whole), --gpus 0.5 (a fraction), --gpus 2..4 (a GPU range: training) or
    --gpu-memory MiB, as the API's fields."""
    if memory:
        return {"gpu_request": "memory", "gpu_memory_mib": memory, "gpus": 0}
    if ".." in str(gpus):
        low, _, high = str(gpus).partition("..")
        return {"gpu_request": "whole", "min_gpus": int(low), "max_gpus": int(high)}
    try:
        fraction = "." in str(gpus) and float(gpus) < 1
    except ValueError:
        fraction = False  # the API says what is wrong with it
    return {"gpu_request": "fraction" if fraction else "whole", "gpus": gpus}


def submission(kind: str, options: dict[str, Any]) -> dict[str, Any]:
    """The API body for `gpupool submit <kind>`."""
    body: dict[str, Any] = {"kind": kind}
    body.update(gpu_request(options.pop("gpus"), options.pop("gpu_memory")))
    renames = {"memory": "memory_mib", "node_pool": "node_pools", "max_runtime": "max_runtime_s",
               "duration": "duration_s", "scale_cooldown": "scale_cooldown_s",
               "scale_requests": "scale_target_requests",
               "checkpoint_interval": "checkpoint_interval_s"}  # fmt: skip
    for key, value in options.items():
        if value not in (None, (), ""):
            body[renames.get(key, key)] = value
    body["node_pools"] = list(body.get("node_pools", []))
    body["env"] = env_of(options.get("env", ()))
    body["command"] = list(body.get("command", []))
    return body


def env_of(items: tuple[str, ...]) -> dict[str, str]:
    if bad := [item for item in items if "=" not in item]:
        raise click.ClickException(f"--env takes NAME=value, not {bad[0]!r}.")
    return dict(item.split("=", 1) for item in items)


def submit_and_report(ctx: click.Context, kind: str, options: dict[str, Any]) -> None:
    options["project"] = project_of(ctx, options.get("project"))
    body = submission(kind, options)
    workload = api_of(ctx).call("POST", "/api/v1/workloads/", json=body)
    click.echo(f"Submitted {workload['project']}/{workload['name']} (id {workload['id']}): "
               f"{workload['state']}.")  # fmt: skip
    runs = workload.get("runs") or {}
    if runs.get("summary"):
        # simulated: True (nothing will run), None (it may land where nothing runs), False
        prefix = {True: "Warning: ", None: "Note: "}.get(runs.get("simulated"), "")
        click.echo(prefix + runs["summary"], err=runs.get("simulated") is True)
    if workload.get("notice"):
        click.echo(f"Note: {workload['notice']}", err=True)


@main.group(invoke_without_command=True)
@click.option(
    "-f",
    "--file",
    "manifest",
    type=click.File("r"),
    help="A Kubernetes manifest, one object, to create in the project's namespace with "
    "GPUPool's scheduler on its pod templates: a Pod or batch/v1 Job, or another kind the "
    "project allows (CronJob, Deployment, StatefulSet, JobSet, PyTorchJob and the other "
    "Kubeflow jobs, RayCluster, RayJob, LeaderWorkerSet: a refusal lists those it "
    "allows); '-' reads it from standard input.",
)
@click.option("--project", help="With -f: the project (default: `gpupool project set`).")
@click.option("--cluster", help="With -f: the Kubernetes cluster, when the project has several.")
@click.pass_context
def submit(ctx: click.Context, manifest: Any, project: str | None, cluster: str | None) -> None:
    """Submit work: training, distributed, workspace or inference; or a Kubernetes
    manifest: `gpupool submit -f job.yaml`."""
    if manifest is None:
        if ctx.invoked_subcommand is None:
            click.echo(ctx.get_help())
        elif project or cluster:
            raise click.UsageError("--project and --cluster here go with -f; give them after "
                                   f"`{ctx.invoked_subcommand}`.")  # fmt: skip
        return
    if ctx.invoked_subcommand is not None:
        raise click.UsageError("Give either -f MANIFEST or a kind to submit, not both.")
    text = manifest.read(bounds.MANIFEST_MAX_BYTES + 1)  # the server says what is too large
    body = {"project": project_of(ctx, project), "manifest": text, "cluster": cluster or ""}
    made = api_of(ctx).call("POST", "/api/v1/manifests/", json=body)
    click.echo(made["message"])


ELASTIC_OPTIONS = [
    click.option(
        "--max-pods",
        type=Bounded(bounds.PODS),
        help="Elastic: starts with --min-pods (default 1), grows with idle GPUs up to this.",
    ),
    click.option(
        "--handles-resize",
        is_flag=True,
        default=None,
        help="Elastic: it follows size changes itself (no restart from its checkpoint).",
    ),
]


def elastic_options(command: Any) -> Any:
    return with_options(command, ELASTIC_OPTIONS)


CHECKPOINT_OPTIONS = [
    click.option("--checkpoint-dir", help="Where it saves checkpoints to resume from."),
    click.option(
        "--checkpoint-interval",
        type=Bounded(bounds.CHECKPOINT_INTERVAL_S),
        help="Seconds between its checkpoints: preemption for over-quota work may wait for "
        "one due soon (an owner taking back its guaranteed quota never waits).",
    ),
]


def checkpoint_options(command: Any) -> Any:
    return with_options(command, CHECKPOINT_OPTIONS)


@submit.command("training")
@submit_options
@checkpoint_options
@click.option("--min-pods", type=Bounded(bounds.PODS), help="Elastic: with --max-pods.")
@elastic_options
@click.pass_context
def submit_training(ctx: click.Context, **options: Any) -> None:
    """Training: one pod, or an elastic range of pods (--min-pods .. --max-pods).

    gpupool submit training NAME --image IMG -- python train.py"""
    submit_and_report(ctx, "training", options)


@submit.command("distributed")
@submit_options
@click.option("--workers", type=Bounded(bounds.PODS), default=2, show_default=True)
@click.option("--master", is_flag=True, help="Add a master pod.")
@click.option(
    "--min-pods",
    type=Bounded(bounds.PODS),
    help="Gang minimum (default all pods); with --max-pods, the elastic minimum.",
)
@checkpoint_options
@elastic_options
@click.pass_context
def submit_distributed(ctx: click.Context, **options: Any) -> None:
    """A gang of workers (and a master), all started together."""
    submit_and_report(ctx, "distributed", options)


@submit.command("workspace")
@click.argument("name")
@resource_options
@click.option("--environment", help="An environment of the launch form; needed when several.")
@click.option("--node-pool", help="The pool to run in; default: where processes really run.")
@click.option("--data-volume", default="", help="A folder or volume claim kept across launches.")
@click.option("--share", is_flag=True, help="Let the project's members open it too.")
@click.option("--ssh", is_flag=True, help="Start an SSH server with your keys (`gpupool ssh`).")
@click.pass_context
def submit_workspace(ctx: click.Context, name: str, **options: Any) -> None:
    """An interactive workspace (JupyterLab...) opened through the portal's link."""
    api = api_of(ctx)
    environment = options.pop("environment") or only_environment(api)
    body = {
        "project": project_of(ctx, options.pop("project")),
        "environment": environment,
        "name": name,
        "env": env_of(options.pop("env")),
        "data_volume": options.pop("data_volume"),
        "shared_with_project": options.pop("share"),
        "ssh": options.pop("ssh"),
        "cpu": options.pop("cpu"),
        "memory_mib": options.pop("memory"),
        **gpu_request(options.pop("gpus"), options.pop("gpu_memory")),
    }
    if options.get("node_pool"):
        body["node_pool"] = options["node_pool"]
    workspace = api.call("POST", "/api/v1/workspaces/", json=body)
    reach = (
        f"Open it at {api.url}{workspace['url']}"
        if workspace["url"]
        else f"Connect with `gpupool ssh {workspace['id']}`."
    )
    click.echo(f"Submitted workspace {workspace['project']}/{workspace['name']} "
               f"(id {workspace['id']}): {workspace['state']}. {reach}")  # fmt: skip


def only_environment(api: Api) -> str:
    names = [e["name"] for e in api.call("GET", "/api/v1/environments/")]
    if len(names) == 1:
        return names[0]
    if not names:
        raise click.ClickException("No workspace environment is enabled; ask an administrator.")
    raise click.ClickException(f"Choose --environment among: {', '.join(names)}.")


@submit.command("inference")
@submit_options
@click.option("--replicas", type=Bounded(bounds.PODS), default=1, show_default=True)
@click.option("--port", type=Bounded(bounds.PORT), multiple=True, required=True, help="Repeatable.")
@click.option("--min-replicas", type=Bounded(bounds.PODS), help="Elastic: with --max-replicas.")
@click.option("--max-replicas", type=Bounded(bounds.PODS), help="Elastic: grows up to this.")
@click.option("--scale-target", help="Elastic: scale up at this GPU utilization (percent).")
@click.option(
    "--scale-requests",
    type=Bounded(bounds.SCALE_TARGET_REQUESTS),
    help="Elastic: scale up at this many requests per replica per minute.",
)
@click.option("--scale-cooldown", type=Bounded(bounds.GRACE_S), help="Seconds between changes.")
@click.pass_context
def submit_inference(ctx: click.Context, **options: Any) -> None:
    """A long-running service with replicas (or an elastic range, scaled on load)."""
    ports = options.pop("port")
    options["ports"] = [
        {"name": "http" if i == 0 else f"port{i}", "port": p} for i, p in enumerate(ports)
    ]
    submit_and_report(ctx, "inference", options)


# --- follow and act ------------------------------------------------------------------------

LIST_COLUMNS = ["id", "name", "project", "kind", "state", "gpus", "gpus_allocated", "node"]


@main.command("list")
@click.option("--project", help="Defaults to the saved project; --all-projects for all.")
@click.option("--all-projects", is_flag=True)
@click.option("--state")
@click.option("--kind")
@click.option("--user")
@click.pass_context
def list_(ctx: click.Context, project: str | None, all_projects: bool, **filters: Any) -> None:
    """Your workloads as a table."""
    params = {k: v for k, v in filters.items() if v}
    if not all_projects and (project or ctx.obj.get("project")):
        params["project"] = project or ctx.obj["project"]
    body = api_of(ctx).call("GET", "/api/v1/workloads/", params={**params, "limit": 500})
    rows = body["results"]
    for row in rows:
        row["node"] = ",".join(sorted({a["node"] for a in row["allocations"]}))
        row["gpus"] = row["gpus_requested"]  # the whole workload's, as the pages show it
        size = row.get("size") or {}
        row["size"] = (
            f"{size['current']}/{size['min']}..{size['max']}" if row.get("elastic") else ""
        )
    columns = LIST_COLUMNS
    if any(row.get("elastic") for row in rows):  # current/min..max of elastic work
        columns = [*LIST_COLUMNS[:-1], "size", LIST_COLUMNS[-1]]
    click.echo(table(rows, columns))


def checkpoints_of(wl: dict[str, Any]) -> str:
    """'/ckpt, every 600 s, last 2026-01-02T03:04:05Z': where, how often, when last; '' if
    nothing is known."""
    parts = [wl.get("checkpoint_dir") or ""]
    if wl.get("checkpoint_interval_s"):
        parts.append(f"every {wl['checkpoint_interval_s']} s")
    if wl.get("last_checkpoint_at"):
        parts.append(f"last {wl['last_checkpoint_at']}")
    return ", ".join(p for p in parts if p)


@main.command()
@click.argument("workload_id", type=ID)
@click.pass_context
def describe(ctx: click.Context, workload_id: int) -> None:
    """A workload's settings, allocation and events."""
    api = api_of(ctx)
    wl = api.call("GET", f"/api/v1/workloads/{workload_id}/")
    events = api.call("GET", f"/api/v1/workloads/{workload_id}/events/")
    for key in ("name", "project", "kind", "state", "why", "image", "gpus_requested",
                "gpus", "pods", "priority_class", "preemptible", "restart_count",
                "submitted_by"):  # fmt: skip
        if key == "why" and not wl.get(key):
            continue  # nothing to say: it is not waiting, and did not fail or stop
        click.echo(f"{key + ':':16}{amount(wl[key]) if key in AMOUNTS else wl[key]}")
    if (wl.get("runs") or {}).get("summary"):
        click.echo(f"{'runs:':16}{wl['runs']['summary']}")
    if wl.get("origin"):
        click.echo(f"{'from:':16}Kubernetes {wl['origin']['summary']}")
    if checkpoints := checkpoints_of(wl):
        click.echo(f"{'checkpoints:':16}{checkpoints}")
    if wl.get("elastic"):
        size = wl["size"]
        unit = " GPUs" if wl.get("min_gpus") is not None else ""
        click.echo(f"{'size:':16}{size['current']}{unit} (min {size['min']}, max {size['max']})")
    links = wl.get("links") or {}
    if links.get("ports"):
        click.echo("\nPorts:")
        rows = [{**p, "url": f"{api.url}{p['url']}" if p["url"] else ""} for p in links["ports"]]
        click.echo(table(rows, ["name", "port", "protocol", "url"]))
    if links.get("ssh"):
        click.echo(f"\nSSH:            gpupool ssh {workload_id}  (user {links['ssh']['user']})")
    click.echo("\nAllocation:")
    click.echo(table(wl["allocations"], ["pod_index", "cluster", "node", "gpu_indices", "phase"]))
    click.echo("\nEvents:")
    click.echo(table(events, ["created_at", "type", "reason", "message"]))


@main.command()
@click.argument("workload_id", type=ID)
@click.option("--tail", type=Bounded(bounds.LOG_LINES), default=500, show_default=True)
@click.option("-f", "--follow", is_flag=True, help="Print new lines until the workload ends.")
@click.option(
    "--interval", type=Bounded(bounds.Bound.of(1, 60, unit="s")), default=2, show_default=True
)
@click.pass_context
def logs(ctx: click.Context, workload_id: int, tail: int, follow: bool, interval: int) -> None:
    """Each pod's recent output; with -f, follow it until the workload ends."""
    api = api_of(ctx)
    path = f"/api/v1/workloads/{workload_id}/logs/"
    body = api.call("GET", path, params={"tail": tail})
    if body["unavailable"] and not follow:
        why = f"\n{body['state'].capitalize()}: {body['why']}" if body.get("why") else ""
        raise click.ClickException(body["unavailable"] + why)
    many = len(body["pods"]) > 1
    seen: dict[int, list[str]] = {}
    while True:
        for pod in body["pods"]:
            lines = pod["log"].splitlines()
            fresh, gap = new_lines(seen.get(pod["pod"]), lines)
            seen[pod["pod"]] = lines
            if gap:
                click.echo(f"... (pod {pod['pod']}: its output restarted, or more than --tail"
                           " lines came since the last read)")  # fmt: skip
            for line in fresh:
                click.echo(f"[pod {pod['pod']}] {line}" if many else line)
        if not follow or body["state"] in ENDED:
            break
        time.sleep(interval)
        body = api.call("GET", path, params={"tail": tail})
    if body.get("why") and body["state"] != "running":
        # Why it failed, stopped, was sent back or waits: said where the user looks (a
        # failed job's logs once printed nothing and exited 0).
        click.echo(f"{body['state'].capitalize()}: {body['why']}", err=True)
    if body["state"] == "failed":
        ctx.exit(1)


ENDED = {"succeeded", "failed", "stopped"}


def new_lines(before: list[str] | None, now: list[str]) -> tuple[list[str], bool]:
    """The lines of `now` after what `before` showed (both are the last lines of one log),
    and whether some were missed: the two windows do not overlap."""
    if before is None:
        return now, False
    for overlap in range(min(len(before), len(now)), 0, -1):
        if before[-overlap:] == now[:overlap]:
            return now[overlap:], False
    return now, bool(before and now)


@main.command()
@click.argument("workload_id", type=ID)
@click.pass_context
def stop(ctx: click.Context, workload_id: int) -> None:
    """Stop a workload."""
    wl = api_of(ctx).call("POST", f"/api/v1/workloads/{workload_id}/stop/")
    click.echo(f"{wl['name']}: {wl['state']}.")


@main.command()
@click.argument("workload_id", type=ID)
@click.pass_context
def delete(ctx: click.Context, workload_id: int) -> None:
    """Delete a finished or pending workload."""
    api_of(ctx).call("DELETE", f"/api/v1/workloads/{workload_id}/")
    click.echo(f"Deleted workload {workload_id}.")


# --- SSH ------------------------------------------------------------------------------------


def ssh_alias(workload_id: int) -> str:
    return f"gpupool-{workload_id}"


def proxy_command(workload_id: int) -> list[str]:
    """How ssh starts the tunnel: this same CLI (the interpreter running it now), so the
    tunnel speaks for the same portal and token."""
    return [sys.executable, "-m", "scheduling.cli", "ssh-proxy", str(workload_id)]


def ssh_options(workload_id: int) -> dict[str, str]:
    """Through the portal's tunnel. The pod's host key is trusted on first use and kept
    under its own alias in GPUPool's known_hosts, never mixed with the user's."""
    return {
        "ProxyCommand": shlex.join(proxy_command(workload_id)),
        "HostKeyAlias": ssh_alias(workload_id),
        "UserKnownHostsFile": str(config_path().with_name("known_hosts")),
        "StrictHostKeyChecking": "accept-new",
    }


def ssh_user(api: Api, workload_id: int) -> str:
    workload = api.call("GET", f"/api/v1/workloads/{workload_id}/")
    ssh = (workload.get("links") or {}).get("ssh")
    if not ssh:
        raise click.ClickException(
            f"Workload {workload_id} was not started with SSH: submit it with --ssh."
        )
    return str(ssh["user"])


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("workload_id", type=ID)
@click.option("--identity", "-i", type=click.Path(dir_okay=False), help="Your private key.")
@click.option("--option", "-o", "options", multiple=True, help="An ssh -o option; repeatable.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def ssh(
    ctx: click.Context,
    workload_id: int,
    identity: str | None,
    options: tuple[str, ...],
    command: tuple[str, ...],
) -> None:
    """Open a shell in a workload started with SSH (or run COMMAND there), through the
    portal: gpupool ssh ID [-- CMD...]. Runs your own `ssh` client."""
    user = ssh_user(api_of(ctx), workload_id)
    argv = ["ssh"]
    for name, value in ssh_options(workload_id).items():
        argv += ["-o", f"{name}={value}"]
    for option in options:
        argv += ["-o", option]
    if identity:
        argv += ["-i", identity, "-o", "IdentitiesOnly=yes"]
    argv += ["-l", user, ssh_alias(workload_id), *command]
    try:
        os.execvp("ssh", argv)
    except OSError as exc:
        raise click.ClickException(f"Cannot run ssh: {exc}. Install OpenSSH's client.") from exc


@main.command("ssh-config")
@click.argument("workload_ids", nargs=-1, type=ID, required=True)
@click.pass_context
def ssh_config(ctx: click.Context, workload_ids: tuple[int, ...]) -> None:
    """A block for ~/.ssh/config per workload, for ssh, scp, PyCharm and VS Code Remote-SSH:
    `ssh gpupool-ID` then works."""
    api = api_of(ctx)
    for workload_id in workload_ids:
        click.echo(f"Host {ssh_alias(workload_id)}")
        click.echo(f"    User {ssh_user(api, workload_id)}")
        for name, value in ssh_options(workload_id).items():
            click.echo(f"    {name} {value}")
        click.echo("")


@main.command("ssh-proxy", hidden=True)
@click.argument("workload_id", type=ID)
@click.pass_context
def ssh_proxy(ctx: click.Context, workload_id: int) -> None:
    """ssh's ProxyCommand: stdin and stdout carried over the portal's WebSocket tunnel."""
    api = api_of(ctx)
    url = "ws" + api.url.removeprefix("http") + f"/workloads/{workload_id}/ssh"
    try:
        tunnel_pump(url, api.headers)
    except InvalidStatus as exc:
        status = exc.response.status_code
        reason = TUNNEL_REFUSALS.get(status, f"HTTP {status}")
        raise click.ClickException(f"The portal refused the tunnel: {reason}.") from None
    except (OSError, InvalidHandshake) as exc:
        raise click.ClickException(f"Cannot open the tunnel at {url}: {exc}") from None


TUNNEL_REFUSALS = {
    403: "you may not open this workload, or you are not logged in (`gpupool login`)",
    404: "no such workload, or it was not started with SSH",
    503: "the workload is not running",
}


def tunnel_pump(url: str, headers: dict[str, str]) -> None:
    """Bytes from stdin go out as binary messages, messages come back to stdout, until
    either side ends."""
    with ws_connect(url, additional_headers=headers, max_size=None, open_timeout=30) as ws:

        def outbound() -> None:
            try:
                while chunk := os.read(0, 65536):
                    ws.send(chunk)
            except (OSError, ConnectionClosed):
                pass
            ws.close()

        threading.Thread(target=outbound, daemon=True).start()
        try:
            for message in ws:
                data = message.encode() if isinstance(message, str) else message
                os.write(1, data)
        except ConnectionClosed:
            pass


@main.group("ssh-key")
def ssh_key() -> None:
    """Your SSH public keys: workloads you start with --ssh accept them."""


@ssh_key.command("list")
@click.pass_context
def ssh_key_list(ctx: click.Context) -> None:
    keys = api_of(ctx).call("GET", "/api/v1/users/me/ssh-keys/")
    click.echo(table(keys, ["id", "name", "key_type", "bits", "fingerprint"]))


@ssh_key.command("add")
@click.argument("public_key_file", type=click.File("r"))
@click.option("--name", default="", help="Default: the key's comment.")
@click.pass_context
def ssh_key_add(ctx: click.Context, public_key_file: Any, name: str) -> None:
    """gpupool ssh-key add ~/.ssh/id_ed25519.pub"""
    text = public_key_file.read(8192)
    body = {"name": name, "public_key": text}
    key = api_of(ctx).call("POST", "/api/v1/users/me/ssh-keys/", json=body)
    click.echo(f"Added SSH key {key['name']} ({key['fingerprint']}).")


@main.command()
@click.pass_context
def queue(ctx: click.Context) -> None:
    """Queues by starvation, and pending work in the order it will be considered."""
    body = api_of(ctx).call("GET", "/api/v1/queue/")
    columns = ["project", "deserved", "fair_share", "allocated", "over_quota", "pending"]
    click.echo(table(body["queues"], columns))
    click.echo("")
    click.echo(table(body["pending"], ["position", "id", "name", "project", "gpus", "reason"]))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
