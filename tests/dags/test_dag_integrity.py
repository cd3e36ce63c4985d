"""Every DAG file imports cleanly and carries what the UI and reviewers need."""

from __future__ import annotations

import pytest
from airflow.dag_processing.dagbag import DagBag
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from localdev.airflow_settings import load_settings

from tests.dags.conftest import DAGS_DIR


@pytest.fixture(scope="module")
def dagbag() -> DagBag:
    return DagBag(dag_folder=str(DAGS_DIR))


# Every DAG file must be listed here: a file whose DAG silently fails to register is caught too.
EXPECTED_DAGS = {"pulsar_smoke", "pulsar_tenant_migration", "pulsar_scheduled_backfill", "pulsar_archive_restore",
                 "pulsar_tenant_rollback", "pulsar_source_cleanup"}


def test_no_import_errors(dagbag: DagBag) -> None:
    assert not dagbag.import_errors, "\n".join(f"{f}: {e}" for f, e in dagbag.import_errors.items())
    assert EXPECTED_DAGS <= set(dagbag.dags), f"missing DAGs in {DAGS_DIR}: {EXPECTED_DAGS - set(dagbag.dags)}"


def test_every_dag_has_tags_and_doc(dagbag: DagBag) -> None:
    for dag_id, dag in dagbag.dags.items():
        assert dag.tags, f"{dag_id} has no tags"
        assert dag.doc_md and dag.doc_md.strip(), f"{dag_id} has no doc_md"


def test_every_param_has_title_and_description(dagbag: DagBag) -> None:
    """The trigger form shows titles and descriptions; a bare key is no help to an operator."""
    for dag_id, dag in dagbag.dags.items():
        for name in dag.params:
            param = dag.params.get_param(name)
            assert param.schema.get("title"), f"{dag_id}: param {name!r} has no title"
            assert param.description, f"{dag_id}: param {name!r} has no description"


def test_migration_dag_shape(dagbag: DagBag) -> None:
    dag = dagbag.dags["pulsar_tenant_migration"]
    assert not dag.timetable.can_be_scheduled and "migration" in dag.tags  # UI-triggered only
    assert dag.max_active_runs == 1  # two runs must not race on a tenant's metadata
    assert set(dag.task_dict) == {"render_spec", "sync_metadata", "publish_sync_metadata_report",
                                  "replicate_topics", "publish_replicate_topics_report", "sync_progress",
                                  "publish_sync_progress_report", "switch_lookup", "publish_switch_lookup_report",
                                  "cleanup_source", "publish_cleanup_source_report", "write_migration_report"}
    assert dag.task_dict["sync_metadata"].upstream_task_ids == {"render_spec"}
    publish = dag.task_dict["publish_sync_metadata_report"]
    assert publish.upstream_task_ids == {"sync_metadata"} and publish.trigger_rule == "all_done"
    # steps run in order: each waits for the previous step's report to be published (and to say ok)
    assert dag.task_dict["replicate_topics"].upstream_task_ids == {"publish_sync_metadata_report"}
    assert dag.task_dict["publish_replicate_topics_report"].upstream_task_ids == {"replicate_topics"}
    assert dag.task_dict["sync_progress"].upstream_task_ids == {"publish_replicate_topics_report"}
    assert dag.task_dict["publish_sync_progress_report"].upstream_task_ids == {"sync_progress"}
    assert dag.task_dict["switch_lookup"].upstream_task_ids == {"publish_sync_progress_report"}
    assert dag.task_dict["cleanup_source"].upstream_task_ids == {"publish_switch_lookup_report"}
    assert dag.task_dict["cleanup_source"].dry_run_unless == "confirm_cleanup"
    report = dag.task_dict["write_migration_report"]
    assert report.trigger_rule == "all_done" and report.upstream_task_ids == {
        f"publish_{step}_report" for step in ("sync_metadata", "replicate_topics", "sync_progress", "switch_lookup",
                                              "cleanup_source")}
    assert dag.leaves == [report]  # its state decides the run's: it fails when the migration did


