"""The trigger-form params the project's DAGs share: clusters, what to take, dry run, windows.

Each function returns `{name: Param}` to splat into a DAG's `params`, so every DAG's form names and explains a
field the same way. Keys map onto the spec through dag_support.PARAM_TO_SPEC.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param

from pulsar_migration.dag_support import CONN_ID_PATTERN
from pulsar_migration.spec import PULSAR_NAME_PATTERN

_NAME = {"type": "string", "pattern": PULSAR_NAME_PATTERN}
_REGEXES = {"type": "array", "items": {"type": "string", "minLength": 1}}
# An ISO instant the form offers a date-time picker for; null means "not given".
_INSTANT = {"type": ["null", "string"], "format": "date-time"}


def cluster_params(source_help: str, target_help: str) -> dict[str, Param]:
    return {
        "source_conn": Param("pulsar_cluster_a", type="string", pattern=CONN_ID_PATTERN, title="Source connection",
                             section="Clusters", description=source_help),
        "target_conn": Param("pulsar_cluster_b", type="string", pattern=CONN_ID_PATTERN, title="Target connection",
                             section="Clusters", description=target_help),
    }


def lookup_param(description: str) -> dict[str, Param]:
    return {"lookup_conn": Param("pulsar_lookup", type="string", pattern=CONN_ID_PATTERN,
                                 title="Lookup service connection", section="Clusters", description=description)}


def selection_params(tenant_default: str | None = None) -> dict[str, Param]:
    """Tenant, namespaces and topic regexes. Without a tenant default the form cannot be submitted without one
    (allowed only in DAGs without a schedule)."""
    tenant_kwargs: dict[str, Any] = {"title": "Tenant", "section": "What to take", **_NAME,
                                     "description": "The Pulsar tenant (letters, digits and - = : . _ only)."}
    tenant = Param(**tenant_kwargs) if tenant_default is None else Param(tenant_default, **tenant_kwargs)
    return {
        "tenant": tenant,
        "namespaces": Param(None, type=["null", "array"], items=_NAME, minItems=1, uniqueItems=True,
                            title="Namespaces", section="What to take",
                            description="Short namespace names (ns1, not tenant/ns1); empty (null) = all of "
                                        "the tenant's namespaces."),
        "topics_include": Param([".*"], **_REGEXES, minItems=1, title="Topics to include", section="What to take",
                                description="Regexes on `<namespace>/<topic>`; a topic is taken when one "
                                            "matches (re.search)."),
        # null too: the form sets an emptied list field to null, which an array-only type refused (no way back to
        # "nothing excluded" without resetting the form); spec_document reads null as [].
        "topics_exclude": Param([], **{**_REGEXES, "type": ["null", "array"]}, title="Topics to exclude",
                                section="What to take",
                                description="Regexes on `<namespace>/<topic>`; a topic matching any is skipped."),
    }


def dry_run_param() -> dict[str, Param]:
    return {"dry_run": Param(False, type="boolean", title="Dry run", section="Behaviour",
                             description="Plan and report only; no cluster or archive is changed.")}


def rate_cap_params() -> dict[str, Param]:
    return {
        "copy_max_mb_per_s": Param(None, type=["null", "number"], exclusiveMinimum=0,
                                   title="Copy rate limit (MB/s)", section="Behaviour",
                                   description="The most source payload the copy reads per second, over all "
                                               "partitions (MB = 10^6 bytes), to spare a live source cluster; "
                                               "empty = as fast as it goes. Copy mode only; the cutover's deltas "
                                               "are not capped."),
        "copy_max_msgs_per_s": Param(None, type=["null", "number"], exclusiveMinimum=0,
                                     title="Copy rate limit (messages/s)", section="Behaviour",
                                     description="The most source messages the copy reads per second, over all "
                                                 "partitions (brokers pay per message for small ones); empty = no "
                                                 "such cap. Applies with the MB/s limit."),
    }


def archive_params(sink_default: str = "pulsar") -> dict[str, Param]:
    return {
        "backfill_sink": Param(sink_default, type="string", enum=["pulsar", "parquet"], title="Sink",
                               section="Sink",
                               description="pulsar: the target connection's cluster, exactly once by the copy rules "
                                           "of replicate_topics. parquet: the archive at Archive path, partitioned "
                                           "by tenant/namespace/topic/date/window."),
        "archive_path": Param("var/archive", type="string", minLength=1, title="Archive path", section="Sink",
                              description="Root of the Parquet archive: a path (relative ones are under the project "
                                          "root) or a URI Spark writes, e.g. s3a://bucket/pulsar-archive."),
    }


def window_params(required: bool) -> dict[str, Param]:
    """`window_start`/`window_end`: ISO instants, start inclusive, end exclusive."""
    if required:
        kind: dict[str, Any] = {"type": "string", "format": "date-time"}
        hint = ""
    else:
        kind = {**_INSTANT, "default": None}
        hint = " Empty: the run's data interval (the scheduled window)."
    return {
        "window_start": Param(**kind, title="Window start", section="Window",
                              description="First publish time taken (inclusive), an ISO instant; naive = UTC." + hint),
        "window_end": Param(**kind, title="Window end", section="Window",
                            description="Publish time the window stops before (exclusive)." + hint),
    }


def migration_run_param(section: str, description: str) -> dict[str, Param]:
    """The run id of an earlier pulsar_tenant_migration run; no default, so the form cannot be sent without it."""
    return {"migration_run_id": Param(type="string", minLength=1, title="Migration run id", section=section,
                                      description=description)}


def cleanup_params(confirm_help: str) -> dict[str, Param]:
    return {
        "confirm_cleanup": Param(False, type="boolean", title="Confirm cleanup", section="Cleanup",
                                 description=confirm_help),
        "delete_tenant": Param(False, type="boolean", title="Delete the tenant", section="Cleanup",
                               description="With Confirm cleanup: also delete the tenant itself on the source once "
                                           "nothing of it is left there."),
    }
