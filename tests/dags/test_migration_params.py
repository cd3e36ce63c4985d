"""The migration DAG's trigger form (Params) accepts good input and rejects bad input, checked by Airflow itself.

Two places validate a trigger's conf: the API/UI trigger (`create_dagrun` on the serialized DAG:
`params.deep_merge(conf).validate()`) and the task runner (`process_params`: the SDK ParamsDict
updated with the conf). Both are exercised as Airflow runs them; no DB or cluster is needed.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from airflow.dag_processing.dagbag import DagBag
from airflow.sdk import DAG
from airflow.sdk.exceptions import ParamValidationError
from airflow.serialization.serialized_objects import DagSerialization

from tests.dags.conftest import DAGS_DIR

DAG_ID = "pulsar_tenant_migration"
GOOD: dict[str, Any] = {
    "source_conn": "pulsar_cluster_a", "target_conn": "pulsar_cluster_b", "tenant": "acme",
    "namespaces": ["orders", "billing"], "topics_include": ["^orders/", "billing/.*"],
    "topics_exclude": ["-dlq$"], "dry_run": True, "proceed_on_conflict": False, "replication_mode": "geo",
    "lookup_conn": "lookup_eu", "confirm_cleanup": True, "delete_tenant": True,
    "follows_run_id": "manual__2026-11-23T08:00:00+00:00",
}
BAD: dict[str, tuple[dict[str, Any], str]] = {
    "missing tenant": ({k: v for k, v in GOOD.items() if k != "tenant"}, "tenant"),
    "tenant with /": ({**GOOD, "tenant": "acme/orders"}, "tenant"),
    "empty tenant": ({**GOOD, "tenant": ""}, "tenant"),
    "namespaces not a list": ({**GOOD, "namespaces": "orders"}, "namespaces"),
    "namespace with /": ({**GOOD, "namespaces": ["acme/orders"]}, "namespaces"),
    "dry_run not boolean": ({**GOOD, "dry_run": "yes"}, "dry_run"),
    "unknown replication mode": ({**GOOD, "replication_mode": "mirror"}, "replication_mode"),
    "topics_include not a list": ({**GOOD, "topics_include": ".*"}, "topics_include"),
    "topics_exclude not a list": ({**GOOD, "topics_exclude": "dlq$"}, "topics_exclude"),
    "connection id with quotes": ({**GOOD, "source_conn": "a' }}{{ x"}, "source_conn"),
    "lookup connection id with braces": ({**GOOD, "lookup_conn": "{{ x }}"}, "lookup_conn"),
    "confirm_cleanup not boolean": ({**GOOD, "confirm_cleanup": "yes"}, "confirm_cleanup"),
    "rate limit of 0": ({**GOOD, "copy_max_mb_per_s": 0}, "copy_max_mb_per_s"),
    "rate limit as text": ({**GOOD, "copy_max_mb_per_s": "50"}, "copy_max_mb_per_s"),
    "message rate limit below 0": ({**GOOD, "copy_max_msgs_per_s": -5}, "copy_max_msgs_per_s"),
    "empty run to continue": ({**GOOD, "follows_run_id": ""}, "follows_run_id"),
}


@pytest.fixture(scope="module")
def dag() -> DAG:
    # .dags, not .get_dag(): get_dag consults the metadata DB, which these checks do not need.
    return DagBag(dag_folder=str(DAGS_DIR / f"{DAG_ID}.py")).dags[DAG_ID]


def validate_like_trigger(dag: DAG, conf: dict[str, Any]) -> dict[str, Any]:
    """What the API/UI trigger runs (SerializedDAG.create_dagrun) before a run exists."""
    scheduler_dag = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    return scheduler_dag.params.deep_merge(conf).validate()


def validate_like_task_runner(dag: DAG, conf: dict[str, Any]) -> dict[str, Any]:
    """What the task runner runs (process_params) when a task starts."""
    params = copy.deepcopy(dag.params)
    params.update(conf)
    return params.validate()


VALIDATORS = [validate_like_trigger, validate_like_task_runner]


@pytest.mark.parametrize("validate", VALIDATORS)
def test_good_input_is_accepted_and_defaults_fill_the_rest(dag: DAG, validate: Any) -> None:
    assert validate(dag, GOOD) == {**GOOD, "copy_max_mb_per_s": None, "copy_max_msgs_per_s": None}
    assert validate(dag, {"tenant": "acme"}) == {
        "source_conn": "pulsar_cluster_a", "target_conn": "pulsar_cluster_b", "tenant": "acme", "namespaces": None,
        "topics_include": [".*"], "topics_exclude": [], "dry_run": False, "proceed_on_conflict": False,
        "replication_mode": "copy", "lookup_conn": "pulsar_lookup", "confirm_cleanup": False, "delete_tenant": False,
        "copy_max_mb_per_s": None, "copy_max_msgs_per_s": None, "follows_run_id": None,
    }
    capped = {**GOOD, "replication_mode": "copy", "copy_max_mb_per_s": 12.5, "copy_max_msgs_per_s": 5000}
    assert validate(dag, capped) == capped


@pytest.mark.parametrize("validate", VALIDATORS)
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_rejected_naming_the_param(dag: DAG, validate: Any, case: str) -> None:
    conf, param = BAD[case]
    with pytest.raises(ParamValidationError, match=f"Invalid input for param {param}:"):
        validate(dag, conf)
