"""PulsarHook: a Pulsar cluster from an Airflow connection of type `pulsar` (admin host/port/scheme, extra
`cluster_name`, `service_url`, `tls`, the token as password). The DAGs' render_spec reads its clusters through
it; the connection form's *Test* button calls `test_connection`."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from pulsar_migration import dag_support
from pulsar_migration.admin import AdminError, PulsarAdmin
from pulsar_migration.spec import TlsSpec


class PulsarHook(BaseHook):
    conn_name_attr = "pulsar_conn_id"
    default_conn_name = "pulsar_default"
    conn_type = "pulsar"
    hook_name = "Pulsar"

    def __init__(self, pulsar_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pulsar_conn_id = pulsar_conn_id

    def connection(self) -> Any:
        return self.get_connection(self.pulsar_conn_id)

    def cluster(self) -> tuple[str, dict[str, Any]]:
        """`(cluster name, spec cluster entry)`; ValueError (one line) when the connection lacks a field."""
        return dag_support.cluster_from_connection(self.connection())

    def admin(self) -> PulsarAdmin:
        """An admin client with the connection's token (from the connection itself, in this process)."""
        conn = self.connection()
        name, entry = dag_support.cluster_from_connection(conn)
        tls = TlsSpec(**entry["tls"]) if entry["tls"] else None
        return PulsarAdmin(entry["admin_url"], token=conn.password or None, tls=tls.settings() if tls else None,
                           name=name, timeout_s=10)

    def test_connection(self) -> tuple[bool, str]:
        """The cluster answers its admin API and knows the connection's cluster name."""
        try:
            name, _ = self.cluster()
            admin = self.admin()
        except ValueError as exc:
            return False, str(exc)
        try:
            clusters = admin.get("/clusters")
        except (AdminError, OSError) as exc:
            return False, f"{self.pulsar_conn_id}: {exc}"
        finally:
            admin.close()
        if name not in clusters:
            return False, f"the cluster at {admin.admin_url} knows {', '.join(clusters)}, not {name}"
        return True, f"{name} answers; its clusters: {', '.join(clusters)}"
