"""The migration report for people: one page per DAG run, built from the run dir's step reports.

    summary = build(run_dir, dag_id=..., run_id=...)      # dict, also RUN_DIR/report.json
    write(run_dir, summary)                                # report.json, report.md, report.html

It reads `RUN_DIR/spec.json` and `RUN_DIR/<step>.json` of the five steps (a step without a report did not
run) and gathers what a reviewer asks after a migration: the metadata plan's counts, every partition's
copied counts and content hashes on both sides, every subscription's lost/duplicated counts, the cutover's
hold and phases, what cleanup deleted or would delete, and each step's time. Pure Python, no Airflow, no
Spark (the plugin's views render the same files).
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pulsar_migration import rundir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

STEPS = ("sync_metadata", "replicate_topics", "sync_progress", "switch_lookup", "cleanup_source")
ROLLBACK_STEP = "rollback_lookup"  # pulsar_tenant_rollback's step, run on a migration run's dir
ROLLED_BACK = "rolled_back"  # the verdict of a run whose clients were switched back
# Steps at or after the flip: a new DAG run would start from sync_metadata over the live target; the failed task
# is cleared instead (its steps run again in the same run dir).
AFTER_THE_FLIP = ("switch_lookup", "cleanup_source")
SUMMARY_FILE = "report.json"
MARKDOWN_FILE = "report.md"
HTML_FILE = "report.html"
# The report stays readable for tenants with thousands of partitions; the step JSON files hold the rest.
MAX_ROWS = 500


def build(run_dir: str, *, dag_id: str | None = None, run_id: str | None = None,
          spark: SparkSession | None = None) -> dict[str, Any]:
    """The report's data: spec essentials, per-step outcome, partitions, subscriptions, cutover, cleanup."""
    spec = _read_json(run_dir, "spec.json", spark) or {}
    reports = {step: _read_json(run_dir, f"{step}.json", spark) for step in STEPS}
    steps = [_step_row(step, reports[step]) for step in STEPS]
    rollback = _read_json(run_dir, f"{ROLLBACK_STEP}.json", spark)
    if rollback is not None:  # pulsar_tenant_rollback ran on this run
        steps.append(_step_row(ROLLBACK_STEP, rollback))
    back_at = rolled_back_at(run_dir, spec.get("source"))
    replicate = reports["replicate_topics"] or {}
    progress = reports["sync_progress"] or {}
    switch = reports["switch_lookup"] or {}
    cleanup = reports["cleanup_source"] or {}
    subscriptions = [_subscription_row(row) for row in (progress.get("details") or {}).get("subscriptions") or []]
    return {
        "dag_id": dag_id,
        "run_id": run_id,
        "run_dir": run_dir,
        "tenant": spec.get("tenant"),
        "source": spec.get("source"),
        "target": spec.get("target"),
        "replication_mode": (spec.get("replication") or {}).get("mode"),
        "namespaces": spec.get("namespaces"),
        **_outcome(spec, steps, back_at),
        "rolled_back_at": back_at,
        "steps": steps,
        "total_step_s": round(sum(s["duration_s"] or 0.0 for s in steps), 3),
        "plan_counts": dict((reports["sync_metadata"] or {}).get("counts") or {}),
        "replication_counts": dict(replicate.get("counts") or {}),
        "replication": _replication(replicate),
        "partitions": [_partition_row(row) for row in (replicate.get("details") or {}).get("partitions") or []],
        "subscriptions": subscriptions,
        "cutover": (cutover := _cutover(switch)),
        # Both verifications count: sync_progress's and the switch's final one.
        "lost": sum(s["lost"] for s in subscriptions) + int(cutover["final_lost"] or 0),
        "duplicated": sum(s["duplicated"] for s in subscriptions) + int(cutover["final_duplicated"] or 0),
        "cleanup": _cleanup(cleanup),
    }


def rolled_back_at(run_dir: str, source: str | None) -> str | None:
    """When pulsar_tenant_rollback last moved this run's clients back to the source, if it did after the run's
    switch (replication.follows.rolled_back; a rollback needs a local run dir, so others have none)."""
    if not source or not rundir.is_local(run_dir):
        return None
    from pulsar_migration.replication.follows import rolled_back

    return rolled_back(run_dir, source)


