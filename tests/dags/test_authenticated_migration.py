"""A whole migration between two clusters that require tokens (token authentication and authorization on,
keys and tokens made by the distribution's `bin/pulsar tokens`): the migration DAG with the tokens only in
Airflow connections (one as the password, one in a token file the connection names), clients of the tenant's
own role before and after, the lookup service in between, and the distribution's `bin/pulsar-admin` as an
outside judge. Then bad credentials, step by step, and tokens in files renewed while a run goes on.

The pair is cluster-d and cluster-e (ports 8084/8085, 6654/6655), started here with auth and stopped after,
so the open pair the other tests use is never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pulsar
import pytest
from localdev import pulsar_local
from localdev.demo_tenant import build_rich_tenant
from localdev.oauth2_issuer import LocalIssuer
from localdev.pulsar_auth import SUPERUSER_ROLE, TENANT_ADMIN_ROLE, LocalAuth
from localdev.pulsar_dist import ensure_distribution
from localdev.pulsar_local import LocalCluster
from pulsar_migration import faults
from pulsar_migration.admin import AuthRejected, PulsarAdmin
from pulsar_migration.dag_support import run_dir
from pulsar_migration.metadata.inventory import OAUTH2_AUTH_PLUGIN
from pulsar_migration.metadata.step import run as sync_metadata
from pulsar_migration.replication.step import STEP as REPLICATE
from pulsar_migration.replication.step import run as replicate
from pulsar_migration.spec import ClusterSpec
from pulsar_migration.stepjob import BAD_INPUT_EXIT, run_step
from pyspark.sql import SparkSession

from tests.conftest import unique
from tests.dags.conftest import AirflowTestDb
from tests.dags.dag_runs import failures, rendered_fields, run_dag, xcom
from tests.integration.lookup_helpers import TOKEN as LOOKUP_TOKEN
from tests.integration.lookup_helpers import LookupProcess, free_port, start_service
from tests.integration.tenant_builders import drop_tenant, snapshot, write_spec
from tests.integration.test_sync_progress import receive_expecting
from tests.integration.test_tls import LEAN_JVM, lean_jvm

DAG_ID = "pulsar_tenant_migration"
TOPIC, SUBSCRIPTION = "billing/invoices", "invoicer"  # 8 partitions, no schema (build_rich_tenant)
MESSAGES = 400
EXPIRED = "the token is missing, wrong or expired"
NO_RIGHT = "its role lacks the permission (the tools need a superuser role)"


@pytest.fixture(scope="module")
def auth() -> LocalAuth:
    return LocalAuth.default(ensure_distribution()).ensure()


@pytest.fixture(scope="module")
def auth_pair(auth: LocalAuth) -> Iterator[tuple[LocalCluster, LocalCluster]]:
    pair = [LocalCluster(3), LocalCluster(4)]
    pulsar_local.stop_clusters(pair)
    for cluster in pair:
        shutil.rmtree(cluster.root, ignore_errors=True)
    with lean_jvm():  # C1 and the serial collector: half the start's CPU, nothing here depends on them
        pulsar_local.start_clusters(pair, auth=True)
    yield pair[0], pair[1]
    pulsar_local.stop_clusters(pair)
    for cluster in pair:
        shutil.rmtree(cluster.root, ignore_errors=True)


def role_client(cluster: LocalCluster | str, token: str) -> pulsar.Client:
    url = cluster if isinstance(cluster, str) else cluster.service_url
    return pulsar.Client(url, authentication=pulsar.AuthenticationToken(token), operation_timeout_seconds=15,
                         logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))


def drain(where: LocalCluster | str, topic: str, token: str) -> Counter[bytes]:
    """What a fresh consumer of the subscription receives now, as the tenant's role (nothing acked)."""
    c = role_client(where, token)
    try:
        consumer = c.subscribe(topic, SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Shared)
        got = Counter(m.data() for m in receive_expecting(consumer, MESSAGES // 2))  # the unacked half
        consumer.close()
        return got
    finally:
        c.close()


class CmdlineWatch:
    """Reads every process's argument list (/proc/*/cmdline) while it runs, noting any that holds a secret."""

    def __init__(self, secrets: dict[str, str]) -> None:
        self.secrets = {name: value.encode() for name, value in secrets.items()}
        self.hits: list[str] = []
        self.scans = 0
        self.spark_seen = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CmdlineWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            for proc in Path("/proc").glob("[0-9]*"):
                try:
                    cmdline = (proc / "cmdline").read_bytes()
                except OSError:
                    continue
                if b"spark_jobs/" in cmdline:
                    self.spark_seen += 1
                for name, secret in self.secrets.items():
                    if secret in cmdline:
                        self.hits.append(f"{name} in the arguments of pid {proc.name}")
            self.scans += 1
            self._stop.wait(0.5)  # a spark-submit lives for seconds: 0.5 s sees every one


def test_migration_dag_moves_a_tenant_between_authenticated_clusters(
    airflow_db: AirflowTestDb, auth_pair: tuple[LocalCluster, LocalCluster], auth: LocalAuth,
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    source, target = auth_pair
    superuser, tenant_admin = auth.token(SUPERUSER_ROLE), auth.token(TENANT_ADMIN_ROLE)
    admin_d, admin_e = source.admin(timeout_s=30), target.admin(timeout_s=30)
    # Authentication is really on: no token, no answer.
    with pytest.raises(AuthRejected, match="cluster-d: HTTP 401 on GET /tenants with no token"):
        PulsarAdmin(source.admin_url, name=source.name).get("/tenants")

    tenant = unique("auth-mig")
    built = build_rich_tenant(admin_d, tenant, [source.name])
    topic = f"persistent://{tenant}/{TOPIC}"
    # The tenant's own role (an admin role of the tenant, not a superuser) produces and acks half.
    c = role_client(source, tenant_admin)
    try:
        # Unbatched: with batches, acking every other message acks no whole entry (the broker keeps no
        # batch-index acks by default) and both clusters would deliver everything again.
        producer = c.create_producer(topic, batching_enabled=False)
        for i in range(MESSAGES):
            producer.send_async(f"m-{i}".encode(), None, partition_key=f"k{i % 13}")
        producer.flush()
        consumer = c.subscribe(topic, SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Shared)
        acked = set()
        for m in receive_expecting(consumer, MESSAGES):
            if int(m.data().decode().split("-")[1]) % 2 == 0:
                consumer.acknowledge(m)
                acked.add(m.data())
        consumer.close()
    finally:
        c.close()
    expected = Counter(f"m-{i}".encode() for i in range(MESSAGES)) - Counter(acked)
    assert len(acked) == MESSAGES // 2
    assert drain(source, topic, tenant_admin) == expected  # what the source's subscription delivers (no acks)
    before = snapshot(admin_d, tenant)  # the source is deleted at the end (confirmed cleanup)
    # A fresh cluster's ledger ids start apart from its peers' (pulsar_local.seed_ledger_ids): the switch
    # refuses a topic with one ledger id on both sides.
    ledgers = admin_d.get(f"/persistent/{tenant}/billing/invoices-partition-0/internalStats")["ledgers"]
    assert ledgers[0]["ledgerId"] >= source.index * pulsar_local.LEDGER_ID_SPACING

    # The lookup service routes the tenant's clients and forwards their own token; it holds none for the clusters.
    lookup = start_service(tmp_path, [source, target], source)
    # The source's token is the connection's password; the target's sits in a file the connection names (a token
    # a secrets agent would renew), so every step runs with both kinds.
    target_token_file = tmp_path / "target.token"
    write_token(target_token_file, superuser)
    for conn_id, cluster, password, extra in (
            ("pm_auth_source", source, superuser, {}),
            ("pm_auth_target", target, None, {"token_file": str(target_token_file)})):
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({
            "conn_type": "pulsar", "host": "127.0.0.1", "port": cluster.web_port, "schema": "http",
            "password": password,
            "extra": {"cluster_name": cluster.name, "service_url": cluster.service_url, **extra}}))
    monkeypatch.setenv("AIRFLOW_CONN_PM_AUTH_LOOKUP", json.dumps({
        "conn_type": "http", "host": "127.0.0.1", "port": lookup.port, "schema": "http", "password": LOOKUP_TOKEN}))
    secrets = {"superuser token": superuser, "tenant-admin token": tenant_admin, "lookup token": LOOKUP_TOKEN}
    try:
        with CmdlineWatch(secrets) as watch:
            dag_run, states = run_dag(DAG_ID, run_conf={
                "tenant": tenant, "source_conn": "pm_auth_source", "target_conn": "pm_auth_target",
                "lookup_conn": "pm_auth_lookup", "confirm_cleanup": True, "delete_tenant": True})
        assert dag_run.state == "success", failures(dag_run, states)
        assert set(states.values()) == {"success"} and len(states) == 12, states
        assert watch.spark_seen > 0 and watch.scans > 50  # it watched while the Spark jobs ran
        assert watch.hits == []

        assert lookup.api("GET", f"/routes/{tenant}").json()["cluster"] == target.name
        assert tenant not in admin_d.get("/tenants")  # cleanup confirmed: the source's copy is gone
        assert admin_e.get(f"/tenants/{tenant}")["adminRoles"] == [TENANT_ADMIN_ROLE]
        # Every policy, topic, subscription, grant and schema as on the source; replicate_topics turns
        # deduplication on for the target's namespaces (exactly-once copies and client re-sends).
        after = snapshot(admin_e, tenant)
        for ns in after["namespaces"]:
            assert after["namespaces"][ns]["policies"].pop("deduplicationEnabled") is True
            before["namespaces"][ns]["policies"].pop("deduplicationEnabled")
        assert after == before and sorted(after["namespaces"]) == built["namespaces"]
        written = xcom(dag_run, "write_migration_report")
        assert written["verdict"] == "ok" and (written["lost"], written["duplicated"]) == (0, 0)
        progressed = xcom(dag_run, "publish_sync_progress_report")
        assert progressed["counts"]["lost"] == 0 == progressed["counts"]["duplicated"]

        # The tenant's role, on the target, through the lookup service: exactly the unacked half, once each.
        assert drain(f"http://127.0.0.1:{lookup.port}", topic, tenant_admin) == expected
        c = role_client(f"http://127.0.0.1:{lookup.port}", tenant_admin)
        try:
            c.create_producer(f"persistent://{tenant}/billing/ledger").send(b"after-the-move")
        finally:
            c.close()
        assert admin_e.get(f"/persistent/{tenant}/billing/ledger/stats")["msgInCounter"] >= 1

        # The distribution's own admin tool, its token read from a file named in PULSAR_CLIENT_CONF.
        listed = pulsar_admin(auth, target, SUPERUSER_ROLE, "topics", "list-partitioned-topics", f"{tenant}/billing")
        assert listed.returncode == 0 and f"persistent://{tenant}/billing/invoices" in listed.stdout

        # No token anywhere it could be read back: spec, reports, XComs, rendered fields, output, task logs.
        rdir = Path(run_dir(str(airflow_db.runs_dir), DAG_ID, dag_run.run_id))
        out, err = capfd.readouterr()
        places: dict[str, str] = {"output": out + err, "lookup service output": lookup.stop()}
        for path in [*rdir.rglob("*.json"), *rdir.rglob("*.md"), *rdir.rglob("*.html"),
                     *(airflow_db.home / "logs").rglob("*")]:
            if path.is_file():
                places[str(path)] = path.read_text(errors="replace")
        for task in ("render_spec", "sync_metadata", "replicate_topics", "sync_progress", "switch_lookup",
                     "cleanup_source", "write_migration_report"):
            places[f"xcom of {task}"] = json.dumps(xcom(dag_run, task), default=str)
            places[f"rendered fields of {task}"] = json.dumps(rendered_fields(dag_run, task), default=str)
        for admin, other in ((admin_d, target), (admin_e, source)):
            places[f"registration of {other.name}"] = json.dumps(admin.get(f"/clusters/{other.name}"))
        assert len(places) > 20
        for where, text in places.items():
            for name, secret in secrets.items():
                assert secret not in text, f"{name} leaked into {where}"
    finally:
        if lookup.proc is not None and lookup.proc.poll() is None:
            lookup.stop()
        drop_tenant(tenant, admin_d, admin_e)


def pulsar_admin(auth: LocalAuth, cluster: LocalCluster, role: str | None, *args: str
                 ) -> subprocess.CompletedProcess[str]:
    conf = auth.client_conf(role, cluster.admin_url, cluster.service_url) if role else None
    env = {**os.environ, "PULSAR_MEM": "-Xms64m -Xmx256m", **LEAN_JVM}
    if conf:
        env["PULSAR_CLIENT_CONF"] = str(conf)
    cmd = [str(auth.pulsar_home / "bin" / "pulsar-admin"), "--admin-url", cluster.admin_url, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=False)


@pytest.fixture
def bad_token_spec(auth_pair: tuple[LocalCluster, LocalCluster], tmp_path: Path,
                   monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    source, target = auth_pair
    tenant = unique("auth-bad")
    admin_d = source.admin(timeout_s=30)
    admin_d.put(f"/tenants/{tenant}", {"adminRoles": [TENANT_ADMIN_ROLE], "allowedClusters": [source.name]})
    admin_d.put(f"/namespaces/{tenant}/ns")
    admin_d.put(f"/persistent/{tenant}/ns/t/partitions", 2)
    spec = write_spec(tmp_path / "spec.json", tenant, source, target)
    document = json.loads(spec.read_text())
    document["clusters"][source.name]["token_env"] = "PM_T_SOURCE"
    document["clusters"][target.name]["token_env"] = "PM_T_TARGET"
    spec.write_text(json.dumps(document))
    try:
        yield tenant, spec
    finally:
        drop_tenant(tenant, admin_d)


@pytest.mark.parametrize("case", ["expired target token", "garbage source token", "tenant role as target"])
def test_a_refused_token_is_one_line_naming_the_cluster_and_nothing_is_written(
    case: str, bad_token_spec: tuple[str, Path], auth_pair: tuple[LocalCluster, LocalCluster], auth: LocalAuth,
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    tenant, spec = bad_token_spec
    source, target = auth_pair
    good = auth.token(SUPERUSER_ROLE)
    if case == "expired target token":
        bad = auth.create_token(SUPERUSER_ROLE, expiry="1s")
        time.sleep(2.5)
        tokens, cluster, variable, why = ({"PM_T_SOURCE": good, "PM_T_TARGET": bad}, target, "PM_T_TARGET",
                                          "the token expired at 20")  # its `exp`, read from the token
    elif case == "garbage source token":
        bad = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJub2JvZHkifQ.c2lnbmF0dXJl"
        tokens, cluster, variable, why = {"PM_T_SOURCE": bad, "PM_T_TARGET": good}, source, "PM_T_SOURCE", EXPIRED
    else:
        bad = auth.token(TENANT_ADMIN_ROLE)
        tokens, cluster, variable, why = {"PM_T_SOURCE": good, "PM_T_TARGET": bad}, target, "PM_T_TARGET", NO_RIGHT
    for name, value in tokens.items():
        monkeypatch.setenv(name, value)
    capfd.readouterr()

    code = run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(tmp_path / "run")])

    out, err = capfd.readouterr()
    assert code == BAD_INPUT_EXIT
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert errors[0].startswith(f"error: sync_metadata: cluster {cluster.name}: HTTP 401 on GET /tenants with the "
                                f"token in {variable}: {why}"), errors[0]
    assert bad not in out + err and good not in out + err
    assert not (tmp_path / "run").exists()  # refused before the run dir, let alone a cluster, was touched
    assert tenant not in target.admin(timeout_s=30).get("/tenants")


def test_a_token_ending_within_the_hour_is_named_at_the_start_and_the_step_runs(
    bad_token_spec: tuple[str, Path], auth: LocalAuth, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str], tmp_path: Path, spark: SparkSession,
) -> None:
    """A run that may outlive its token is told so before it starts (the expiry read from the token's claims);
    the token still works, so the step runs."""
    _, spec = bad_token_spec
    short = auth.create_token(SUPERUSER_ROLE, expiry="30m")
    # The driver reads the tokens from its environment, the session's Python workers (started earlier) from this.
    for name, value in (("PM_T_SOURCE", auth.token(SUPERUSER_ROLE)), ("PM_T_TARGET", short)):
        monkeypatch.setenv(name, value)
        monkeypatch.setitem(spark.sparkContext.environment, name, value)
    with caplog.at_level("WARNING"):
        code = run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(tmp_path / "run"),
                                                         "--dry-run"])
    assert code == 0
    warned = [r.getMessage() for r in caplog.records if "expires at" in r.getMessage()]
    assert len(warned) == 1, warned
    assert warned[0].startswith("cluster cluster-e: the token in PM_T_TARGET expires at 20"), warned[0]
    assert " in 30 min" in warned[0] or " in 29 min" in warned[0], warned[0]
    out, err = capfd.readouterr()
    assert short not in out + err + caplog.text


