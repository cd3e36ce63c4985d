"""The migration DAG's Airflow half: `render_spec`, then per step a (spark-submit, publish report) pair.

    spec = render_spec_task(PROJECT_ROOT)
    submit, publish = step_tasks("sync_metadata", PROJECT_ROOT, upstream=spec)
    submit, publish = step_tasks("replicate_topics", PROJECT_ROOT, upstream=publish)   # and so on

The DAG must carry `user_defined_macros=dag_support.macros(PROJECT_ROOT)` (the library zip macro) and
the params `source_conn`, `target_conn` and `dry_run`. The pure logic is in `dag_support`; this module
only wires it into Airflow (imported by DAG files, never by Spark jobs).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseHook, TriggerRule, Variable, XComArg, get_current_context, task
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowNotFoundException

from pulsar_migration import dag_support, migration_report, rundir
from pulsar_migration.airflow.hook import PulsarHook

log = logging.getLogger(__name__)

SPEC_TASK_ID = "render_spec"
SPARK_CONN_ID = "spark_default"
ADMIN_POOL = "pulsar_admin"
CONN_PARAMS = ("source_conn", "target_conn")
REPORT_TASK_ID = "write_migration_report"
# Steps are idempotent, so a retry after a broker restart or a lost executor finishes the job exactly; a step
# that refuses its input (exit BAD_INPUT_EXIT: unknown tenant, conflicts, ...) fails at once instead.
STEP_RETRIES = 2
STEP_RETRY_DELAY = timedelta(seconds=20)
BAD_INPUT_EXIT = 2  # stepjob.BAD_INPUT_EXIT; not imported: that module pulls in the Spark-side library
_EXIT_CODE = re.compile(r"Error code is: (\d+)")
LOOKUP_PARAM = "lookup_conn"  # optional: without it, switch_lookup fails with one line (no route to switch)
FOLLOWS_PARAM = "follows_run_id"  # optional: the rolled-back migration run this one continues


def connection_ids(params: Any) -> list[str]:
    """The trigger's connections whose tokens a step may need: both clusters and the lookup service."""
    return [params[p] for p in CONN_PARAMS] + ([params[LOOKUP_PARAM]] if params.get(LOOKUP_PARAM) else [])
_FROM_SPEC = "{{ ti.xcom_pull(task_ids='" + SPEC_TASK_ID + "')['%s'] }}"


def render_spec_task(project_root: str | Path) -> XComArg:
    """The `render_spec` task: params + connections -> validated spec at RUN_DIR/spec.json.

    XCom: `{"spec_path": ..., "run_dir": ...}`. RUN_DIR is `<Variable pulsar_migration_run_dir_base>/
    <dag_id>/<run_id>` (relative bases under the project root), one per DAG run, shared by its steps.
    """

    @task(task_id=SPEC_TASK_ID, retries=0)
    def render_spec() -> dict[str, str]:
        """Builds the MigrationSpec from the trigger's params and the two Pulsar connections (token variable
        names only, never tokens), validates it and writes it to RUN_DIR/spec.json."""
        ctx = get_current_context()
        params = ctx["params"]
        base = Variable.get(dag_support.RUN_DIR_BASE_VARIABLE, default=dag_support.DEFAULT_RUN_DIR_BASE)
        try:
            dag_support.check_window(params, ctx.get("data_interval_start"))
            conns = [PulsarHook(params[p]).connection() for p in CONN_PARAMS]
            lookup = BaseHook.get_connection(params[LOOKUP_PARAM]) if params.get(LOOKUP_PARAM) else None
            document = dag_support.spec_document(params, *conns, lookup_conn=lookup, root=project_root)
            if params.get(FOLLOWS_PARAM):
                document = dag_support.following(document, base, params[FOLLOWS_PARAM], root=project_root)
        except (ValueError, AirflowNotFoundException) as exc:
            # Bad input does not get better on retry: fail now, with the one line as the reason.
            raise AirflowFailException(str(exc)) from None
        run_dir = dag_support.run_dir(base, ctx["dag"].dag_id, ctx["run_id"], root=project_root)
        spec_path = dag_support.write_spec(run_dir, document)
        log.info("spec: tenant %s, %s -> %s, namespaces %s, topics %s, options %s; written to %s",
                 document["tenant"], document["source"], document["target"], document["namespaces"] or "all",
                 document["topics"], document["options"], spec_path)
        return {"spec_path": spec_path, "run_dir": run_dir}

    return render_spec()