def test_spark_tasks_retry_and_the_docs_say_why(dagbag: DagBag) -> None:
    """Steps are idempotent, so their Spark tasks retry; the DAG's docs tell users retries are safe."""
    for dag_id, dag in dagbag.dags.items():
        if dag_id == "pulsar_smoke":  # reports the clusters' state right now: a retry would hide a flap
            continue
        spark_tasks = [t for t in dag.tasks if isinstance(t, SparkSubmitOperator)]
        for task in spark_tasks:
            assert task.retries >= 1, f"{dag_id}.{task.task_id} has no retries"
        if spark_tasks:
            assert "Retries are safe" in (dag.doc_md or ""), f"{dag_id}: doc_md does not say retries are safe"


def test_pools_and_spark_connections_are_in_airflow_settings(dagbag: DagBag) -> None:
    """A task on a pool or connection the local environment lacks would queue forever or fall back to yarn."""
    settings = load_settings()
    pools = {p.name for p in settings.pools} | {"default_pool"}
    conns = {c.conn_id for c in settings.connections}
    for dag_id, dag in dagbag.dags.items():
        for task in dag.tasks:
            assert task.pool in pools, f"{dag_id}.{task.task_id}: pool {task.pool!r} is not in airflow_settings.yaml"
            if isinstance(task, SparkSubmitOperator):  # subclasses too (the migration steps)
                conn_id = getattr(task, "_conn_id", None)
                assert conn_id in conns, f"{dag_id}.{task.task_id}: connection {conn_id!r} not in airflow_settings.yaml"


def test_backfill_dags_shape(dagbag: DagBag) -> None:
    """Hourly windows with catchup, one at a time; the step gets the window as --start/--end."""
    dag = dagbag.dags["pulsar_scheduled_backfill"]
    assert dag.catchup and dag.max_active_runs == 1 and dag.timetable.can_be_scheduled
    # Paused on deployment whatever the installation's default: catch-up with the form's defaults waits for an operator.
    assert dag.is_paused_upon_creation is True
    assert type(dag.timetable).__name__ == "CronDataIntervalTimetable"  # a real [start, end) interval per run
    assert set(dag.task_dict) == {"render_spec", "backfill_window", "publish_backfill_window_report"}
    args = dag.task_dict["backfill_window"].application_args
    assert args[-4] == "--start" and "data_interval_start" in args[-3] and "data_interval_end" in args[-1]
    for name in dag.params:  # a scheduled run has no form: every param needs a valid default
        dag.params.get_param(name).resolve()
    restore = dagbag.dags["pulsar_archive_restore"]
    assert not restore.timetable.can_be_scheduled
    assert set(restore.task_dict) == {"render_spec", "restore_window", "publish_restore_window_report"}


def test_source_cleanup_dag_shape(dagbag: DagBag) -> None:
    dag = dagbag.dags["pulsar_source_cleanup"]
    assert not dag.timetable.can_be_scheduled and dag.max_active_runs == 1
    assert set(dag.task_dict) == {"render_spec", "cleanup_source", "publish_cleanup_source_report",
                                  "write_migration_report"}
    assert dag.task_dict["write_migration_report"].trigger_rule == "all_success"  # the run's report, after a cleanup
    step = dag.task_dict["cleanup_source"]
    assert step.application.endswith("spark_jobs/cleanup_source.py") and step.dry_run_unless == "confirm_cleanup"
    assert not dag.params.get_param("migration_run_id").has_value
    assert dag.params.get_param("confirm_cleanup").value is False  # a dry run unless confirmed


def test_rollback_dag_shape(dagbag: DagBag) -> None:
    dag = dagbag.dags["pulsar_tenant_rollback"]
    assert not dag.timetable.can_be_scheduled and dag.max_active_runs == 1
    assert set(dag.task_dict) == {"render_spec", "rollback_lookup", "publish_rollback_lookup_report",
                                  "write_migration_report"}
    assert dag.task_dict["rollback_lookup"].application.endswith("spark_jobs/rollback_lookup.py")
    assert not dag.params.get_param("migration_run_id").has_value  # the form cannot be sent without it
