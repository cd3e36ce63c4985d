"""MigrationSpec: the DESIGN.md example, one-line errors for each class of bad input, filters, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pulsar_migration.spec import SPEC_JSON_SCHEMA, MigrationSpec, SpecError, TopicFilter, main

# -- valid specs ------------------------------------------------------------------------------------


def test_design_example_loads_and_round_trips(spec_dict: dict[str, Any]) -> None:
    spec = MigrationSpec.from_dict(spec_dict)
    assert (spec.tenant, spec.source, spec.target) == ("acme", "cluster-a", "cluster-b")
    assert spec.source_cluster.admin_url == "http://127.0.0.1:8081"
    assert spec.target_cluster.token_env == "CLUSTER_B_TOKEN"
    assert spec.replication_mode == "copy" and spec.proceed_on_conflict is False
    assert spec.to_dict() == spec_dict
    assert MigrationSpec.from_dict(spec.to_dict()) == spec
    assert MigrationSpec.from_json(spec.to_json()) == spec


def test_optional_keys_get_documented_defaults(spec_dict: dict[str, Any]) -> None:
    minimal = {k: spec_dict[k] for k in ("tenant", "source", "target")}
    minimal["clusters"] = {name: {"admin_url": c["admin_url"], "service_url": c["service_url"]}
                           for name, c in spec_dict["clusters"].items()}
    full = MigrationSpec.from_dict(minimal).to_dict()
    props = SPEC_JSON_SCHEMA["properties"]
    for key in ("namespaces", "topics", "replication", "lookup", "options"):
        assert full[key] == props[key]["default"], key
    assert full["clusters"]["cluster-b"] == {"admin_url": "http://127.0.0.1:8082",
                                             "service_url": "pulsar://127.0.0.1:6652", "token_env": None, "tls": None}


def test_spec_hash_is_short_stable_and_content_sensitive(spec_dict: dict[str, Any]) -> None:
    first = MigrationSpec.from_dict(spec_dict).spec_hash()
    assert len(first) == 16 and int(first, 16) >= 0
    reordered = dict(reversed(list(spec_dict.items())))
    assert MigrationSpec.from_dict(reordered).spec_hash() == first
    spec_dict["tenant"] = "other"
    assert MigrationSpec.from_dict(spec_dict).spec_hash() != first


def test_tls_maps_to_admin_settings(spec_dict: dict[str, Any]) -> None:
    spec_dict["clusters"]["cluster-a"]["tls"] = {"trust_certs_file": "/ca.pem", "cert_file": "/c.pem",
                                                 "key_file": "/k.pem"}
    spec = MigrationSpec.from_dict(spec_dict)
    tls = spec.source_cluster.tls
    assert tls is not None and tls.allow_insecure is False
    settings = tls.settings()
    assert (settings.verify, settings.cert_file, settings.key_file) == ("/ca.pem", "/c.pem", "/k.pem")
    assert MigrationSpec.from_dict(spec.to_dict()) == spec
    spec_dict["clusters"]["cluster-a"]["tls"] = {"allow_insecure": True}
    assert MigrationSpec.from_dict(spec_dict).source_cluster.tls.settings().verify is False  # type: ignore[union-attr]


# -- one-line errors --------------------------------------------------------------------------------

Mutation = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Mutation:
    def mutate(d: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        for key in parents:
            d = d[key]
        d[last] = value

    return mutate


def _drop(path: str) -> Mutation:
    def mutate(d: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        for key in parents:
            d = d[key]
        del d[last]

    return mutate


def _rename_tenant(d: dict[str, Any]) -> None:
    d["tenantt"] = d.pop("tenant")


BAD_INPUTS: list[tuple[str, Mutation, str]] = [
    ("missing field", _drop("tenant"), "spec: missing field 'tenant'"),
    ("missing nested field", _drop("clusters/cluster-a/admin_url"),
     "spec: missing field 'admin_url' in clusters.cluster-a"),
    ("unknown field, top level (typo)", _rename_tenant, "spec: unknown field 'tenantt' at top level"),
    ("unknown field, nested", _set("clusters/cluster-a/adminurl", "x"),
     "spec: unknown field 'adminurl' in clusters.cluster-a"),
    ("unknown field, deeper", _set("clusters/cluster-b/tls", {"verify": True}),
     "spec: unknown field 'verify' in clusters.cluster-b.tls"),
    ("wrong type", _set("clusters/cluster-a/admin_url", 8081),
     "spec: clusters.cluster-a.admin_url must be string, got integer"),
    ("wrong nullable type", _set("lookup/url", ["x"]), "spec: lookup.url must be string or null, got array"),
    ("bad regex", _set("topics/include", [".*", "[a-"]),
     "spec: topics.include[1] is not a valid regex: unterminated character set at position 0"),
    ("source not in clusters", _set("source", "cluster-x"),
     "spec: source 'cluster-x' is not one of clusters (cluster-a, cluster-b)"),
    ("target not in clusters", _set("target", "cluster-c"),
     "spec: target 'cluster-c' is not one of clusters (cluster-a, cluster-b)"),
    ("source == target", _set("target", "cluster-a"), "spec: source and target are both 'cluster-a'; they must differ"),
    ("namespace with '/'", _set("namespaces", ["ns1", "acme/ns2"]),
     "spec: namespaces[1] 'acme/ns2' must be a short name without '/' (e.g. 'ns2')"),
    ("empty namespace list", _set("namespaces", []),
     "spec: namespaces must list at least one namespace, or be null for all"),
    ("invalid tenant name", _set("tenant", "ac me"),
     "spec: tenant 'ac me' is not a valid Pulsar name (letters, digits and - = : . _ only)"),
    ("unknown replication mode", _set("replication/mode", "mirror"),
     "spec: replication.mode must be one of 'copy', 'geo', got 'mirror'"),
    ("admin url scheme", _set("clusters/cluster-a/admin_url", "127.0.0.1:8081"),
     "spec: clusters.cluster-a.admin_url '127.0.0.1:8081' must look like http://host:port or https://host:port"),
    ("service url scheme", _set("clusters/cluster-b/service_url", "http://127.0.0.1:6652"),
     "spec: clusters.cluster-b.service_url 'http://127.0.0.1:6652' must look like pulsar://host:port or "
     "pulsar+ssl://host:port"),
    ("known option of wrong type", _set("options/proceed_on_conflict", "yes"),
     "spec: options.proceed_on_conflict must be boolean, got string"),
    ("unknown option (typo)", _set("options/proceed_on_conflicts", True),
     "spec: unknown field 'proceed_on_conflicts' in options"),
    ("admin_concurrency not a number", _set("options/admin_concurrency", "eight"),
     "spec: options.admin_concurrency must be integer, got string"),
    ("admin_concurrency a boolean", _set("options/admin_concurrency", True),
     "spec: options.admin_concurrency must be integer, got boolean"),
    ("admin_concurrency fractional", _set("options/admin_concurrency", 2.5),
     "spec: options.admin_concurrency must be integer, got number"),
    ("admin_concurrency too low", _set("options/admin_concurrency", 0),
     "spec: options.admin_concurrency must be between 1 and 64, got 0"),
    ("admin_concurrency too high", _set("options/admin_concurrency", 65),
     "spec: options.admin_concurrency must be between 1 and 64, got 65"),
    ("rate cap of 0", _set("options/copy_max_mb_per_s", 0), "spec: options.copy_max_mb_per_s must be above 0, got 0"),
    ("message cap of 0", _set("options/copy_max_msgs_per_s", 0),
     "spec: options.copy_max_msgs_per_s must be above 0, got 0"),
    ("rate cap as text", _set("options/copy_max_mb_per_s", "50"),
     "spec: options.copy_max_mb_per_s must be number or null, got string"),
    ("rate cap in geo mode", lambda d: (_set("options/copy_max_mb_per_s", 50)(d), _set("replication/mode", "geo")(d)),
     "spec: options.copy_max_mb_per_s caps copy mode only; cap geo-replication with the source namespaces' "
     "replicator dispatch rate (pulsar-admin namespaces set-replicator-dispatch-rate)"),
]


@pytest.mark.parametrize(("mutate", "message"), [case[1:] for case in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_gives_one_exact_line(spec_dict: dict[str, Any], mutate: Mutation, message: str) -> None:
    mutate(spec_dict)
    with pytest.raises(SpecError) as caught:
        MigrationSpec.from_dict(spec_dict)
    assert str(caught.value) == message


def test_token_pasted_into_token_env_is_rejected_without_echoing_it(spec_dict: dict[str, Any]) -> None:
    spec_dict["clusters"]["cluster-b"]["token_env"] = "eyJhbGciOiJIUzI1NiJ9.secret"
    with pytest.raises(SpecError) as caught:
        MigrationSpec.from_dict(spec_dict)
    assert "secret" not in str(caught.value)
    assert str(caught.value).startswith("spec: clusters.cluster-b.token_env must be the name of an environment")


def test_known_options_and_their_defaults(spec_dict: dict[str, Any]) -> None:
    declared = SPEC_JSON_SCHEMA["properties"]["options"]["properties"]
    assert set(declared) == {"proceed_on_conflict", "admin_concurrency", "copy_max_in_flight",
                             "delayed_delivery_horizon_s", "copy_engine", "geo_timeout_s", "backfill_sink",
                             "archive_path", "backfill_state_dir", "copy_max_mb_per_s", "copy_max_msgs_per_s",
                             "progress_interval_s", "trust_source_entry_filters", "follows_run_dir"}
    for name, option in declared.items():
        assert option["type"] and option["title"] and option["description"] and "default" in option, name
    spec_dict["options"] = {}
    spec = MigrationSpec.from_dict(spec_dict)
    assert (spec.proceed_on_conflict, spec.admin_concurrency) == (declared["proceed_on_conflict"]["default"],
                                                                 declared["admin_concurrency"]["default"])
    assert spec.admin_concurrency == 8
    assert (spec.backfill_sink, spec.archive_path, spec.copy_max_bytes_per_s) == ("pulsar", None, None)
    assert spec.trust_source_entry_filters is False and spec.follows_run_dir is None
    for value in (1, 16, 64):
        spec_dict["options"] = {"proceed_on_conflict": True, "admin_concurrency": value}
        spec = MigrationSpec.from_dict(spec_dict)
        assert spec.proceed_on_conflict is True and spec.admin_concurrency == value
        assert isinstance(spec.admin_concurrency, int)


def test_missing_token_variable(spec_dict: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLUSTER_B_TOKEN", raising=False)
    spec = MigrationSpec.from_dict(spec_dict)
    expected = "spec: environment variable CLUSTER_B_TOKEN (token for cluster-b) is not set"
    for call in (spec.check_environment, spec.target_cluster.admin, spec.target_cluster.token):
        with pytest.raises(SpecError) as caught:
            call()
        assert str(caught.value) == expected
    assert spec.source_cluster.token() is None  # no token_env: no auth


def test_token_comes_from_the_environment(spec_dict: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTER_B_TOKEN", "t0k3n")
    spec_dict["lookup"]["token_env"] = "LOOKUP_TOKEN"
    spec = MigrationSpec.from_dict(spec_dict)
    with pytest.raises(SpecError, match=r"LOOKUP_TOKEN \(token for the lookup service\) is not set"):
        spec.check_environment()
    monkeypatch.setenv("LOOKUP_TOKEN", "l")
    spec.check_environment()
    admin = spec.target_cluster.admin(retries=0)
    try:
        assert admin.name == "cluster-b" and admin.retries == 0
        assert admin._session.headers["Authorization"] == "Bearer t0k3n"
    finally:
        admin.close()
    assert "t0k3n" not in spec.to_json()


def test_check_environment_requires_readable_tls_files(spec_dict: dict[str, Any], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTER_B_TOKEN", "t")
    ca, cert, key = (tmp_path / n for n in ("ca.pem", "cert.pem", "key.pem"))
    for f in (ca, cert, key):
        f.write_text("PEM\n", encoding="utf-8")
    spec_dict["clusters"]["cluster-b"]["tls"] = {"trust_certs_file": str(ca), "cert_file": str(cert),
                                                 "key_file": str(key)}
    MigrationSpec.from_dict(spec_dict).check_environment()  # all present

    for field_name, path in (("trust_certs_file", ca), ("cert_file", cert), ("key_file", key)):
        path.unlink()
        with pytest.raises(SpecError) as caught:
            MigrationSpec.from_dict(spec_dict).check_environment()
        assert str(caught.value) == f"spec: clusters.cluster-b.tls.{field_name} file {path} does not exist"
        path.write_text("PEM\n", encoding="utf-8")

    spec_dict["clusters"]["cluster-a"]["tls"] = {"trust_certs_file": str(tmp_path)}  # a directory is no file
    with pytest.raises(SpecError, match=r"^spec: clusters\.cluster-a\.tls\.trust_certs_file file .* does not exist$"):
        MigrationSpec.from_dict(spec_dict).check_environment()
    spec_dict["clusters"]["cluster-a"]["tls"] = {"allow_insecure": True}  # names no file: nothing to check
    spec = MigrationSpec.from_dict(spec_dict)
    spec.check_environment()

    # Unreadable (as root every file is readable, so the permission answer is simulated).
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(key) else real_access(p, mode))
    with pytest.raises(SpecError) as caught:
        spec.check_environment()
    assert str(caught.value) == f"spec: clusters.cluster-b.tls.key_file file {key} is not readable"


def test_cli_check_env_reports_a_missing_tls_file(spec_dict: dict[str, Any], write_spec: Callable[..., str],
                                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CLUSTER_B_TOKEN", "t")
    missing = tmp_path / "nope-ca.pem"
    spec_dict["clusters"]["cluster-a"]["tls"] = {"trust_certs_file": str(missing)}
    path = write_spec(spec_dict)
    assert main(["validate", path]) == 0  # the schema alone does not look at files
    capsys.readouterr()
    assert main(["validate", "--check-env", path]) == 2
    expected = f"error: spec: clusters.cluster-a.tls.trust_certs_file file {missing} does not exist\n"
    assert capsys.readouterr().err == expected


# -- loading ----------------------------------------------------------------------------------------


def test_load_from_path_and_file_uri(spec_dict: dict[str, Any], write_spec: Callable[..., str]) -> None:
    path = write_spec(spec_dict)
    assert MigrationSpec.load(path) == MigrationSpec.load(Path(path).as_uri()) == MigrationSpec.from_dict(spec_dict)


def test_load_errors_are_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(SpecError, match=r"^spec: cannot read .*nope\.json: No such file or directory$"):
        MigrationSpec.load(str(missing))
    broken = tmp_path / "broken.json"
    broken.write_text('{"tenant": "acme",', encoding="utf-8")
    with pytest.raises(SpecError, match=r"^spec: .*broken\.json is not valid JSON: "):
        MigrationSpec.load(str(broken))
    duplicated = tmp_path / "dup.json"
    duplicated.write_text('{"tenant": "a", "tenant": "b"}', encoding="utf-8")
    with pytest.raises(SpecError, match=r"^spec: duplicate field 'tenant'$"):
        MigrationSpec.load(str(duplicated))
    with pytest.raises(SpecError, match=r"^spec: the document must be object, got array$"):
        MigrationSpec.from_json("[]")


# -- selection --------------------------------------------------------------------------------------


def test_topic_filter_searches_include_then_exclude() -> None:
    default = TopicFilter()
    assert default.selects("ns1/orders") and default.selects("ns2/x")
    f = TopicFilter.of(include=["^ns1/", "payments"], exclude=["-dlq$", "^ns1/tmp"])
    assert f.selects("ns1/orders")
    assert f.selects("ns2/payments-eu")  # re.search: anywhere in the name
    assert not f.selects("ns2/orders")  # no include matches
    assert not f.selects("ns1/orders-dlq")  # an exclude wins
    assert not f.selects("ns1/tmp-1")
    assert not TopicFilter.of(include=[]).selects("ns1/orders")


def test_spec_topic_filter_and_namespace_selection(spec_dict: dict[str, Any]) -> None:
    spec_dict["topics"] = {"include": ["^ns1/"], "exclude": []}
    spec = MigrationSpec.from_dict(spec_dict)
    assert spec.topics.selects("ns1/orders") and not spec.topics.selects("ns2/orders")
    assert spec.namespace_selected("anything") and spec.namespace_selected("acme/anything")
    assert not spec.namespace_selected("other/ns1")
    spec_dict["namespaces"] = ["ns1", "ns2"]
    spec = MigrationSpec.from_dict(spec_dict)
    assert spec.namespaces == ("ns1", "ns2")
    assert spec.namespace_selected("ns1") and spec.namespace_selected("acme/ns2")
    assert not spec.namespace_selected("ns3")


# -- schema and CLI ---------------------------------------------------------------------------------


def _objects(schema: Any, where: str = "") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(schema, dict):
        if "object" in (schema.get("type") or []) or schema.get("type") == "object":
            found.append((where, schema))
        for key, value in schema.items():
            found += _objects(value, f"{where}/{key}")
    return found


def test_schema_is_valid_and_closed() -> None:
    jsonschema.Draft202012Validator.check_schema(SPEC_JSON_SCHEMA)
    objects = _objects(SPEC_JSON_SCHEMA)
    assert len(objects) >= 7
    for where, schema in objects:
        if where == "/properties/clusters":  # cluster names are the keys; each value is a closed object
            assert schema["additionalProperties"]["additionalProperties"] is False
        else:
            assert schema["additionalProperties"] is False, where
    for name, prop in SPEC_JSON_SCHEMA["properties"].items():
        assert prop.get("title") or prop.get("description"), name


def test_cli_schema_and_validate(spec_dict: dict[str, Any], write_spec: Callable[..., str],
                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == SPEC_JSON_SCHEMA

    good = write_spec(spec_dict, "good.json")
    assert main(["validate", good]) == 0
    out = capsys.readouterr()
    assert out.out.startswith(f"ok: {good}: tenant acme, cluster-a -> cluster-b, spec ") and out.err == ""

    del spec_dict["target"]
    bad = write_spec(spec_dict, "bad.json")
    assert main(["validate", bad]) == 2
    out = capsys.readouterr()
    assert out.err == "error: spec: missing field 'target'\n" and out.out == ""


def test_cli_runs_as_a_module(spec_dict: dict[str, Any], write_spec: Callable[..., str]) -> None:
    spec_dict["source"] = "cluster-x"
    done = subprocess.run([sys.executable, "-m", "pulsar_migration.spec", "validate", write_spec(spec_dict)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == "error: spec: source 'cluster-x' is not one of clusters (cluster-a, cluster-b)\n"


def test_listener_name_round_trips_and_only_appears_when_set(spec_dict: dict[str, Any]) -> None:
    plain = MigrationSpec.from_dict(spec_dict)
    assert "listener_name" not in plain.to_dict()["clusters"]["cluster-b"]  # hashes of older runs stay valid
    spec_dict["clusters"]["cluster-b"]["listener_name"] = "external"
    spec = MigrationSpec.from_dict(spec_dict)
    assert spec.target_cluster.listener_name == "external"
    assert MigrationSpec.from_dict(spec.to_dict()) == spec and spec.spec_hash() != plain.spec_hash()
    spec_dict["clusters"]["cluster-b"]["listener_name"] = "no spaces"
    with pytest.raises(SpecError, match="listener_name"):
        MigrationSpec.from_dict(spec_dict)


def test_a_token_file_is_read_at_each_use_and_checked_in_one_line(spec_dict: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "b.token"
    path.write_text("t0k3n\n")
    spec_dict["clusters"]["cluster-b"].update({"token_env": None, "token_file": str(path)})
    spec = MigrationSpec.from_dict(spec_dict)
    spec.check_environment()
    assert spec.target_cluster.token() == "t0k3n"
    assert spec.target_cluster.credential == f"the token in file {path}"
    path.write_text("renewed")
    assert spec.target_cluster.token() == "renewed"
    assert MigrationSpec.from_json(spec.to_json()).target_cluster.token_file == str(path)
    assert "renewed" not in spec.to_json()
    path.unlink()
    with pytest.raises(SpecError) as caught:
        spec.check_environment()
    assert str(caught.value) == f"spec: clusters.cluster-b.token_file file {path} does not exist"


def test_a_spec_without_token_files_keeps_its_hash(spec_dict: dict[str, Any]) -> None:
    """token_file is written only when set: run directories made before it keep matching their spec."""
    spec = MigrationSpec.from_dict(spec_dict)
    assert "token_file" not in spec.to_json() and "oauth2" not in spec.to_json()
    assert spec.spec_hash() == "59fd380d4fbc99fe"  # as the library before token_file and oauth2 hashed it


def test_token_env_and_token_file_together_are_refused(spec_dict: dict[str, Any]) -> None:
    spec_dict["clusters"]["cluster-b"]["token_file"] = "/run/secrets/b.token"
    with pytest.raises(SpecError) as caught:
        MigrationSpec.from_dict(spec_dict)
    assert str(caught.value) == "spec: clusters.cluster-b sets token_env and token_file; give one"


def test_oauth2_settings_load_round_trip_and_exclude_the_other_credentials(spec_dict: dict[str, Any],
                                                                           tmp_path: Path) -> None:
    credentials = tmp_path / "b.json"
    credentials.write_text('{"client_id": "tools", "client_secret": "s"}')
    spec_dict["clusters"]["cluster-b"].update({"token_env": None, "oauth2": {
        "issuer_url": "https://auth.example.com/", "credentials_file": str(credentials), "audience": "urn:pulsar"}})
    spec = MigrationSpec.from_dict(spec_dict)
    assert spec.target_cluster.oauth2 is not None and spec.target_cluster.oauth2.scope is None
    assert spec.target_cluster.credential == "an OAuth2 token from https://auth.example.com/"
    assert MigrationSpec.from_json(spec.to_json()).target_cluster == spec.target_cluster
    assert "client_secret" not in spec.to_json()
    spec.check_environment()  # the credentials file is there; the issuer is asked at the first call
    credentials.unlink()
    with pytest.raises(SpecError) as caught:
        spec.check_environment()
    assert str(caught.value) == f"spec: clusters.cluster-b.oauth2.credentials_file file {credentials} does not exist"
    spec_dict["clusters"]["cluster-b"]["token_file"] = "/run/secrets/b.token"
    with pytest.raises(SpecError) as both:
        MigrationSpec.from_dict(spec_dict)
    assert str(both.value) == "spec: clusters.cluster-b sets token_file and oauth2; give one"
    spec_dict["clusters"]["cluster-b"].pop("token_file")
    spec_dict["clusters"]["cluster-b"]["oauth2"]["issuer_url"] = "auth.example.com"
    with pytest.raises(SpecError, match=r"^spec: clusters\.cluster-b\.oauth2\.issuer_url 'auth\.example\.com' must"):
        MigrationSpec.from_dict(spec_dict)
