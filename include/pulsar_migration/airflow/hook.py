"""PulsarHook: a Pulsar cluster from an Airflow connection of type `pulsar` (admin host/port/scheme, extra
`cluster_name`, `service_url`, `tls`, the token as password). The DAGs' render_spec reads its clusters through
it; the connection form's *Test* button calls `test_connection`."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from pulsar_migration import dag_support
from pulsar_migration.admin import AdminError, PulsarAdmin
from pulsar_migration.spec import ClusterSpec

# The form's Test button waits for the answer: fail fast instead of the steps' patient retries.
TEST_TIMEOUT_S = 20.0


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

    def admin(self, **kwargs: Any) -> PulsarAdmin:
        """An admin client with the connection's token (read from the connection in this process, never from
        the environment) or its token file; kwargs go to PulsarAdmin (timeout_s, retries)."""
        conn = self.connection()
        name, entry = dag_support.cluster_from_connection(conn)
        return ClusterSpec.from_entry(name, entry).admin(token=conn.password or None, **kwargs)

    def test_connection(self) -> tuple[bool, str]:
        """The admin API answers `GET /admin/v2/clusters` and knows the connection's cluster name."""
        try:
            admin = self.admin(timeout_s=TEST_TIMEOUT_S, retries=0)
        except ValueError as exc:  # names the connection and the missing field
            return False, str(exc)
        except TypeError as exc:  # a `tls` or `oauth2` object with unknown keys
            return False, f"connection {self.pulsar_conn_id}: extra.tls or extra.oauth2: {exc}"
        try:
            clusters = admin.get("/clusters")
        except AdminError as exc:
            return False, str(exc)
        finally:
            admin.close()
        if admin.name not in clusters:
            return False, f"the cluster at {admin.admin_url} knows {', '.join(clusters)}, not {admin.name}"
        return True, f"{admin.name} answers at {admin.admin_url}; its clusters: {', '.join(clusters)}"
