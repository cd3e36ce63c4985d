"""The replication benchmark's --copy-option parsing (pure: no cluster)."""

from __future__ import annotations

import pytest

from benchmarks.replication_throughput import copy_option


def test_a_copy_option_value_is_read_as_json_or_kept_as_text() -> None:
    assert copy_option("copy_max_in_flight=20000") == ("copy_max_in_flight", 20000)
    assert copy_option("copy_engine=java") == ("copy_engine", "java")
    assert copy_option('include=["a.*"]') == ("include", ["a.*"])
    assert copy_option("note=a=b") == ("note", "a=b")


@pytest.mark.parametrize("text", ["copy_max_in_flight", "=5", ""])
def test_a_copy_option_without_key_and_value_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not KEY=VALUE"):
        copy_option(text)
