"""plotly figures as plain dicts, built on the server and handed to pages with json_script."""

from __future__ import annotations

from typing import Any

COLOURS = {
    "capacity": "#9aa5b1",
    "allocated": "#3b82f6",
    "used": "#16a34a",
    "quota": "#f59e0b",
    "idle": "#dc2626",
    "over": "#a855f7",
}
CONFIG = {"displaylogo": False, "responsive": True}


def _layout(title: str, y_title: str, **extra: Any) -> dict[str, Any]:
    layout = {
        "title": {"text": title, "font": {"size": 14}},
        "height": 320,
        "margin": {"l": 50, "r": 20, "t": 40, "b": 40},
        "yaxis": {"title": {"text": y_title}, "rangemode": "tozero"},
        "legend": {"orientation": "h", "y": -0.2},
        "hovermode": "x unified",
    }
    layout.update(extra)
    return layout


def _line(name: str, x: list, y: list, colour: str, **extra: Any) -> dict[str, Any]:
    trace = {"type": "scatter", "mode": "lines", "name": name, "x": x, "y": y}
    trace["line"] = {"color": colour, "width": 2}
    trace.update(extra)
    return trace


def _x(rows: list[dict[str, Any]]) -> list[str]:
    return [r["bucket"].isoformat() for r in rows]


def _round(values: list[float]) -> list[float]:
    return [round(v, 3) for v in values]


def pool_figure(rows: list[dict[str, Any]], title: str) -> dict[str, Any]:
    """GPUs in the pool, allocated and used, with utilisation of the allocated on the right."""
    x = _x(rows)
    utilisation = [
        round(100 * r["used"] / r["allocated"], 1) if r["allocated"] else None for r in rows
    ]
    data = [
        _line("GPUs", x, _round([r["capacity"] for r in rows]), COLOURS["capacity"],
              line={"color": COLOURS["capacity"], "dash": "dot"}),
        _line("Allocated", x, _round([r["allocated"] for r in rows]), COLOURS["allocated"],
              fill="tozeroy"),
        _line("Used", x, _round([r["used"] for r in rows]), COLOURS["used"], fill="tozeroy"),
        _line("Idle allocated", x, _round([r["idle"] for r in rows]), COLOURS["idle"]),
        _line("Utilisation of allocated %", x, utilisation, "#111827", yaxis="y2",
              line={"color": "#111827", "width": 1, "dash": "dash"}),
    ]  # fmt: skip
    y2 = {"overlaying": "y", "side": "right", "range": [0, 100], "title": {"text": "%"}}
    return {"data": data, "layout": _layout(title, "GPUs", yaxis2=y2), "config": CONFIG}


def usage_figure(
    rows: list[dict[str, Any]], deserved: tuple[list[str], list[float]], title: str
) -> dict[str, Any]:
    """Allocation vs deserved quota vs utilisation for a project or department; `deserved`
    is the step line (x, y) of the quota in force over the range."""
    x = _x(rows)
    data = [
        _line("Allocated", x, _round([r["allocated"] for r in rows]), COLOURS["allocated"],
              fill="tozeroy"),
        _line("Used", x, _round([r["used"] for r in rows]), COLOURS["used"], fill="tozeroy"),
        _line("Over quota", x, _round([r["over_quota"] for r in rows]), COLOURS["over"]),
        _line("Deserved quota", *deserved, COLOURS["quota"],
              line={"color": COLOURS["quota"], "dash": "dash", "shape": "hv"}),
    ]  # fmt: skip
    return {"data": data, "layout": _layout(title, "GPUs"), "config": CONFIG}


def workload_figure(series: dict[str, list[tuple[str, float, float]]], title: str) -> dict:
    """Per GPU: utilisation (top) and memory used (bottom) over the workload's life."""
    data = []
    for name, points in sorted(series.items()):
        x = [p[0] for p in points]
        data.append(_line(f"{name} util %", x, [p[1] for p in points], "", legendgroup=name))
        data.append(
            _line(f"{name} memory MiB", x, [p[2] for p in points], "", legendgroup=name,
                  xaxis="x2", yaxis="y2")
        )  # fmt: skip
    for trace in data:
        trace["line"] = {"width": 1.5}
    layout = _layout(title, "utilisation %", height=460, hovermode="x")
    layout["yaxis"].update({"domain": [0.55, 1], "range": [0, 100]})
    layout["yaxis2"] = {"domain": [0, 0.45], "title": {"text": "memory MiB"}, "anchor": "x2"}
    layout["xaxis2"] = {"anchor": "y2", "matches": "x"}
    return {"data": data, "layout": layout, "config": CONFIG}


def heatmap_figure(x: list[str], y: list[str], z: list[list[float | None]], title: str) -> dict:
    trace = {
        "type": "heatmap", "x": x, "y": y, "z": z, "zmin": 0, "zmax": 100,
        "colorscale": "YlGnBu", "reversescale": True, "colorbar": {"title": {"text": "util %"}},
        "hovertemplate": "%{y}<br>%{x}<br>%{z:.0f} %<extra></extra>",
    }  # fmt: skip
    height = max(240, 60 + 18 * len(y))
    layout = _layout(title, "", height=height, hovermode="closest")
    layout["yaxis"] = {"automargin": True, "autorange": "reversed"}
    return {"data": [trace], "layout": layout, "config": CONFIG}


def report_figure(rows: list[dict[str, Any]], title: str) -> dict[str, Any]:
    """Allocated, used and idle GPU-hours per group, as grouped bars."""
    names = [r["name"] for r in rows]
    data = [
        {"type": "bar", "name": label, "x": names, "y": [round(r[key], 2) for r in rows],
         "marker": {"color": COLOURS[colour]}}
        for label, key, colour in (
            ("Allocated GPU-h", "allocated_h", "allocated"),
            ("Used GPU-h", "used_h", "used"),
            ("Idle GPU-h", "idle_h", "idle"),
            ("Over-quota GPU-h", "over_quota_h", "over"),
        )
    ]  # fmt: skip
    layout = _layout(title, "GPU-hours", barmode="group", hovermode="x")
    return {"data": data, "layout": layout, "config": CONFIG}