def _outcome(spec: Mapping[str, Any], steps: Sequence[Mapping[str, Any]], back_at: str | None) -> dict[str, str]:
    """The verdict and its meaning, from the migration's five steps; a rollback that switched the clients back
    makes it "rolled_back" (a step failed before it is told after), one that failed is told after the migration's
    own meaning (its verdict stands)."""
    migration = [s for s in steps if s["step"] in STEPS]
    found, said = verdict(migration), meaning(migration)
    if back_at:  # whatever the migration's verdict: the clients are on the source again (a failed step is told)
        bad = [s for s in migration if s["verdict"] not in ("ok", "planned")]
        before = (f"; before it, {bad[0]['step']} {bad[0]['verdict']}" + (f": {bad[0]['error']}" if bad[0]["error"]
                                                                          else "")) if bad else ""
        return {"verdict": ROLLED_BACK,
                "meaning": f"rolled back: the tenant's clients were switched back to {spec.get('source')} at "
                           f"{back_at} (pulsar_tenant_rollback); the source is live again and {spec.get('target')} "
                           "keeps a copy; to migrate again, trigger pulsar_tenant_migration with Continue from run "
                           f"set to this run{before}"}
    rollback = next((s for s in steps if s["step"] == ROLLBACK_STEP), None)
    if rollback is not None and rollback["verdict"] not in ("ok", "planned"):
        said += f"; pulsar_tenant_rollback {rollback['verdict']}" + (f": {rollback['error']}" if rollback["error"]
                                                                     else "")
    return {"verdict": found, "meaning": said}


def verdict(steps: Sequence[Mapping[str, Any]]) -> str:
    """"failed" if any step failed or did not run; "planned" if any only planned (a dry run, or a cleanup
    that was not confirmed while the rest ran: then the tenant is moved and the source still holds its copy);
    "ok" when every step did its work and verified it."""
    verdicts = [s["verdict"] for s in steps]
    if any(v not in ("ok", "planned") for v in verdicts):
        return "failed"
    return "planned" if "planned" in verdicts else "ok"


def write(run_dir: str, summary: Mapping[str, Any], spark: SparkSession | None = None) -> dict[str, str]:
    """Writes report.json, report.md and report.html into the run dir; returns their locations."""
    return {
        "json": rundir.write_text(run_dir, SUMMARY_FILE, json.dumps(summary, indent=2, default=str) + "\n", spark),
        "markdown": rundir.write_text(run_dir, MARKDOWN_FILE, to_markdown(summary), spark),
        "html": rundir.write_text(run_dir, HTML_FILE, to_html(summary), spark),
    }


# -- the rows ------------------------------------------------------------------------------------------


def _read_json(run_dir: str, name: str, spark: SparkSession | None) -> dict[str, Any] | None:
    try:
        return json.loads(rundir.read_text(run_dir, name, spark))
    except FileNotFoundError:
        return None


def _step_row(step: str, report: Mapping[str, Any] | None) -> dict[str, Any]:
    if report is None:
        return {"step": step, "verdict": "not run", "dry_run": None, "duration_s": None, "error": None}
    return {"step": step, "verdict": report.get("verdict"), "dry_run": report.get("dry_run"),
            "duration_s": report.get("duration_s"), "error": report.get("error")}


