"""GPU metrics: samples in, roll-ups, dashboards, usage reports, Prometheus.

- ingest.py / services.samples_ingest: validated batches of GPU samples, COPY on PostgreSQL.
- api.py: POST /api/v1/metrics for node agents (per-node tokens, services.node_token_*).
- allocations.py: allocation intervals kept from PodAllocation rows (signals + a sync).
- rollup.py, hourly.py, retention.py, tasks.py: minute and hour roll-ups (beat), retention.
- selectors.py, charts.py, heatmap.py, workload_chart.py, views.py: the dashboard pages.
- reports.py, report_views.py: usage reports (HTML, CSV), GPU prices, node tokens page.
- prometheus.py: /metrics with GPUPOOL_METRICS_TOKEN.
- templatetags/metrics_charts.py: chart partials for project, department, workload pages.
Settings (environment): GPUPOOL_METRICS_RAW_DAYS (7), _MINUTE_DAYS (35), _HOUR_DAYS (800),
_IDLE_PCT (1.0), _IDLE_MINUTES (5), _ROLLUP_LAG_S (60), _ROLLUP_MAX_MINUTES (360).
The node agent itself is clusters/agent (python -m clusters.agent).
"""
