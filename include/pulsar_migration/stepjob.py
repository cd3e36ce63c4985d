"""The shared runner of every `spark_jobs/<step>.py`: the step contract of DESIGN.md section 2 in one place.

    spark-submit spark_jobs/<step>.py --spec SPEC.json --run-dir RUN_DIR [--dry-run]

Exit 0: the body returned and its verification held; the report says "ok" ("planned" for a dry run).
Exit 2: the arguments or the spec are invalid, a token variable is unset, or a cluster refuses its token;
nothing was done or written.
Exit 1: the step failed; the report (verdict "failed") is still written when the run dir allows it.
Failures end with exactly one line `error: ...` on stderr, after all other output of the runner.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pulsar_migration import rundir
from pulsar_migration.admin import AdminError, AuthRejected
from pulsar_migration.report import StepReport
from pulsar_migration.spec import MigrationSpec, SpecError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

_MAX_ERROR_CHARS = 1000


class StepFailed(RuntimeError):
    """A step's own verification failed; the message is the one error line."""


class BadInput(StepFailed):
    """The spec does not fit the clusters (unknown tenant, conflicts, a missing earlier step): running the step
    again cannot help until a human changes something, so it exits with BAD_INPUT_EXIT, not FAILED_EXIT."""


# Exit codes of the step contract: the DAG retries FAILED_EXIT (perhaps a broker restarting) but not BAD_INPUT_EXIT.
FAILED_EXIT = 1
BAD_INPUT_EXIT = 2


# Steps shuffle thousands of metadata rows, not terabytes: 200 shuffle tasks would dominate run time.
_SESSION_DEFAULTS = {
    "spark.sql.shuffle.partitions": "8",
    "spark.ui.showConsoleProgress": "false",
}


class _LazySpark:
    """Builds the SparkSession on first use; stops it only if this object built it."""

    def __init__(self, app_name: str) -> None:
        self.app_name = app_name
        self._session: SparkSession | None = None
        self._owned = False

    def get(self) -> SparkSession:
        if self._session is None:
            from pyspark import SparkConf, SparkContext
            from pyspark.sql import SparkSession

            # A session someone else started (a test fixture, a notebook) is reused and left running.
            self._owned = SparkContext._active_spark_context is None
            given = SparkConf()  # what spark-submit --conf / spark-defaults set: those win
            builder = SparkSession.builder.appName(self.app_name).config("spark.sql.session.timeZone", "UTC")
            for key, value in _SESSION_DEFAULTS.items():
                if not given.contains(key):
                    builder = builder.config(key, value)
            self._session = builder.getOrCreate()
            if self._owned and not given.contains("spark.log.level"):
                self._session.sparkContext.setLogLevel("WARN")  # keep the step's own log readable
        return self._session

    def stop(self) -> None:
        if self._session is not None and self._owned:
            self._session.stop()
        self._session = None

    def for_uri(self, uri: str) -> SparkSession | None:
        """The session, only when `uri` needs one (non-local run dirs and specs)."""
        return None if rundir.is_local(uri) else self.get()


@dataclass
class StepContext:
    step: str
    spec: MigrationSpec
    run_dir: str
    dry_run: bool
    args: argparse.Namespace
    report: StepReport
    _lazy_spark: _LazySpark | None = field(default=None, repr=False, compare=False)

    @property
    def spark(self) -> SparkSession:
        if self._lazy_spark is None:
            self._lazy_spark = _LazySpark(f"pulsar-migration-{self.step}")
        return self._lazy_spark.get()


