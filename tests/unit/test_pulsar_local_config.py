"""Pure logic of the local cluster tooling: ports, names, config rendering."""

from __future__ import annotations

import pytest
from localdev.pulsar_local import LocalClusterError, extra_overrides, local_clusters, render_config


def test_clusters_get_distinct_names_and_ports_never_8080() -> None:
    clusters = local_clusters(3)
    assert [c.name for c in clusters] == ["cluster-a", "cluster-b", "cluster-c"]
    ports = [p for c in clusters for p in (c.web_port, c.broker_port)]
    assert len(set(ports)) == len(ports)
    assert 8080 not in ports
    assert len({c.root for c in clusters}) == 3


def test_render_config_replaces_existing_keys_and_appends_missing_ones() -> None:
    template = "clusterName=standalone\nwebServicePort=8080\n#brokerServicePort=1\nbrokerServicePort=6650\n"
    text = render_config(template, local_clusters(2)[1])
    assert "clusterName=cluster-b" in text
    assert "webServicePort=8082" in text and "webServicePort=8080" not in text
    assert "brokerServicePort=6652" in text and "#brokerServicePort=1" in text
    assert "forceDeleteTenantAllowed=true" in text  # appended: absent from the template
    # The default pair serves TLS beside its plain ports (clients switching over TLS); other clusters do not.
    assert "brokerServicePortTls=6752" in text and "webServicePortTls=8444" in text
    assert "tlsRequireTrustedClientCertOnConnect=true" in text
    assert "PortTls" not in render_config(template, local_clusters(3)[2])


def test_cluster_count_is_bounded() -> None:
    with pytest.raises(LocalClusterError):
        local_clusters(0)


def test_per_instance_settings_may_hold_commas(monkeypatch: pytest.MonkeyPatch) -> None:
    listeners = "internal:pulsar://127.0.0.1:6653,proxied:pulsar://127.0.0.1:16653"
    monkeypatch.setenv("PM_PULSAR_CONF_CLUSTER_C",
                       f"a.b=1, advertisedListeners={listeners},advertisedAddress=")
    assert extra_overrides(local_clusters(3)[2]) == {"a.b": "1", "advertisedListeners": listeners,
                                                     "advertisedAddress": ""}