def switched_run_spec_task(project_root: str | Path, doing: str) -> XComArg:
    """`render_spec` of a DAG acting on an earlier migration run `migration_run_id` (the rollback DAG: rollback_lookup
    needs its position map; the cleanup DAG: cleanup_source its switch and map): that run's spec and run dir. XCom
    as render_spec_task's; fails (no retry) with one line when that run is unknown or used other connections.
    `doing` names the action in the log ("rolling back")."""

    @task(task_id=SPEC_TASK_ID, retries=0)
    def render_spec() -> dict[str, str]:
        """Finds the migration run and checks the trigger names its connections."""
        ctx = get_current_context()
        params = ctx["params"]
        base = Variable.get(dag_support.RUN_DIR_BASE_VARIABLE, default=dag_support.DEFAULT_RUN_DIR_BASE)
        try:
            connections = {conn_id: BaseHook.get_connection(conn_id) for conn_id in connection_ids(params)}
            anchored = dag_support.anchored(base, project_root)
            with dag_support.run_dir_spark(anchored) as spark:
                found = dag_support.switched_run_target(base, params["migration_run_id"], params, root=project_root,
                                                        spark=spark, connections=connections)
        except (ValueError, AirflowNotFoundException) as exc:
            raise AirflowFailException(str(exc)) from None
        log.info("%s run %s: spec %s", doing, params["migration_run_id"], found["spec_path"])
        return found

    return render_spec()


