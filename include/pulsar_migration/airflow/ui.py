"""What the "Pulsar migrations" UI plugin shows: the migration runs found under the run-dir base with their
report's verdict, and one run's report page. Pure functions over the run dirs (local bases; an object-store
base is not listed here), so the plugin file stays thin.

A run is addressed by its DAG id and run id; both become one path segment each (dag_support.run_dir) and any
that would leave the base (`..`, `.`) is refused, so a crafted URL cannot read files outside the run dirs.
"""

from __future__ import annotations

import html
import json
import logging
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pulsar_migration import dag_support, migration_report

log = logging.getLogger(__name__)

REPORT_DAGS = (dag_support.MIGRATION_DAG_ID,)


class UnsafeRunPath(ValueError):
    """A DAG or run id that does not name a run dir under the base."""


def run_directory(base: str, dag_id: str, run_id: str, root: str | Path | None = None) -> Path:
    """The run dir of (dag_id, run_id), refusing ids that would leave the base."""
    anchor = Path(dag_support.anchored(base, root)).resolve()
    resolved = Path(dag_support.run_dir(base, dag_id, run_id, root=root)).resolve()
    if resolved.parent.parent != anchor:
        raise UnsafeRunPath(f"not a run of this base: {dag_id!r} / {run_id!r}")
    return resolved


def list_runs(base: str, root: str | Path | None = None) -> list[dict[str, Any]]:
    """Every run with a report, newest first: dag_id, run_id, verdict, tenant, source, target, lost,
    duplicated, modified (the report's mtime)."""
    if "://" in base:
        return []
    runs = []
    for dag_id in REPORT_DAGS:
        directory = Path(dag_support.run_dir(base, dag_id, root=root))
        for summary_file in directory.glob(f"*/{migration_report.SUMMARY_FILE}"):
            try:
                summary = json.loads(summary_file.read_text())
            except (OSError, ValueError):
                log.warning("unreadable report %s", summary_file)
                continue
            runs.append({key: summary.get(key) for key in ("dag_id", "run_id", "verdict", "meaning", "tenant",
                                                              "source", "target", "lost", "duplicated")}
                        | {"modified": summary_file.stat().st_mtime})
    return sorted(runs, key=lambda r: r["modified"], reverse=True)


def report_page(base: str, dag_id: str, run_id: str, root: str | Path | None = None) -> str | None:
    """The run's report.html, or None when the run has none (yet)."""
    page = run_directory(base, dag_id, run_id, root) / migration_report.HTML_FILE
    return page.read_text() if page.is_file() else None


def runs_page(runs: list[dict[str, Any]]) -> str:
    """The list of runs as a small HTML page linking each run's report (relative links: the page is served at
    the plugin's root, whatever path Airflow itself is served under)."""
    rows = []
    for run in runs:
        link = f"runs/{quote(str(run['dag_id']), safe='')}/{quote(str(run['run_id']), safe='')}"
        cells = [f'<a href="{html.escape(link)}">{html.escape(str(run["run_id"]))}</a>',
                 *(html.escape(str(run[k])) for k in ("tenant", "source", "target", "verdict", "lost", "duplicated"))]
        titles = {4: run.get("meaning")}  # the verdict's cell says in words what it means, on hover
        rows.append("<tr>" + "".join(f'<td title="{html.escape(str(titles[i]))}">{c}</td>' if titles.get(i)
                                     else f"<td>{c}</td>" for i, c in enumerate(cells)) + "</tr>")
    body = "\n".join(rows) or '<tr><td colspan="7">No migration has written a report yet.</td></tr>'
    return _page("Pulsar migrations", f"""<table><thead><tr><th>run</th><th>tenant</th><th>source</th><th>target</th>
<th>verdict</th><th>lost</th><th>duplicated</th></tr></thead>
<tbody>
{body}
</tbody></table>""")


def message_page(title: str, message: str) -> str:
    """A page with one sentence, e.g. for a run that has no report (the run tab shows it in a frame)."""
    return _page(title, f"<p>{html.escape(message)}</p>")


def _page(title: str, body: str) -> str:
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:1.5em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:.3em .6em;text-align:left}}</style></head>
<body><h1>{html.escape(title)}</h1>
{body}
</body></html>
"""