def run_step(
    step: str,
    body: Callable[[StepContext], None],
    argv: list[str] | None = None,
    *,
    add_args: Callable[[argparse.ArgumentParser], None] | None = None,
) -> int:
    """Runs one step under the contract; returns the process exit code (`sys.exit(run_step(...))`)."""
    configure_logging()
    parser = argparse.ArgumentParser(prog=f"{step}.py", description=f"Pulsar tenant migration step {step}.")
    parser.add_argument("--spec", required=True, help="MigrationSpec JSON (path or URI)")
    parser.add_argument("--run-dir", required=True, help="directory for reports and datasets (path or URI)")
    parser.add_argument("--dry-run", action="store_true", help="plan and report without writing to any cluster")
    if add_args is not None:
        add_args(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # usage errors (2) and --help (0): argparse has already printed
        return exc.code if isinstance(exc.code, int) else 2

    spark = _LazySpark(f"pulsar-migration-{step}")
    try:
        code, error_line = _run(step, body, args, spark)
    finally:
        spark.stop()
    if error_line:
        write_error_line(error_line)
    return code


def write_error_line(line: str) -> None:
    """Writes the final error line to the stderr of the process the caller started.

    Under spark-submit the Python driver's stdout and stderr are merged into spark-submit's *stdout*
    (PythonRunner redirects the error stream), so there the line goes through the JVM's System.err.
    """
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # set by spark-submit's PythonRunner only
        try:
            from pyspark import SparkContext
            from pyspark.java_gateway import launch_gateway

            gateway = SparkContext._gateway or launch_gateway()  # connects to the running JVM, starts none
            gateway.jvm.System.err.println(line)
            gateway.jvm.System.err.flush()
            return
        except Exception:
            log.debug("cannot reach the JVM's stderr; using Python's", exc_info=True)
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def configure_logging() -> None:
    """INFO to stderr, unless the process already set up handlers (e.g. under pytest); quiet chatty libraries."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    for chatty in ("py4j", "urllib3"):
        logging.getLogger(chatty).setLevel(logging.WARNING)


def _run(step: str, body: Callable[[StepContext], None], args: argparse.Namespace,
         spark: _LazySpark) -> tuple[int, str | None]:
    try:
        spec = MigrationSpec.load(args.spec, spark.for_uri(args.spec))
        spec.check_environment()
        spec.check_credentials()
    except SpecError as exc:
        return BAD_INPUT_EXIT, f"error: {_one_line(str(exc))}"
    except AuthRejected as exc:  # before the run dir or any cluster is touched
        return BAD_INPUT_EXIT, f"error: {step}: {_one_line(str(exc))}"

    report = StepReport.start(step, spec, dry_run=args.dry_run)
    ctx = StepContext(step=step, spec=spec, run_dir=args.run_dir, dry_run=args.dry_run, args=args,
                      report=report, _lazy_spark=spark)
    log.info("%s: tenant %s, %s -> %s, spec %s, run dir %s%s", step, spec.tenant, spec.source, spec.target,
             report.spec_hash, args.run_dir, " (dry run)" if args.dry_run else "")
    try:
        # Before any cluster is touched: work whose report cannot be written is not worth starting.
        rundir.ensure_dir(args.run_dir, spark.for_uri(args.run_dir))
    except Exception as exc:
        log.debug("cannot create run dir", exc_info=True)
        return FAILED_EXIT, f"error: {step}: cannot create run dir {args.run_dir}: {_one_line(_reason(exc))}"

    error, code = _run_body(step, body, ctx)
    expired = spec.expired_tokens_note() if error is not None and "expired at" not in error else None
    if expired:  # the cause, whatever the failure looked like where it surfaced; first, as the line may be cut
        error = _one_line(f"{expired} during the run (a re-run with a fresh token resumes): {error}")
    if error is None:
        # A dry run's body may set its own verdict; otherwise it planned.
        dry_verdict = "planned" if report.verdict == "running" else report.verdict
        report.finish(dry_verdict if args.dry_run else "ok")
    else:
        report.finish("failed", error)
    try:
        report.write(args.run_dir, spark.for_uri(args.run_dir))
    except Exception as exc:
        log.debug("cannot write report", exc_info=True)
        problem = f"cannot write report to {args.run_dir}: {_one_line(_reason(exc))}"
        if error is None:
            error, code = problem, FAILED_EXIT
            report.finish("failed", error)
        else:
            log.warning("%s", problem)
    for line in report.summary_lines():
        log.info("%s", line)
    return (0, None) if error is None else (code, f"error: {step}: {error}")


def _run_body(step: str, body: Callable[[StepContext], None], ctx: StepContext) -> tuple[str | None, int]:
    """Runs the body; returns (None, 0) on success, else the one-line error and the exit code."""
    try:
        body(ctx)
        if ctx.report.verdict == "failed":
            raise StepFailed(ctx.report.error or "the step reported verdict 'failed'")
    except (BadInput, SpecError, AuthRejected) as exc:
        log.debug("%s refused its input", step, exc_info=True)
        return _one_line(str(exc) or type(exc).__name__), BAD_INPUT_EXIT
    except (StepFailed, AdminError) as exc:
        log.debug("%s failed", step, exc_info=True)
        return _one_line(str(exc) or type(exc).__name__), FAILED_EXIT
    except Exception as exc:
        log.error("%s failed unexpectedly", step, exc_info=True)
        return _one_line(f"{type(exc).__name__}: {exc}"), FAILED_EXIT
    return None, 0


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _MAX_ERROR_CHARS else line[: _MAX_ERROR_CHARS - 3] + "..."