class MigrationStepOperator(SparkSubmitOperator):
    """`spark-submit spark_jobs/<step>.py --spec SPEC --run-dir RUN_DIR [--dry-run]` (DESIGN.md section 2).

    Spec and run dir come from render_spec's XCom; `--dry-run` is added when the trigger asks for it.
    The tokens of the trigger's two connections reach the driver as environment variables
    (dag_support.token_env_vars), never as arguments. Returns `{"report": RUN_DIR/<step>.json}`: that
    XCom exists only when this attempt exited 0, which the publish task relies on.
    """

    def __init__(self, *, step: str, project_root: str | Path, extra_args: Sequence[str] = (),
                 dry_run_unless: str | None = None, flags: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("task_id", step)
        kwargs.setdefault("conn_id", SPARK_CONN_ID)
        kwargs.setdefault("pool", ADMIN_POOL)
        kwargs.setdefault("name", f"pulsar-migration-{step}")
        # Built in the worker at render time; spark-submit ships it to wherever the executors run.
        kwargs.setdefault("py_files", "{{ pulsar_library_zip() }}")
        kwargs.setdefault("conf", {"spark.ui.enabled": "false"})
        kwargs.setdefault("retries", STEP_RETRIES)
        kwargs.setdefault("retry_delay", STEP_RETRY_DELAY)
        args = ["--spec", _FROM_SPEC % "spec_path", "--run-dir", _FROM_SPEC % "run_dir", *extra_args]
        super().__init__(application=str(Path(project_root) / "spark_jobs" / f"{step}.py"),
                         application_args=args, **kwargs)
        self.step = step
        self.dry_run_unless = dry_run_unless
        self.flags = dict(flags or {})
        # Rendering overwrites the templated fields in place; these keep the originals for every run.
        self._base_args = list(args)
        self._base_env = dict(self.env_vars or {})

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        params = context["params"]
        # The trigger picks the connections, so the variables' names are known only now; their values
        # are still templates, rendered (and masked) by Airflow like any other field.
        self.env_vars = {**self._base_env, **dag_support.token_env_vars(connection_ids(params))}
        flags = [flag for param, flag in self.flags.items() if params.get(param)]
        dry = step_is_dry_run(params, self.dry_run_unless)
        self.application_args = [*self._base_args, *flags, *(["--dry-run"] if dry else [])]
        super().render_template_fields(context, jinja_env)

    def execute(self, context: Any) -> dict[str, str]:
        try:
            super().execute(context)  # raises unless spark-submit exited 0
        except AirflowException as exc:
            code = _EXIT_CODE.search(str(exc))
            if code and int(code.group(1)) == BAD_INPUT_EXIT:
                raise AirflowFailException(f"{self.step} refused its input (exit {BAD_INPUT_EXIT}); see the error "
                                           "line above and the step's report: a retry cannot help") from None
            raise
        args = list(self.application_args or [])
        return {"report": rundir.join(args[args.index("--run-dir") + 1], f"{self.step}.json")}


def step_is_dry_run(params: Any, dry_run_unless: str | None) -> bool:
    """A step plans only when the trigger asks for a dry run, or when it needs a confirmation it lacks."""
    return bool(params.get("dry_run")) or (dry_run_unless is not None and not params.get(dry_run_unless))


def step_tasks(step: str, project_root: str | Path, upstream: Any, *, dry_run_unless: str | None = None,
               flags: Mapping[str, str] | None = None, extra_args: Sequence[str] = (),
               retries: int = STEP_RETRIES) -> tuple[MigrationStepOperator, XComArg]:
    """`<step>` (spark-submit) and `publish_<step>_report`, downstream of `upstream`; returns both.

    `dry_run_unless` names a boolean param without which the step only plans (cleanup_source: deletion must
    be confirmed); `flags` maps boolean params to step arguments; `extra_args` (templates) follow `--run-dir`
    (backfill_window: `--start`/`--end`). The publish task runs whatever the step's
    outcome (all_done) and fails unless the step succeeded and its report says so, so a failed step can
    never leave the DAG run green.
    """
    submit = MigrationStepOperator(step=step, project_root=project_root, dry_run_unless=dry_run_unless,
                                   flags=flags, extra_args=extra_args, retries=retries)

    @task(task_id=f"publish_{step}_report", trigger_rule=TriggerRule.ALL_DONE, retries=0)
    def publish() -> dict[str, Any]:
        """Logs the step's report summary and returns its verdict, counts, hashes, plan and conflicts;
        fails when the step failed or its report is missing or not this attempt's."""
        ctx = get_current_context()
        ti = ctx["ti"]
        rendered = ti.xcom_pull(task_ids=SPEC_TASK_ID)
        if not rendered:
            raise AirflowFailException(f"{step}: no report to publish: {SPEC_TASK_ID} did not succeed")
        finished = ti.xcom_pull(task_ids=submit.task_id)
        try:
            return dag_support.step_outcome(rendered["run_dir"], step, step_succeeded=finished is not None,
                                            dry_run=step_is_dry_run(ctx["params"], dry_run_unless), log=log)
        except dag_support.StepOutcomeError as exc:
            raise AirflowFailException(str(exc)) from None

    published = publish()
    upstream >> submit >> published
    return submit, published


def report_task(upstream: Any, *, of_migration_run: bool = False, after_rollback: bool = False) -> XComArg:
    """`write_migration_report`: RUN_DIR/report.{json,md,html} from the steps' reports, whatever they did.

    Runs after every publish task (all_done), so a failed run gets its report too; then fails when the
    migration did, because as the DAG's last task its state decides the run's. XCom: the three locations
    and the verdict. `of_migration_run`: in a DAG acting on the migration run `migration_run_id` (the cleanup
    DAG), the report is that run's, written again after the step succeeded (all_success), so its report tab
    shows the later step's outcome. `after_rollback` (the rollback DAG, with `of_migration_run`): written whatever
    the rollback did (a failed one is told in it), and failing when the rollback did, not for the migration's
    verdict (a rollback moving the clients back after a failed switch is the rollback's success).
    """
    rule = TriggerRule.ALL_SUCCESS if of_migration_run and not after_rollback else TriggerRule.ALL_DONE

    @task(task_id=REPORT_TASK_ID, trigger_rule=rule, retries=0)
    def write_migration_report() -> dict[str, Any]:
        """Writes the migration report for people (plan counts, per-partition counts and hashes,
        per-subscription lost/duplicated, cutover hold and phases, cleanup, every step's time)."""
        ctx = get_current_context()
        rendered = ctx["ti"].xcom_pull(task_ids=SPEC_TASK_ID)
        if not rendered:
            raise AirflowFailException(f"no report: {SPEC_TASK_ID} did not succeed, so there is no run dir")
        run_dir = rendered["run_dir"]
        dag_id, run_id = ctx["dag"].dag_id, ctx["run_id"]
        if of_migration_run:
            dag_id, run_id = dag_support.MIGRATION_DAG_ID, ctx["params"]["migration_run_id"]
        with dag_support.run_dir_spark(run_dir) as spark:
            summary = migration_report.build(run_dir, dag_id=dag_id, run_id=run_id, spark=spark)
            written = migration_report.write(run_dir, summary, spark)
        log.info("migration report (%s: %s): %s", summary["verdict"], summary["meaning"], written["html"])
        log.info("lost %d, duplicated %d; steps: %s", summary["lost"], summary["duplicated"],
                 ", ".join(f"{s['step']} {s['verdict']}" for s in summary["steps"]))
        if after_rollback:
            rollback = [s for s in summary["steps"] if s["step"] == migration_report.ROLLBACK_STEP]
            if not rollback or rollback[-1]["verdict"] not in ("ok", "planned"):
                raise AirflowFailException(f"the rollback did not succeed (report: {written['html']})")
        elif summary["verdict"] == "failed":
            failed = [s["step"] for s in summary["steps"] if s["verdict"] not in ("ok", "planned")]
            raise AirflowFailException(f"migration failed at {failed[0]} (report: {written['html']})")
        return {**written, "verdict": summary["verdict"], "meaning": summary["meaning"], "lost": summary["lost"],
                "duplicated": summary["duplicated"]}

    report = write_migration_report()
    upstream >> report
    return report