def _partition_row(row: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("topic", "status", "source_messages", "copied_messages", "skipped_messages", "target_messages",
            "mapped_entries", "source_hash", "target_hash")
    out = {k: row.get(k) for k in keys}
    out["hashes_equal"] = row.get("source_hash") == row.get("target_hash")
    return out


def _replication(report: Mapping[str, Any]) -> dict[str, Any]:
    details = report.get("details") or {}
    throttle = details.get("throttle") or {}
    return {"mb_per_s": details.get("mb_per_s"), "copy_engine": details.get("copy_engine"),
            "cap_mb_per_s": throttle.get("max_mb_per_s"), "cap_msgs_per_s": throttle.get("max_msgs_per_s"),
            "held_back_s": throttle.get("held_back_s"),
            "trim_warning": (details.get("trim_risk") or {}).get("warning"),
            "trimmed_warning": (details.get("trim_risk") or {}).get("trimmed_warning"),
            "follows_run_dir": details.get("follows_run_dir"), "map_rows_seeded": details.get("map_rows_seeded")}


def _copy_note(replication: Mapping[str, Any]) -> str:
    """One line under the partitions: the earlier run this one continues (replication.follows), how fast, through
    what, the rate cap if there was one, and the warning of topics the target may trim (replication.trim_risk)."""
    parts = []
    if replication.get("follows_run_dir"):
        seeded = replication.get("map_rows_seeded")
        parts.append(f"continues the run in {replication['follows_run_dir']}"
                     + (f" ({_cell(seeded)} map rows taken from it)" if seeded else ""))
    if replication["mb_per_s"] is not None:
        engine = f" through the {replication['copy_engine']} path" if replication["copy_engine"] else ""
        parts.append(f"copied at {_cell(replication['mb_per_s'])} MB/s{engine}")
    units = (("cap_mb_per_s", "MB/s"), ("cap_msgs_per_s", "msgs/s"))
    caps = [f"{_cell(replication[key])} {unit}" for key, unit in units if replication.get(key) is not None]
    if caps:
        parts.append(f"rate cap {' and '.join(caps)}, copies held back {_cell(replication['held_back_s'])} s in all")
    for key in ("trim_warning", "trimmed_warning"):
        if replication.get(key):
            parts.append(f"warning: {replication[key]}")
    return "; ".join(parts)


def _subscription_row(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"topic": row.get("topic"), "subscription": row.get("subscription"),
            "source_acked_entries": row.get("source_acked_entries"),
            "target_acked_entries": row.get("target_acked_entries"),
            "source_backlog": row.get("source_backlog"), "target_backlog": row.get("target_backlog"),
            "lost": int(row.get("lost") or 0), "duplicated": int(row.get("duplicated") or 0)}


def _cutover(report: Mapping[str, Any]) -> dict[str, Any]:
    """The switch's hold and phases, plus what its catch-up rounds and final delta copied and what its final
    progress sync verified (the subscriptions' last word: the source was quiet then)."""
    details = report.get("details") or {}
    rounds = [*(details.get("catch_up") or []), details.get("final_replicate") or {}]
    final = (details.get("final_progress") or {}).get("counts") or {}
    return {"hold_s": details.get("hold_s"), "phases_s": details.get("phases_s") or {},
            "route_before": details.get("route_before"), "route_after": details.get("route_after"),
            "probe": details.get("probe"),
            "copied_messages": sum(int((r.get("counts") or {}).get("copied_messages", 0)) for r in rounds),
            "final_lost": final.get("lost"), "final_duplicated": final.get("duplicated")}


def _cleanup(report: Mapping[str, Any]) -> dict[str, Any]:
    details = report.get("details") or {}
    return {"dry_run": report.get("dry_run"), "counts": dict(report.get("counts") or {}),
            "plan": details.get("plan")}


# -- rendering -----------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:16]  # a sha256: the prefix identifies it, the full value is in report.json
    return str(value)


def _plan_note(counts: Mapping[str, Any]) -> str:
    only = int(counts.get("set_only_on_target") or 0)
    return (f"warning: {only} namespace(s) or topic(s) hold policies the source does not (removed there after an "
            "earlier sync, or the target's own), left as they are: see details.set_only_on_target in "
            "sync_metadata.json") if only else ""


def _tables(summary: Mapping[str, Any]) -> list[tuple[str, list[str], list[list[str]], str]]:
    """(title, header, rows, note) of every table, shared by the Markdown and the HTML renderings."""
    steps = [[s["step"], str(s["verdict"]) + (" (dry run)" if s["dry_run"] else ""), _cell(s["duration_s"]),
              _cell(s["error"])] for s in summary["steps"]]
    plan = [[k, str(v)] for k, v in sorted(summary["plan_counts"].items()) if "." not in k]
    parts = summary["partitions"]
    partitions = [[p["topic"], _cell(p["status"]), _cell(p["source_messages"]), _cell(p["copied_messages"]),
                   _cell(p["target_messages"]), _cell(p["source_hash"]), _cell(p["target_hash"]),
                   "yes" if p["hashes_equal"] else "NO"] for p in parts[:MAX_ROWS]]
    subs = summary["subscriptions"]
    subscriptions = [[s["topic"], s["subscription"], _cell(s["source_acked_entries"]),
                      _cell(s["target_acked_entries"]), _cell(s["source_backlog"]), _cell(s["target_backlog"]),
                      str(s["lost"]), str(s["duplicated"])] for s in subs[:MAX_ROWS]]
    cutover = summary["cutover"]
    phases = [[name, _cell(seconds)] for name, seconds in cutover["phases_s"].items()]
    cleanup = [[k, str(v)] for k, v in sorted(summary["cleanup"]["counts"].items())]

    def more(rows: Sequence[Any]) -> str:
        return f"{len(rows) - MAX_ROWS} more rows in report.json" if len(rows) > MAX_ROWS else ""

    return [
        ("Steps", ["step", "verdict", "seconds", "error"], steps, f"total {_cell(summary['total_step_s'])} s"),
        ("Metadata plan", ["action", "count"], plan, _plan_note(summary["plan_counts"])),
        ("Partitions copied", ["partition", "status", "source msgs", "copied", "target msgs", "source hash",
                               "target hash", "equal"], partitions,
         "; ".join(note for note in (_copy_note(summary.get("replication") or _replication({})), more(parts))
                   if note)),
        ("Subscriptions", ["topic", "subscription", "source acked", "target acked", "source backlog",
                           "target backlog", "lost", "duplicated"], subscriptions, more(subs)),
        ("Cutover", ["phase", "seconds"], phases,
         f"hold {_cell(cutover['hold_s'])} s (the longest a client's lookup waited); route "
         f"{_cell(cutover['route_before'])} -> {_cell(cutover['route_after'])}; copied during the switch "
         f"{cutover['copied_messages']} message(s); final progress sync lost {_cell(cutover['final_lost'])}, "
         f"duplicated {_cell(cutover['final_duplicated'])}"),
        ("Cleanup of the source" + (" (dry run)" if summary["cleanup"]["dry_run"] else ""), ["count", "value"],
         cleanup, ""),
    ]


def _headline(summary: Mapping[str, Any]) -> str:
    return (f"Tenant {summary['tenant']}: {summary['source']} -> {summary['target']} "
            f"({summary['replication_mode']} mode): verdict {summary['verdict']}; "
            f"lost {summary['lost']}, duplicated {summary['duplicated']} across "
            f"{len(summary['subscriptions'])} subscription(s), {len(summary['partitions'])} partition(s)")


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def meaning(steps: Sequence[Mapping[str, Any]]) -> str:
    """The verdict in words: "planned" covers both a dry run and a migration whose cleanup was not confirmed,
    which readers otherwise take for a migration that did not happen."""
    by_verdict: dict[str, list[str]] = {}
    for s in steps:
        by_verdict.setdefault(str(s["verdict"]), []).append(s["step"])
    bad = [s for s in steps if s["verdict"] not in ("ok", "planned")]
    if bad:
        first = bad[0]
        failed = f"{first['step']} {first['verdict']}" + (f": {first['error']}" if first.get("error") else "")
        if first["step"] in AFTER_THE_FLIP and first["verdict"] != "not run":
            return failed + ("; the steps are idempotent: fix the cause and clear the failed task in this run (a new "
                             "DAG run would apply the source's metadata over a target clients may already use)")
        return failed + "; the steps are idempotent: fix the cause and trigger the DAG again with the same parameters"
    planned = by_verdict.get("planned", [])
    if not planned:
        return "every step did its work and verified it"
    if planned == ["cleanup_source"]:
        return ("the tenant is moved and verified; the source still holds its copy (cleanup_source only planned: "
                "run pulsar_source_cleanup with this run's id and confirm_cleanup to delete it)")
    if not by_verdict.get("ok"):
        return "a dry run: every step planned, nothing was written to either cluster"
    return f"{', '.join(by_verdict['ok'])} done; {', '.join(planned)} only planned"


def to_markdown(summary: Mapping[str, Any]) -> str:
    lines = [f"# Pulsar migration report: {summary['tenant']}", "",
             f"Run `{summary['run_id']}` of `{summary['dag_id']}`, run dir `{summary['run_dir']}`.", "",
             _headline(summary) + ".", "", _sentence(summary["meaning"]) + ".", ""]
    for title, header, rows, note in _tables(summary):
        lines += [f"## {title}", ""]
        if rows:
            lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
        else:
            lines.append("(none)")
        lines += (["", note] if note else []) + [""]
    return "\n".join(lines)


def to_html(summary: Mapping[str, Any]) -> str:
    esc = html.escape
    colour = {"ok": "#1a7f37", "planned": "#9a6700", ROLLED_BACK: "#9a6700"}.get(summary["verdict"], "#cf222e")
    body = [f"<h1>Pulsar migration report: {esc(str(summary['tenant']))}</h1>",
            f"<p>Run <code>{esc(str(summary['run_id']))}</code> of <code>{esc(str(summary['dag_id']))}</code>, "
            f"run dir <code>{esc(str(summary['run_dir']))}</code>.</p>",
            f"<p class=\"verdict\" style=\"color:{colour}\"><strong>{esc(_headline(summary))}</strong></p>",
            f"<p class=\"meaning\">{esc(_sentence(summary['meaning']))}.</p>"]
    for title, header, rows, note in _tables(summary):
        body.append(f"<h2>{esc(title)}</h2>")
        if rows:
            body.append("<table><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr></thead><tbody>")
            body += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows]
            body.append("</tbody></table>")
        else:
            body.append("<p>(none)</p>")
        if note:
            body.append(f"<p>{esc(note)}</p>")
    style = ("body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin-bottom:1em}"
             "td,th{border:1px solid #d0d7de;padding:2px 8px;font-size:13px;text-align:left}th{background:#f6f8fa}")
    return ("<!doctype html><html><head><meta charset=\"utf-8\">"
            f"<title>Pulsar migration report: {esc(str(summary['tenant']))}</title><style>{style}</style></head>"
            "<body>" + "\n".join(body) + "</body></html>\n")
