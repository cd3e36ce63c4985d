"""Routes (tenant -> cluster) and their audit trail, persisted through SQLAlchemy (SQLite by default).

Every change is one row in `route_events` (time, actor, reason, from, to, action); `routes` holds the
current answer. Both are written in one transaction, so the trail never misses a change that took.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Column, DateTime, Integer, MetaData, String, Table, create_engine, select
from sqlalchemy.engine import Engine

metadata = MetaData()

routes_table = Table(
    "routes", metadata,
    Column("tenant", String(255), primary_key=True),
    Column("cluster", String(255), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("updated_by", String(255), nullable=False),
    Column("reason", String(1000), nullable=False),
)

events_table = Table(
    "route_events", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("tenant", String(255), nullable=False, index=True),
    Column("action", String(32), nullable=False),  # set | delete | hold | release
    Column("from_cluster", String(255)),
    Column("to_cluster", String(255)),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("actor", String(255), nullable=False),
    Column("reason", String(1000), nullable=False),
)

holds_table = Table(
    "holds", metadata,
    Column("tenant", String(255), primary_key=True),
    Column("since", DateTime(timezone=True), nullable=False),
    Column("actor", String(255), nullable=False),
    Column("reason", String(1000), nullable=False),
)


@dataclass(frozen=True)
class Route:
    tenant: str
    cluster: str
    updated_at: str
    updated_by: str
    reason: str


@dataclass(frozen=True)
class RouteEvent:
    id: int
    tenant: str
    action: str
    from_cluster: str | None
    to_cluster: str | None
    at: str
    actor: str
    reason: str


def _iso(value: datetime) -> str:
    if value.tzinfo is None:  # SQLite hands back naive datetimes; they were written in UTC
        value = value.replace(tzinfo=UTC)
    return value.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class RouteStore:
    def __init__(self, database_url: str) -> None:
        if database_url.startswith("sqlite:///") and not database_url.startswith("sqlite:////:memory:"):
            path = database_url.removeprefix("sqlite:///")
            if path and path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.engine: Engine = create_engine(database_url, future=True)
        metadata.create_all(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def all(self) -> dict[str, Route]:
        with self.engine.connect() as conn:
            return {r.tenant: _route(r) for r in conn.execute(select(routes_table))}

    def get(self, tenant: str) -> Route | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(routes_table).where(routes_table.c.tenant == tenant)).first()
            return _route(row) if row else None

    def set(self, tenant: str, cluster: str, *, actor: str, reason: str) -> tuple[Route, str | None]:
        """Sets the route; returns it and the cluster it pointed to before (None: new)."""
        now = datetime.now(UTC)
        with self.engine.begin() as conn:
            row = conn.execute(select(routes_table).where(routes_table.c.tenant == tenant)).first()
            before = row.cluster if row else None
            values = {"cluster": cluster, "updated_at": now, "updated_by": actor, "reason": reason}
            if row:
                conn.execute(routes_table.update().where(routes_table.c.tenant == tenant).values(**values))
            else:
                conn.execute(routes_table.insert().values(tenant=tenant, **values))
            conn.execute(events_table.insert().values(tenant=tenant, action="set", from_cluster=before,
                                                      to_cluster=cluster, at=now, actor=actor, reason=reason))
        return Route(tenant, cluster, _iso(now), actor, reason), before

    def delete(self, tenant: str, *, actor: str, reason: str) -> str | None:
        now = datetime.now(UTC)
        with self.engine.begin() as conn:
            row = conn.execute(select(routes_table).where(routes_table.c.tenant == tenant)).first()
            if row is None:
                return None
            conn.execute(routes_table.delete().where(routes_table.c.tenant == tenant))
            conn.execute(events_table.insert().values(tenant=tenant, action="delete", from_cluster=row.cluster,
                                                      to_cluster=None, at=now, actor=actor, reason=reason))
            return str(row.cluster)

    def held(self) -> dict[str, str]:
        """Held tenants and since when (a hold survives a restart of the service: the fence must)."""
        with self.engine.connect() as conn:
            return {r.tenant: _iso(r.since) for r in conn.execute(select(holds_table))}

    def set_hold(self, tenant: str, held: bool, *, cluster: str | None, actor: str, reason: str) -> bool:
        """Holds or releases; returns False when it already was so (recorded anyway)."""
        now = datetime.now(UTC)
        with self.engine.begin() as conn:
            present = conn.execute(select(holds_table).where(holds_table.c.tenant == tenant)).first() is not None
            if held and not present:
                conn.execute(holds_table.insert().values(tenant=tenant, since=now, actor=actor, reason=reason))
            elif not held and present:
                conn.execute(holds_table.delete().where(holds_table.c.tenant == tenant))
            conn.execute(events_table.insert().values(tenant=tenant, action="hold" if held else "release",
                                                      from_cluster=cluster, to_cluster=cluster, at=now, actor=actor,
                                                      reason=reason))
        return held != present

    def history(self, tenant: str, limit: int = 100) -> list[RouteEvent]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(events_table).where(events_table.c.tenant == tenant)
                                .order_by(events_table.c.id.desc()).limit(limit))
            return [RouteEvent(r.id, r.tenant, r.action, r.from_cluster, r.to_cluster, _iso(r.at), r.actor,
                               r.reason) for r in rows]


def _route(row: object) -> Route:
    return Route(row.tenant, row.cluster, _iso(row.updated_at), row.updated_by, row.reason)  # type: ignore[attr-defined]
