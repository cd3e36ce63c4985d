"""spark_jobs/smoke_admin.py without Spark: clients come from the library, tokens stay out of task closures."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
from localdev.paths import PROJECT_ROOT
from pulsar_migration.spec import ClusterSpec, TlsSpec
from pyspark import cloudpickle

TOKEN = "smoke-unit-token-8c2d"
# Port 9 (discard) has no listener here: every call is refused at once.
CLUSTERS = {"a": {"admin_url": "http://127.0.0.1:9", "service_url": "pulsar://127.0.0.1:9",
                  "token_env": "PM_SMOKE_UNIT_TOKEN", "tls": None},
            "b": {"admin_url": "https://127.0.0.1:9", "token_env": None,
                  "tls": {"trust_certs_file": "/ca.pem", "allow_insecure": False, "cert_file": None,
                          "key_file": None}}}


@pytest.fixture(scope="module")
def smoke() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("smoke_admin_under_test", PROJECT_ROOT / "spark_jobs" /
                                                  "smoke_admin.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_work_items_are_cluster_specs_without_tokens(smoke: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PM_SMOKE_UNIT_TOKEN", TOKEN)
    items = smoke.cluster_specs(CLUSTERS)
    assert items == [
        ClusterSpec("a", "http://127.0.0.1:9", "pulsar://127.0.0.1:9", "PM_SMOKE_UNIT_TOKEN", None),
        ClusterSpec("b", "https://127.0.0.1:9", "", None, TlsSpec(trust_certs_file="/ca.pem")),
    ]
    # What Spark ships to the tasks: the items and the job's function, pickled by value as from __main__.
    cloudpickle.register_pickle_by_value(smoke)
    try:
        shipped = cloudpickle.dumps((items, lambda part: smoke.check_partition(part, 1.0)))
    finally:
        cloudpickle.unregister_pickle_by_value(smoke)
    assert TOKEN.encode() not in shipped and b"PM_SMOKE_UNIT_TOKEN" in shipped


def test_missing_token_variable_fails_on_the_driver(smoke: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PM_SMOKE_UNIT_TOKEN", raising=False)
    with pytest.raises(smoke.SmokeError, match=r"^spec: environment variable PM_SMOKE_UNIT_TOKEN \(token for a\) "
                                               r"is not set$"):
        smoke.cluster_specs(CLUSTERS)
    with pytest.raises(smoke.SmokeError, match=r"^--clusters: b: tls: "):
        smoke.cluster_specs({"b": {"admin_url": "http://127.0.0.1:9", "tls": {"verify": True}}})


def test_tasks_read_the_token_from_their_own_environment(smoke: ModuleType,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PM_SMOKE_UNIT_TOKEN", TOKEN)
    items = smoke.cluster_specs(CLUSTERS)
    [result] = smoke.check_partition(items[:1], 0.5)
    assert result["authenticated"] is True and "unreachable" in result["error"]
    monkeypatch.delenv("PM_SMOKE_UNIT_TOKEN")  # set where the driver ran, not where the task runs
    [result] = smoke.check_partition(items[:1], 0.5)
    assert result["authenticated"] is False and result["healthy"] is False
    assert result["error"].endswith("spec: environment variable PM_SMOKE_UNIT_TOKEN (token for a) is not set")
