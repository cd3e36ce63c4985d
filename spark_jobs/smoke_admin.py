"""Smoke test of the whole path: Airflow -> spark-submit -> Spark executors -> the library -> Pulsar.

    spark-submit [--py-files pulsar_migration.zip] spark_jobs/smoke_admin.py \\
        --clusters '{"cluster-a": {"admin_url": ..., "service_url": ..., "token_env": null, "tls": null}, ...}' \\
        [--output RESULT.json] [--timeout 10]

`--clusters` is the spec's `clusters` mapping. One Spark task per cluster asks its admin API for
health and the cluster list, using pulsar_migration.admin as shipped to the executors. Exit 0 only
when every cluster is healthy and lists every other one; otherwise one error line on stderr.
Clients are built by the library (`ClusterSpec.admin()`), so tokens come from the environment
variables the entries name: the driver only checks they are set (and fails before Spark when one is
not); each Spark task reads its token from its own executor's environment. No token is in the
arguments or in the tasks' serialized closures.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pulsar_migration.admin import AdminError
from pulsar_migration.oauth2 import OAuth2Spec
from pulsar_migration.spec import ClusterSpec, SpecError, TlsSpec

log = logging.getLogger("smoke_admin")


class SmokeError(RuntimeError):
    """The smoke check could not run or did not pass."""


def parse_clusters(text: str) -> dict[str, dict[str, Any]]:
    try:
        clusters = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SmokeError(f"--clusters is not valid JSON: {exc.msg}") from exc
    if not isinstance(clusters, dict) or len(clusters) < 2:
        raise SmokeError("--clusters must map at least two cluster names to {admin_url, ...}")
    for name, entry in clusters.items():
        if not isinstance(entry, dict) or not str(entry.get("admin_url", "")).startswith(("http://", "https://")):
            raise SmokeError(f"--clusters: {name}: admin_url must be an http(s) URL")
    return clusters


def cluster_specs(clusters: dict[str, dict[str, Any]]) -> list[ClusterSpec]:
    """One work item per cluster: its ClusterSpec, which names its token variable but holds no token.

    Checks on the driver that every named variable is set, so a missing one fails before Spark starts.
    """
    specs = []
    for name, entry in sorted(clusters.items()):
        try:
            tls = TlsSpec(**entry["tls"]) if entry.get("tls") else None
        except TypeError as exc:
            raise SmokeError(f"--clusters: {name}: tls: {exc}") from exc
        try:
            oauth = OAuth2Spec(**entry["oauth2"]) if entry.get("oauth2") else None
        except TypeError as exc:
            raise SmokeError(f"--clusters: {name}: oauth2: {exc}") from exc
        cluster = ClusterSpec(name=name, admin_url=entry["admin_url"], service_url=entry.get("service_url") or "",
                              token_env=entry.get("token_env"), tls=tls, token_file=entry.get("token_file"),
                              oauth2=oauth)
        try:
            cluster.token()  # only a presence check here (an OAuth2 issuer's answer too); the executors read their own
        except (SpecError, AdminError) as exc:
            raise SmokeError(str(exc)) from exc
        specs.append(cluster)
    return specs


def check_partition(clusters: Iterable[ClusterSpec], timeout_s: float) -> Iterator[dict[str, Any]]:
    """Runs in a Spark task: imports the shipped library and asks each cluster about itself.

    The token, if any, is read here, from the executor's environment.
    """
    import pulsar_migration
    from pulsar_migration.admin import AdminError

    for cluster in clusters:
        result: dict[str, Any] = {
            "name": cluster.name, "admin_url": cluster.admin_url, "healthy": False, "clusters": None,
            "error": None, "authenticated": False,
            "executor_host": socket.gethostname(), "executor_pid": os.getpid(),
            "library_file": pulsar_migration.__file__,
        }
        started = time.monotonic()
        try:
            result["authenticated"] = cluster.token() is not None
            admin = cluster.admin(timeout_s=timeout_s, retries=2)
        except (SpecError, AdminError) as exc:  # a variable or file missing here, an OAuth2 issuer refusing
            result["error"] = f"on executor {result['executor_host']}: {exc}"
        else:
            try:
                result["healthy"] = admin.healthy()
                result["clusters"] = sorted(admin.clusters())
            except AdminError as exc:
                result["error"] = str(exc)
            finally:
                admin.close()
        result["elapsed_s"] = round(time.monotonic() - started, 3)
        yield result


def verdict(results: list[dict[str, Any]]) -> list[str]:
    """Problems found; empty when every cluster is healthy and lists every other one."""
    names = {r["name"] for r in results}
    problems = []
    for r in results:
        if r["error"]:
            problems.append(f"{r['name']}: {r['error']}")
            continue
        if not r["healthy"]:
            problems.append(f"{r['name']}: health check at {r['admin_url']} failed")
        missing = sorted(names - {r["name"]} - set(r["clusters"] or []))
        if missing:
            problems.append(f"{r['name']}: does not list {', '.join(missing)} (clusters: {r['clusters']})")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clusters", required=True, help="the spec's clusters mapping as JSON")
    parser.add_argument("--output", help="local path for the result JSON")
    parser.add_argument("--timeout", type=float, default=10.0, help="admin call timeout, seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    started = time.monotonic()
    try:
        items = cluster_specs(parse_clusters(args.clusters))
    except SmokeError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2

    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("pulsar-smoke-admin").getOrCreate()
    try:
        timeout_s = args.timeout
        # One partition per cluster: each cluster is checked by its own Spark task.
        results = (spark.sparkContext.parallelize(items, len(items))
                   .mapPartitions(lambda part: check_partition(part, timeout_s))
                   .collect())
        master = spark.sparkContext.master
    finally:
        spark.stop()
    problems = verdict(results)
    # The arguments are recorded to show what reached the job (by design they hold no secrets).
    report = {"ok": not problems, "problems": problems, "master": master, "clusters": results,
              "args": sys.argv[1:] if argv is None else argv,
              "elapsed_s": round(time.monotonic() - started, 3)}
    for r in results:
        log.info("%s at %s: healthy=%s clusters=%s error=%s (library %s)", r["name"], r["admin_url"],
                 r["healthy"], r["clusters"], r["error"], r["library_file"])
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        log.info("result written to %s", out)
    if problems:
        sys.stderr.write(f"error: smoke check failed: {'; '.join(problems)}\n")
        return 1
    log.info("smoke check passed: %s", ", ".join(r["name"] for r in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
