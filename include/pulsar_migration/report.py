"""Step reports: what a step planned, did, counted and hashed, and its verdict (`RUN_DIR/<step>.json`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any, Literal

from pulsar_migration import rundir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pulsar_migration.spec import MigrationSpec

# "running" only exists in memory, between start and the end of the step.
Verdict = Literal["running", "ok", "failed", "planned"]


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def canonical_line(value: Any) -> str:
    """One deterministic JSON line for a row (sorted keys, no spaces), for stable_hash."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_jsonable)


def stable_hash(rows: Iterable[str]) -> str:
    """sha256 (hex) over the sorted lines: equal multisets of rows hash equal, whatever their order."""
    digest = hashlib.sha256()
    for line in sorted(rows):
        # JSON-quoting keeps rows holding newlines from colliding with split rows.
        digest.update(json.dumps(line, ensure_ascii=False).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


@dataclass
class StepReport:
    step: str
    tenant: str
    source: str
    target: str
    spec_hash: str
    dry_run: bool = False
    started_at: str = field(default_factory=utc_now)
    finished_at: str | None = None
    duration_s: float | None = None
    verdict: Verdict = "running"
    error: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._clock = time.monotonic()  # not a field: durations must not jump with the wall clock

    @classmethod
    def start(cls, step: str, spec: MigrationSpec, dry_run: bool = False) -> StepReport:
        return cls(step=step, tenant=spec.tenant, source=spec.source, target=spec.target,
                   spec_hash=spec.spec_hash(), dry_run=dry_run)

    def count(self, name: str, by: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + by

    def finish(self, verdict: Verdict, error: str | None = None) -> None:
        self.verdict = verdict
        self.error = error
        self.finished_at = utc_now()
        self.duration_s = round(time.monotonic() - self._clock, 3)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False, default=_jsonable) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepReport:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def write(self, run_dir: str, spark: SparkSession | None = None) -> str:
        """Writes `RUN_DIR/<step>.json`; returns its location."""
        return rundir.write_text(run_dir, f"{self.step}.json", self.to_json(), spark)

    @classmethod
    def read(cls, run_dir: str, step: str, spark: SparkSession | None = None) -> StepReport:
        return cls.from_dict(json.loads(rundir.read_text(run_dir, f"{step}.json", spark)))

    def summary_lines(self) -> list[str]:
        """A few short lines for task logs."""
        mode = " (dry run)" if self.dry_run else ""
        took = f" in {self.duration_s:.1f}s" if self.duration_s is not None else ""
        lines = [f"{self.step}: {self.verdict}{mode}, tenant {self.tenant}, {self.source} -> {self.target}"
                 f"{took}, spec {self.spec_hash}"]
        if self.counts:
            lines.append("counts: " + ", ".join(f"{k}={v}" for k, v in sorted(self.counts.items())))
        if self.hashes:
            lines.append("hashes: " + ", ".join(f"{k}={v[:16]}" for k, v in sorted(self.hashes.items())))
        if self.error:
            lines.append(f"failure: {self.error}")
        return lines


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)