def test_pulsar_admin_without_a_token_is_refused(auth_pair: tuple[LocalCluster, LocalCluster],
                                                 auth: LocalAuth) -> None:
    """The outside judge agrees that authentication is on and that the local superuser token opens it."""
    source, _ = auth_pair
    anonymous = pulsar_admin(auth, source, None, "tenants", "list")
    assert anonymous.returncode != 0 and "401" in (anonymous.stdout + anonymous.stderr)
    tools = pulsar_admin(auth, source, SUPERUSER_ROLE, "tenants", "list")
    assert tools.returncode == 0 and "public" in tools.stdout.split()


def write_token(path: Path, token: str) -> None:
    """As an agent renewing a token in place would: the new token, a trailing newline, mode 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")


def test_a_token_file_renewed_in_place_is_read_again_when_the_cluster_refuses_the_old_token(
    auth_pair: tuple[LocalCluster, LocalCluster], auth: LocalAuth, tmp_path: Path,
) -> None:
    """One admin client, one token file: refused with the file's expired token (the line names the file and the
    expiry), then served once the file holds a fresh one, without a new client."""
    source, _ = auth_pair
    token_file = tmp_path / "a.token"
    write_token(token_file, auth.create_token(SUPERUSER_ROLE, expiry="1s"))
    time.sleep(2.5)
    cluster = ClusterSpec.from_entry(source.name, {"admin_url": source.admin_url, "service_url": source.service_url,
                                                   "token_file": str(token_file)})
    admin = cluster.admin(timeout_s=15)
    try:
        with pytest.raises(AuthRejected) as refused:
            admin.get("/tenants")
        assert str(refused.value).startswith(f"cluster {source.name}: HTTP 401 on GET /tenants with the token in "
                                             f"file {token_file}: the token expired at 20"), str(refused.value)
        write_token(token_file, auth.token(SUPERUSER_ROLE))
        assert "public" in admin.get("/tenants")
    finally:
        admin.close()


def two_partition_tenant(admin: PulsarAdmin, source: LocalCluster, auth: LocalAuth, prefix: str,
                         count: int) -> tuple[str, str, list[bytes]]:
    """`(tenant, topic, payloads)`: a tenant on `source` whose 2-partition topic holds `count` batched messages."""
    tenant = unique(prefix)
    admin.put(f"/tenants/{tenant}", {"adminRoles": [], "allowedClusters": [source.name]})
    admin.put(f"/namespaces/{tenant}/ns")
    admin.put(f"/persistent/{tenant}/ns/t/partitions", 2)
    topic = f"persistent://{tenant}/ns/t"
    c = role_client(source, auth.token(SUPERUSER_ROLE))
    producer = c.create_producer(topic, batching_enabled=True)
    sent = [f"{prefix}-{i}".encode() for i in range(count)]
    for i, payload in enumerate(sent):
        producer.send_async(payload, None, partition_key=str(i % 7))
    producer.flush()
    c.close()
    return tenant, topic, sent


def read_with_the_specs_client(cluster: ClusterSpec, topic: str, partitions: int = 2) -> list[bytes]:
    """Every message of the topic's partitions, read by a client built from the spec's own cluster entry."""
    got: list[bytes] = []
    client = cluster.pulsar_client()
    try:
        for partition in range(partitions):
            reader = client.create_reader(f"{topic}-partition-{partition}", pulsar.MessageId.earliest)
            while reader.has_message_available():
                got.append(reader.read_next(10_000).data())
            reader.close()
    finally:
        client.close()
    return got


def test_a_copy_outlives_its_first_tokens_when_their_files_are_renewed(
    auth_pair: tuple[LocalCluster, LocalCluster], auth: LocalAuth, tmp_path: Path, spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """replicate_topics with both clusters' tokens in files: the run parks after its inventory until the tokens it
    started with have expired, the files get fresh ones, and the run goes on (its admin clients asked again,
    the copy engine and the executors read the files) to a verified copy a reader of the target confirms."""
    source, target = auth_pair
    admin_d = source.admin(timeout_s=30)
    tenant, topic, sent = two_partition_tenant(admin_d, source, auth, "auth-file", 300)
    files = {source.name: tmp_path / "source.token", target.name: tmp_path / "target.token"}
    for path in files.values():
        write_token(path, auth.token(SUPERUSER_ROLE))
    spec = write_spec(tmp_path / "spec.json", tenant, source, target)
    document = json.loads(spec.read_text())
    for name, path in files.items():
        document["clusters"][name].update({"token_env": None, "token_file": str(path)})
    spec.write_text(json.dumps(document))
    marks = tmp_path / "marks"
    marks.mkdir()
    try:
        assert run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(tmp_path / "run")]) == 0
        short = auth.create_token(SUPERUSER_ROLE, expiry="15s")
        expires = time.time() + 15
        for path in files.values():
            write_token(path, short)
        monkeypatch.setenv("PM_FAULT", "replicate.after_inventory@1=120")
        monkeypatch.setenv("PM_FAULT_MARK_DIR", str(marks))
        faults._armed.cache_clear()
        outcome: list[int] = []
        with caplog.at_level("INFO", logger="pulsar_migration.admin"):
            runner = threading.Thread(target=lambda: outcome.append(
                run_step(REPLICATE, replicate, ["--spec", str(spec), "--run-dir", str(tmp_path / "run")])))
            runner.start()
            deadline = time.monotonic() + 120
            while not (marks / "replicate.after_inventory").exists() and runner.is_alive() \
                    and time.monotonic() < deadline:
                time.sleep(0.2)
            assert (marks / "replicate.after_inventory").exists(), "the run never reached its pause"
            assert time.time() < expires, "the host took longer than the short token's life to reach the pause"
            time.sleep(max(0.0, expires - time.time()) + 1.5)
            fresh = auth.token(SUPERUSER_ROLE)
            for path in files.values():
                write_token(path, fresh)
            (marks / "replicate.after_inventory.go").touch()
            runner.join(300)
        assert outcome == [0]
        renewed = [r.getMessage() for r in caplog.records if "refused the token" in r.getMessage()]
        assert renewed, "no admin call met the expired token: the run never needed the renewed file"
        report = json.loads((tmp_path / "run" / f"{REPLICATE}.json").read_text())
        assert report["verdict"] == "ok" and report["counts"]["copied_messages"] == len(sent), report["counts"]
        # The outside judge: a plain reader on the target, with the spec's own client (the file's token).
        got = read_with_the_specs_client(ClusterSpec.from_entry(target.name, document["clusters"][target.name]),
                                         topic)
        assert sorted(got) == sorted(sent)
    finally:
        faults._armed.cache_clear()
        drop_tenant(tenant, admin_d, target.admin(timeout_s=30))


def test_the_lookup_service_reads_its_cluster_token_file_at_each_lookup(
    auth_pair: tuple[LocalCluster, LocalCluster], auth: LocalAuth, tmp_path: Path,
) -> None:
    """A client that sends no token is looked up with the service's token for the cluster, from a file: refused
    while the file holds an expired token, answered once the file is renewed, the service never restarted."""
    source, _ = auth_pair
    token_file = tmp_path / "d.token"
    write_token(token_file, auth.create_token(SUPERUSER_ROLE, expiry="1s"))
    config, port = tmp_path / "lookup.json", free_port()
    config.write_text(json.dumps({
        "clusters": {source.name: {"http_url": source.admin_url, "token_file": str(token_file)}},
        "default_cluster": source.name, "database_url": f"sqlite:///{tmp_path / 'routes.db'}", "port": port}))
    service = LookupProcess(config, port)
    service.start()
    try:
        time.sleep(2.5)  # past the first token's expiry
        lookup = f"{service.url}/lookup/v2/topic/persistent/public/default/pm-token-file-probe"
        refused = httpx.get(lookup, timeout=30)
        assert refused.status_code == 401, refused.text
        write_token(token_file, auth.token(SUPERUSER_ROLE))
        answered = httpx.get(lookup, timeout=30)
        assert answered.status_code == 200, answered.text
        assert answered.json()["brokerUrl"] == source.service_url
    finally:
        output = service.stop()
    assert auth.token(SUPERUSER_ROLE) not in output


@pytest.fixture
def issuer(auth: LocalAuth) -> Iterator[LocalIssuer]:
    started = LocalIssuer(auth.secret_key).start()
    yield started
    started.stop()


def oauth2_entry(cluster: LocalCluster, issuer: LocalIssuer, credentials: Path) -> dict[str, Any]:
    return {"admin_url": cluster.admin_url, "service_url": cluster.service_url, "token_env": None, "tls": None,
            "oauth2": {"issuer_url": issuer.url, "credentials_file": str(credentials)}}


def test_oauth2_client_credentials_are_exchanged_cached_and_exchanged_again_when_the_cluster_refuses_the_token(
    auth_pair: tuple[LocalCluster, LocalCluster], issuer: LocalIssuer, tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    source, target = auth_pair
    issuer.lifetime_s = 4.0
    good = issuer.add_client("pm-tools", "s3cret", SUPERUSER_ROLE, tmp_path / "tools.json")
    cluster = ClusterSpec.from_entry(source.name, oauth2_entry(source, issuer, good))
    admin = cluster.admin(timeout_s=15)
    try:
        assert "public" in admin.get("/tenants") and "public" in admin.get("/tenants")
        assert issuer.issued["pm-tools"] == 1  # one exchange serves both calls
        time.sleep(issuer.lifetime_s + 1.5)  # the broker now refuses the token the client holds
        assert "public" in admin.get("/tenants")
        assert issuer.issued["pm-tools"] == 2
    finally:
        admin.close()
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"client_id": "pm-tools", "client_secret": "not-it"}))
    with pytest.raises(AuthRejected) as refused:
        ClusterSpec.from_entry(source.name, oauth2_entry(source, issuer, wrong)).admin()
    assert str(refused.value) == (f"cluster {source.name}: OAuth2 issuer {issuer.url} gave client pm-tools no token "
                                  "(HTTP 401: unknown client or secret)")
    assert issuer.refused["pm-tools"] == 1
    # A step with those credentials: the same line, exit 2, before its run dir exists.
    spec = write_spec(tmp_path / "spec.json", "any-tenant", source, target)
    document = json.loads(spec.read_text())
    document["clusters"][source.name] = oauth2_entry(source, issuer, wrong)
    spec.write_text(json.dumps(document))
    capfd.readouterr()
    code = run_step("sync_metadata", sync_metadata, ["--spec", str(spec), "--run-dir", str(tmp_path / "run")])
    errors = [line for line in capfd.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == BAD_INPUT_EXIT and errors == [f"error: sync_metadata: {refused.value}"], errors
    assert not (tmp_path / "run").exists() and "not-it" not in "".join(errors)


def test_a_copy_between_clusters_that_take_oauth2_tokens(
    auth_pair: tuple[LocalCluster, LocalCluster], auth: LocalAuth, issuer: LocalIssuer, tmp_path: Path,
    spark: SparkSession, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:
    """sync_metadata and replicate_topics with only OAuth2 client credentials for both clusters: the admin calls,
    the copy engine's Java client and the executors' Python clients each run the flow against the issuer; a
    reader built from the spec's own entry (the C++ client's flow) finds every message on the target."""
    caplog.set_level("INFO")  # the leak check below reads every record, the admin's and the issuer's INFO too
    source, target = auth_pair
    credentials = issuer.add_client("pm-tools", "s3cret", SUPERUSER_ROLE, tmp_path / "tools.json")
    admin_d = source.admin(timeout_s=30)
    tenant, topic, sent = two_partition_tenant(admin_d, source, auth, "auth-oauth", 200)
    spec = write_spec(tmp_path / "spec.json", tenant, source, target)
    document = json.loads(spec.read_text())
    for cluster in (source, target):
        document["clusters"][cluster.name] = oauth2_entry(cluster, issuer, credentials)
    spec.write_text(json.dumps(document))
    run = ["--spec", str(spec), "--run-dir", str(tmp_path / "run")]
    try:
        assert run_step("sync_metadata", sync_metadata, run) == 0
        assert run_step(REPLICATE, replicate, run) == 0
        report = json.loads((tmp_path / "run" / f"{REPLICATE}.json").read_text())
        assert report["verdict"] == "ok" and report["counts"]["copied_messages"] == len(sent), report["counts"]
        assert report["details"]["copy_engine"] == "java"
        before = issuer.issued["pm-tools"]
        assert before >= 3  # this process's admin calls, the engine's two clients at least
        got = read_with_the_specs_client(ClusterSpec.from_entry(target.name, document["clusters"][target.name]),
                                         topic)
        assert sorted(got) == sorted(sent)
        assert issuer.issued["pm-tools"] > before  # the reader's client ran the flow itself
        assert issuer.refused["pm-tools"] == 0
        # Neither the secret nor any access token in the output (the engine's log included), the logs or the run dir.
        out, err = capfd.readouterr()
        places = {"output": out + err, "log records": caplog.text}
        places.update({str(p): p.read_text(errors="replace") for p in (tmp_path / "run").rglob("*")
                       if p.is_file() and p.suffix in (".json", ".md", ".html", ".log", ".txt")})
        for where, text in places.items():
            assert "s3cret" not in text, f"the client secret leaked into {where}"
            assert not [t for t in issuer.tokens if t in text], f"an access token leaked into {where}"
    finally:
        drop_tenant(tenant, admin_d, target.admin(timeout_s=30))


def test_geo_replication_to_a_peer_its_brokers_reach_with_oauth2_tokens(
    auth_pair: tuple[LocalCluster, LocalCluster], auth: LocalAuth, issuer: LocalIssuer, tmp_path: Path,
    spark: SparkSession,
) -> None:
    """Geo mode with only OAuth2 client credentials in the spec: sync_metadata registers the target in the source
    with Pulsar's OAuth2 plugin and the key file's path, the source broker's replicators run the flow against the
    issuer themselves (the issuer sees the broker's own process group ask), and the backlog arrives whole and
    verified on a target that refuses anyone without a token."""
    from tests.integration.test_replicate_geo import teardown

    source, target = auth_pair
    credentials = issuer.add_client("pm-tools", "s3cret", SUPERUSER_ROLE, tmp_path / "tools.json")
    admin_d, admin_e = source.admin(timeout_s=30), target.admin(timeout_s=30)
    tenant, topic, sent = two_partition_tenant(admin_d, source, auth, "auth-geo", 300)
    admin_d.post(f"/namespaces/{tenant}/ns/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 64})
    spec = write_spec(tmp_path / "spec.json", tenant, source, target, replication={"mode": "geo"},
                      options={"geo_timeout_s": 120})
    document = json.loads(spec.read_text())
    for cluster in (source, target):
        document["clusters"][cluster.name] = oauth2_entry(cluster, issuer, credentials)
    spec.write_text(json.dumps(document))
    run = ["--spec", str(spec), "--run-dir", str(tmp_path / "run")]
    # The pair's start registered each in the other with a token file, and sync_metadata never overwrites a
    # registration (other tenants may replicate through it): this test's goes first and comes back after.
    admin_d.delete(f"/clusters/{target.name}")
    try:
        assert run_step("sync_metadata", sync_metadata, run) == 0
        registered = admin_d.get(f"/clusters/{target.name}")
        assert registered["authenticationPlugin"] == OAUTH2_AUTH_PLUGIN, registered
        assert run_step(REPLICATE, replicate, run) == 0
        report = json.loads((tmp_path / "run" / f"{REPLICATE}.json").read_text())
        assert report["verdict"] == "ok" and report["details"]["mode"] == "geo", report.get("error")
        assert report["hashes"]["source"] == report["hashes"]["target"]
        got = read_with_the_specs_client(ClusterSpec.from_entry(target.name, document["clusters"][target.name]),
                                         topic)
        assert sorted(got) == sorted(sent)
        broker_group = int(source.pid_file.read_text())
        assert issuer.callers[broker_group] >= 1, issuer.callers  # the replicator's own exchange
        assert issuer.refused["pm-tools"] == 0
    finally:
        teardown(tenant, admin_d, admin_e, source.name)
        admin_d.delete(f"/clusters/{target.name}")
        admin_d.upsert_cluster(target.name, pulsar_local.registration(target))
        admin_d.close()
        admin_e.close()


def test_the_lookup_service_looks_up_with_an_oauth2_token(
    auth_pair: tuple[LocalCluster, LocalCluster], issuer: LocalIssuer, tmp_path: Path,
) -> None:
    source, _ = auth_pair
    credentials = issuer.add_client("pm-lookup", "s3cret", SUPERUSER_ROLE, tmp_path / "lookup.json")
    config, port = tmp_path / "lookup-config.json", free_port()
    config.write_text(json.dumps({
        "clusters": {source.name: {"http_url": source.admin_url,
                                   "oauth2": {"issuer_url": issuer.url, "credentials_file": str(credentials)}}},
        "default_cluster": source.name, "database_url": f"sqlite:///{tmp_path / 'routes.db'}", "port": port}))
    service = LookupProcess(config, port)
    service.start()
    try:
        lookup = f"{service.url}/lookup/v2/topic/persistent/public/default/pm-oauth2-probe"
        for _ in range(3):
            answered = httpx.get(lookup, timeout=30)
            assert answered.status_code == 200, answered.text
        assert answered.json()["brokerUrl"] == source.service_url
        assert issuer.issued["pm-lookup"] == 1  # at its start, then cached
    finally:
        service.stop()


def test_the_connection_forms_test_button_takes_a_token_file_or_oauth2_credentials(
    auth_pair: tuple[LocalCluster, LocalCluster], auth: LocalAuth, issuer: LocalIssuer, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Airflow's own Test path (models.Connection.test_connection) for a Pulsar connection that holds no password."""
    from tests.dags.test_pulsar_connection_type import form_test, pulsar_conn

    source, _ = auth_pair
    token_file = tmp_path / "conn.token"
    write_token(token_file, auth.token(SUPERUSER_ROLE))
    credentials = issuer.add_client("pm-conn", "s3cret", SUPERUSER_ROLE, tmp_path / "conn.json")
    base = {"cluster_name": source.name, "service_url": source.service_url, "tls": None}
    for extra in ({"token_file": str(token_file)},
                  {"oauth2": {"issuer_url": issuer.url, "credentials_file": str(credentials)}}):
        ok, message = form_test(pulsar_conn(source, extra={**base, **extra}), monkeypatch)
        assert ok and f"{source.name} answers" in message, (extra, message)
    ok, message = form_test(pulsar_conn(source, extra=base), monkeypatch)  # nothing to authenticate with
    assert not ok and "HTTP 401" in message, message
    assert issuer.issued["pm-conn"] == 1
