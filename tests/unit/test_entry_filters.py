"""Which source topics pass through broker entry filters (replication.entry_filters), from a fake admin's answers;
real brokers with real filter plugins are in tests/integration/test_cluster_c.py."""

from __future__ import annotations

from typing import Any

import pytest
from pulsar_migration.admin import RUNTIME_CONFIGURATION as RUNTIME
from pulsar_migration.admin import AdminError
from pulsar_migration.replication.entry_filters import check, configured_names, filtered_topics
from pulsar_migration.spec import MigrationSpec
from pulsar_migration.stepjob import BadInput

from tests.unit.answering_admin import AnsweringAdmin


def config_admin(answers: dict[str, Any]) -> AnsweringAdmin:
    """Answers as the broker does; the runtime configuration is refused unless given (no superuser role)."""
    return AnsweringAdmin({RUNTIME: AdminError(f"HTTP 403 on GET {RUNTIME}: superuser required", 403, RUNTIME),
                           **answers})


def spec(**options: Any) -> MigrationSpec:
    cluster = {"admin_url": "http://127.0.0.1:1", "service_url": "pulsar://127.0.0.1:2", "token_env": None, "tls": None}
    return MigrationSpec.from_dict({"tenant": "t", "source": "a", "target": "b",
                                    "clusters": {"a": cluster, "b": cluster}, "options": options})


@pytest.mark.parametrize(("rendered", "names"), [
    ("[]", []), ("", []), (None, []), ("[f1]", ["f1"]), ("[f1, f2]", ["f1", "f2"]), ("f1,f2", ["f1", "f2"]),
])
def test_the_brokers_filter_names_are_read_as_it_renders_them(rendered: Any, names: list[str]) -> None:
    assert configured_names(rendered) == names


def test_no_filters_and_no_overriding_cost_one_call_for_the_whole_run() -> None:
    admin = config_admin({RUNTIME: {"entryFilterNames": "[]", "allowOverrideEntryFilters": "false"}})
    assert filtered_topics(admin, ["persistent://t/ns/a", "persistent://t/ns/b"], 4) == {}  # type: ignore[arg-type]
    assert admin.calls == [RUNTIME]


def test_broker_filters_without_overriding_apply_to_every_topic() -> None:
    admin = config_admin({RUNTIME: {"entryFilterNames": "[f1, f2]", "allowOverrideEntryFilters": "false"}})
    assert filtered_topics(admin, ["persistent://t/ns/a"], 4) == {"persistent://t/ns/a": "f1,f2"}  # type: ignore[arg-type]


def test_with_overriding_each_topics_applied_filters_decide() -> None:
    admin = config_admin({
        RUNTIME: {"entryFilterNames": "[]", "allowOverrideEntryFilters": "true"},
        "/persistent/t/ns/plain/entryFilters": {"entryFilterNames": ""},
        "/persistent/t/ns/routed/entryFilters": {"entryFilterNames": "route"},
        "/persistent/t/ns/unset/entryFilters": None,
    })
    topics = ["persistent://t/ns/plain", "persistent://t/ns/routed", "persistent://t/ns/unset"]
    assert filtered_topics(admin, topics, 2) == {"persistent://t/ns/routed": "route"}  # type: ignore[arg-type]
    assert all(admin.params[f"/persistent/{t.split('://')[1]}/entryFilters"] == {"applied": "true"} for t in topics)


FILTERED = {RUNTIME: {"entryFilterNames": "[route]", "allowOverrideEntryFilters": "false"}}


def test_filtered_topics_stop_the_run_in_one_line_unless_trusted_or_dry() -> None:
    details: dict[str, Any] = {}
    with pytest.raises(BadInput) as failure:
        check(spec(), config_admin(FILTERED), ["persistent://t/ns/a"], details)  # type: ignore[arg-type]
    line = str(failure.value)
    assert "\n" not in line and "t/ns/a (route)" in line and "pm-copy-reader-*" in line
    assert "trust_source_entry_filters" in line
    for options, dry in (({"trust_source_entry_filters": True}, False), ({}, True)):
        details = {}
        check(spec(**options), config_admin(FILTERED), ["persistent://t/ns/a"], details,  # type: ignore[arg-type]
              dry_run=dry)
        assert details["entry_filters"]["topics"] == 1 and details["entry_filters"]["warning"] == line


def test_an_unreadable_configuration_leaves_the_check_out_with_a_warning() -> None:
    details: dict[str, Any] = {}
    check(spec(), config_admin({}), ["persistent://t/ns/a"], details)  # type: ignore[arg-type]
    assert details["entry_filters"]["checked"] is False and "HTTP 403" in details["entry_filters"]["warning"]
