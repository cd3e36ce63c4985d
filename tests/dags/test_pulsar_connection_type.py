"""The Pulsar connection type as Airflow itself sees it (the installed provider entry point): the metadata the
connection form is built from, the form's *Test* button path (models.Connection.test_connection, as the API's
`POST /connections/test` runs it) against the real cluster-a, and PulsarHook giving the DAGs' cluster entries."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from localdev.pulsar_local import LocalCluster
from pulsar_migration import dag_support

CONN_ID = "pulsar_type_test"


def pulsar_conn(cluster: LocalCluster, **overrides: Any) -> Any:
    from airflow.models import Connection

    extra = {"cluster_name": cluster.name, "service_url": cluster.service_url, "tls": None}
    fields = {"conn_id": CONN_ID, "conn_type": "pulsar", "host": "127.0.0.1", "schema": "http",
              "port": cluster.web_port, "extra": extra} | overrides
    fields["extra"] = json.dumps(fields["extra"])
    return Connection(**fields)


def form_test(conn: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[bool, str]:
    """What the API's test endpoint does: the connection as an environment variable, then its test."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn.conn_id.upper()}", conn.get_uri())
    return conn.test_connection()


def test_the_connection_form_offers_pulsar_with_its_fields() -> None:
    from airflow.api_fastapi.core_api.services.ui.connections import HookMetaService
    from airflow.providers_manager import ProvidersManager

    assert "pulsar-migration" in ProvidersManager().providers
    (meta,) = [m for m in HookMetaService.hook_meta_data() if m.connection_type == "pulsar"]
    assert meta.hook_name == "Pulsar"
    assert meta.hook_class_name == "pulsar_migration.airflow.hook.PulsarHook"
    standard = meta.standard_fields
    assert standard.login.hidden and standard.host.title == "Admin host" and standard.password.title == "Token"
    assert {name: field["schema"]["title"] for name, field in meta.extra_fields.items()} == {
        "cluster_name": "Cluster name", "service_url": "Service URL", "listener_name": "Listener name",
        "token_file": "Token file", "oauth2": "OAuth2", "tls": "TLS"}
    assert meta.extra_fields["tls"]["schema"]["type"] == ["object", "null"]


def test_the_test_button_reaches_the_cluster_and_checks_its_name(cluster_a: LocalCluster,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    ok, message = form_test(pulsar_conn(cluster_a), monkeypatch)
    assert ok, message
    assert "cluster-a answers" in message

    wrong_name = pulsar_conn(cluster_a, extra={"cluster_name": "cluster-x", "service_url": cluster_a.service_url})
    ok, message = form_test(wrong_name, monkeypatch)
    assert not ok and message.startswith(f"the cluster at {cluster_a.admin_url} knows cluster-a"), message
    assert message.endswith("not cluster-x"), message

    ok, message = form_test(pulsar_conn(cluster_a, port=1), monkeypatch)
    assert not ok and "unreachable at http://127.0.0.1:1" in message, message

    ok, message = form_test(pulsar_conn(cluster_a, extra={"cluster_name": "cluster-a"}), monkeypatch)
    assert not ok and "extra.service_url (pulsar://host:port) is missing" in message, message

    bad_tls = {"cluster_name": "cluster-a", "service_url": cluster_a.service_url, "tls": {"ca": "/x.pem"}}
    ok, message = form_test(pulsar_conn(cluster_a, extra=bad_tls), monkeypatch)
    assert not ok and "extra.tls" in message and "'ca'" in message, message


def test_the_hook_gives_the_dags_cluster_entry_and_an_admin_client_with_the_token(
        cluster_a: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    from pulsar_migration.airflow.hook import PulsarHook

    conn = pulsar_conn(cluster_a, password="s3cret-token")
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", conn.get_uri())
    hook = PulsarHook(CONN_ID)
    name, entry = hook.cluster()
    assert (name, entry) == dag_support.cluster_from_connection(conn)
    assert entry == {"admin_url": cluster_a.admin_url, "service_url": cluster_a.service_url,
                     "token_env": dag_support.token_env_name(CONN_ID), "tls": None}
    admin = hook.admin()
    try:
        assert admin.name == "cluster-a"
        # The token comes from the connection itself, not from the variable the spec names.
        assert dag_support.token_env_name(CONN_ID) not in os.environ
        assert admin._session.headers["Authorization"] == "Bearer s3cret-token"
        assert "cluster-a" in admin.get("/clusters")
    finally:
        admin.close()
