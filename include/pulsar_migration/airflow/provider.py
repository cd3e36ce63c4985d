"""The `apache_airflow_provider` entry point of this distribution (pyproject.toml): it makes the **Pulsar**
connection type appear in Airflow's connection form, with its own fields, and names its hook.

Airflow 3.3 builds the form from this metadata only: `ui-field-behaviour` hides and relabels the standard
fields, `conn-fields` adds fields stored in the connection's extra.
"""

from __future__ import annotations

from typing import Any

# Airflow refuses a provider whose package-name is not its distribution's canonical name (pyproject.toml).
DISTRIBUTION = "pulsar-migration"
CONNECTION_TYPE = "pulsar"


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": DISTRIBUTION,
        "name": "Pulsar migration",
        "description": "Apache Pulsar clusters as Airflow connections, for moving tenants between them.",
        "connection-types": [{
            "connection-type": CONNECTION_TYPE,
            "hook-class-name": "pulsar_migration.airflow.hook.PulsarHook",
            "hook-name": "Pulsar",
            "ui-field-behaviour": {
                "hidden-fields": ["login"],
                "relabeling": {"host": "Admin host", "port": "Admin port", "schema": "Admin scheme (http/https)",
                               "password": "Token"},
                "placeholders": {"host": "broker.example.com", "port": "8080", "schema": "https",
                                 "password": "a JWT for the cluster's superuser role (empty: no auth)"},
            },
            "conn-fields": {
                "cluster_name": {"label": "Cluster name",
                                 "description": "The cluster's name in Pulsar (clusterName of broker.conf).",
                                 "schema": {"type": ["string", "null"]}},
                "service_url": {"label": "Service URL",
                                "description": "Binary protocol URL clients use, pulsar://host:6650 or "
                                               "pulsar+ssl://host:6651.",
                                "schema": {"type": ["string", "null"]}},
                "listener_name": {"label": "Listener name",
                                  "description": "The broker advertisedListeners entry to connect through (a "
                                                 "cluster behind NAT or a load balancer). Empty: the internal one.",
                                  "schema": {"type": ["string", "null"]}},
                "token_file": {"label": "Token file",
                               "description": "Instead of the token above: a file holding it, read again when a "
                                              "cluster refuses the one in use (a token a secrets agent renews). "
                                              "It must exist where the Spark jobs run.",
                               "schema": {"type": ["string", "null"]}},
                "oauth2": {"label": "OAuth2",
                           "description": 'Instead of a token: {"issuer_url": "https://auth.example.com/", '
                                          '"credentials_file": "/etc/pulsar/client.json", "audience": "...", '
                                          '"scope": "..."} (the file holds client_id and client_secret).',
                           "schema": {"type": ["object", "null"]}},
                "tls": {"label": "TLS",
                        "description": 'For https/pulsar+ssl, e.g. {"trust_certs_file": "/etc/pulsar/ca.pem"}; keys: '
                                       "trust_certs_file, allow_insecure, cert_file, key_file. Empty: no TLS "
                                       "settings.",
                        "schema": {"type": ["object", "null"]}},
            },
        }],
    }
