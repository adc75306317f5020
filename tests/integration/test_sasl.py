"""SASL (issue 16) against Apache Kafka 4.4 SASL_PLAINTEXT listeners.

- Passthrough on ``[[listener]]`` and ``[[guard]]``: librdkafka with SCRAM-SHA-256,
  SCRAM-SHA-512, PLAIN and OAUTHBEARER, and Kafka's Java client, authenticate to the
  broker through mirrorguard; a wrong password is the broker's authentication error at
  the client; SaslHandshake v0 is never advertised and refused; KIP-368
  re-authentication on a connection of the proxy keeps a librdkafka client working.
- ``[[mirror]]`` terminates authentication: the fetcher authenticates to mirrorguard
  against its local credential file (an independent Python SCRAM client, and
  librdkafka), mirrorguard authenticates to the source and the state cluster with its
  own SCRAM credentials (from a file and an environment variable, never logged), and a
  partition is sealed with the source killed.

Every cluster also keeps its PLAINTEXT listener: the tests read high watermarks and
``__mirror_state`` there; mirrorguard and the clients under test only use the SASL one.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from confluent_kafka import KafkaError, Producer, TopicPartition

import harness
import rawkafka
from harness import HOST, Proxy, wait_until
from kafka_broker import JAVA, KafkaCluster
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    StandInFetcher,
    high_watermark,
    mirror_factory,
    read_state_records,
)
from secure_clients import (
    FETCHER_PW,
    USERS,
    SaslStandIn,
    auth_error,
    credential_file,
    roundtrip,
    sasl_conf,
    upstream_sasl,
)

JAVA_SRC = harness.ROOT / "tests" / "integration" / "java" / "SaslClient.java"
KAFKA_LIBS = harness.ROOT / ".tools" / "kafka" / "libs"
SASL_AUTHENTICATION_FAILED = 58
UNSUPPORTED_VERSION = 35


@pytest.fixture(scope="module")
def sasl_kafka(tmp_path_factory):
    """One SASL-enabled node shared by the module's tests (none kills it)."""
    c = KafkaCluster(tmp_path_factory.mktemp("sasl"), name="ksasl", sasl=USERS)
    c.start()
    yield c
    harness.close_clients()
    c.stop()


def start_proxy(tmp_path, cluster: KafkaCluster, name: str = "mgsasl") -> Proxy:
    """A plain listener in front of the SASL listener; its own Metadata refresh
    authenticates as `mg` (password from a file)."""
    pw = tmp_path / f"{name}.pw"
    pw.write_text(USERS["mg"] + "\n")
    p = Proxy(tmp_path, [cluster.sasl_bootstrap], node_ids=cluster.node_ids, name=name)
    with open(p.config_path, "a") as f:
        f.write(f"upstream_sasl = {upstream_sasl('mg', 'SCRAM-SHA-512', password_file=pw)}\n")
    return p.start()


# ---------------------------------------------------------------- passthrough

def test_passthrough_every_mechanism_and_wrong_password(sasl_kafka, tmp_path):
    proxy = start_proxy(tmp_path, sasl_kafka)
    try:
        for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN", "OAUTHBEARER"):
            topic = harness.topic_name("sasl")
            harness.create_topics(sasl_kafka.bootstrap, [topic])
            got = roundtrip(proxy.bootstrap, topic, sasl_conf(mech))
            assert got == [b"%s-%d" % (topic.encode(), i) for i in range(3)], mech

        e = auth_error(proxy.bootstrap, sasl_conf("SCRAM-SHA-256", password="wrong"))
        assert e.code() == KafkaError._AUTHENTICATION, e
        assert "Authentication failed during authentication due to invalid credentials" in e.str(), e.str()

        # SaslHandshake v0 (raw tokens follow it) is not offered, and refused locally.
        with rawkafka.Connection(HOST, proxy.ports.bootstrap) as c:
            assert rawkafka.api_versions(c)[17][0] == 1
            r = rawkafka.Reader(c.request(17, 0, rawkafka.string("PLAIN")))
            assert r.i16() == UNSUPPORTED_VERSION
            # The connection is still in step: a v1 handshake goes to the broker.
            r = rawkafka.Reader(c.request(17, 1, rawkafka.string("SCRAM-SHA-256")))
            assert r.i16() == 0
        m = proxy.metrics()
        assert m.sum("mirrorguard_requests_total", api="SaslAuthenticate") >= 8
        log = proxy.log_path.read_text()
        assert USERS["mg"] not in log and "upstream metadata read" in log
    finally:
        harness.close_clients()
        assert proxy.terminate() == 0


@pytest.fixture(scope="module")
def java_classes(tmp_path_factory):
    classes = tmp_path_factory.mktemp("saslclasses")
    subprocess.run(["javac", "-cp", f"{KAFKA_LIBS}/*", "-d", classes, JAVA_SRC], check=True, timeout=180)
    return classes


def java(classes, bootstrap: str, topic: str, mech: str, user: str, password: str, n: int,
         consume_only: bool = False) -> dict:
    """Kafka's Java client (tests/integration/java/SaslClient.java); its JSON line."""
    r = subprocess.run([JAVA, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                        "-cp", f"{classes}{os.pathsep}{KAFKA_LIBS}/*", "SaslClient",
                        bootstrap, topic, mech, user, password, str(n)] + (["consume"] if consume_only else []),
                       capture_output=True, text=True, timeout=120)
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    assert lines, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(lines[-1])


def test_java_client_through_the_proxy(sasl_kafka, java_classes, tmp_path):
    proxy = start_proxy(tmp_path, sasl_kafka)
    try:
        topic = harness.topic_name("sasljava")
        harness.create_topics(sasl_kafka.bootstrap, [topic])
        got = java(java_classes, proxy.bootstrap, topic, "SCRAM-SHA-512", "alice", USERS["alice"], 5)
        assert got == {"produced": 5, "consumed": 5}
        bad = java(java_classes, proxy.bootstrap, topic, "SCRAM-SHA-256", "alice", "wrong", 5)
        assert bad["error"] == "SaslAuthenticationException", bad
        assert "invalid credentials with SASL mechanism SCRAM-SHA-256" in bad["message"], bad
    finally:
        assert proxy.terminate() == 0


def test_reauthentication_through_the_proxy(kafka_factory, tmp_path):
    """KIP-368: the broker gives sessions of 4 s; librdkafka re-authenticates on its
    connections through the proxy (SaslHandshake/SaslAuthenticate relayed mid-stream)
    and keeps producing and fetching. (librdkafka starts a re-authentication shortly before
    the broker ends the session; with 2 s sessions that margin was too short on a busy
    machine: the broker closed connections whose re-authentication came late.)"""
    c = kafka_factory(name="reauth", sasl=USERS, overrides={"connections.max.reauth.ms": 4000})
    proxy = start_proxy(tmp_path, c, name="mgreauth")
    try:
        topic = harness.topic_name("reauth")
        harness.create_topics(c.bootstrap, [topic])
        conf = sasl_conf("SCRAM-SHA-256")
        errors: list = []
        p = harness.new_producer(proxy.bootstrap, **{"enable.idempotence": True, "error_cb": errors.append,
                                                     **conf})
        # Connections are up once the first record is delivered.
        harness.produce(proxy.bootstrap, topic, [(None, b"r-0")], producer=p)
        sent = 1
        time.sleep(0.5)
        before = proxy.metrics()
        t_end = time.monotonic() + 11
        while time.monotonic() < t_end:
            harness.produce(proxy.bootstrap, topic, [(None, b"r-%d" % sent)], producer=p)
            sent += 1
            time.sleep(0.3)
        after = proxy.metrics()
        reauths = (after.sum("mirrorguard_requests_total", api="SaslAuthenticate")
                   - before.sum("mirrorguard_requests_total", api="SaslAuthenticate"))
        new_conns = (after.sum("mirrorguard_connections_total", listener="main")
                     - before.sum("mirrorguard_connections_total", listener="main"))
        # SCRAM: two SaslAuthenticate per (re-)authentication; over 11 s with 4 s sessions
        # the producer's connection re-authenticated several times without reconnecting.
        assert reauths >= 4 and new_conns == 0, (reauths, new_conns)
        assert not errors, errors
        got = harness.consume_assign(proxy.bootstrap, topic, count=sent, **conf)
        assert [m.value() for m in got] == [b"r-%d" % i for i in range(sent)]
    finally:
        harness.close_clients()
        assert proxy.terminate() == 0


# ---------------------------------------------------------------- mirror termination

def test_mirror_terminates_sasl_and_seals_with_the_source_killed(sasl_kafka, kafka_factory, mirror_factory,
                                                                  java_classes, tmp_path, monkeypatch):
    src = kafka_factory(name="src", sasl=USERS)
    topic = harness.topic_name("saslmirror")
    harness.create_topics(src.bootstrap, [topic])
    harness.create_topics(sasl_kafka.bootstrap, [topic])
    creds = tmp_path / "fetchers.creds"
    credential_file(creds)
    src_pw = tmp_path / "src.pw"
    src_pw.write_text(USERS["mg"])
    monkeypatch.setenv("MG_TEST_STATE_PW", USERS["mg"])
    spec = MirrorSpec("a-to-b", src.sasl_bootstrap, node_ids=src.node_ids, extra="\n".join([
        "upstream_request_timeout_ms = 2000",
        f"source_sasl = {upstream_sasl('mg', 'SCRAM-SHA-256', password_file=src_pw)}",
        f'listener_sasl = {{ credentials_file = "{creds}" }}',
        'fetcher_principals = ["User:fetcher"]',
    ]))
    mg = mirror_factory(sasl_kafka.sasl_bootstrap, [spec], guard_upstream=sasl_kafka.sasl_bootstrap,
                        guard_node_ids=sasl_kafka.node_ids, extra_config="\n".join([
                            f"upstream_sasl = {upstream_sasl('mg', 'SCRAM-SHA-512', password_env='MG_TEST_STATE_PW')}",
                            "",
                            "[state.sasl]",
                            'mechanism = "SCRAM-SHA-256"',
                            'username = "mg"',
                            'password_env = "MG_TEST_STATE_PW"',
                        ]))
    harness.produce(src.sasl_bootstrap, topic, [(None, b"m-%d" % i) for i in range(5)],
                    **{"enable.idempotence": True, **sasl_conf("SCRAM-SHA-256")})
    hw = high_watermark(src.bootstrap, topic)
    assert hw == 5

    # librdkafka authenticates to mirrorguard (not to the source, which has no `fetcher`).
    fetcher_conf = sasl_conf("SCRAM-SHA-512", user="fetcher", password=FETCHER_PW)
    got = harness.consume_assign(spec.bootstrap, topic, count=5, **fetcher_conf)
    assert [m.value() for m in got] == [b"m-%d" % i for i in range(5)]
    # Kafka's Java client too (SaslAuthenticate v2, flexible; ApiVersions again after).
    got = java(java_classes, spec.bootstrap, topic, "SCRAM-SHA-256", "fetcher", FETCHER_PW, 5, consume_only=True)
    assert got == {"produced": 0, "consumed": 5}, got
    bad = java(java_classes, spec.bootstrap, topic, "SCRAM-SHA-512", "fetcher", "wrong", 5, consume_only=True)
    assert bad["error"] == "SaslAuthenticationException", bad
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in bad["message"], bad
    e = auth_error(spec.bootstrap, sasl_conf("SCRAM-SHA-256", user="fetcher", password="wrong"))
    assert e.code() == KafkaError._AUTHENTICATION and "invalid credentials" in e.str(), e.str()
    e = auth_error(spec.bootstrap, sasl_conf("PLAIN", user="fetcher", password=FETCHER_PW))
    assert e.code() == KafkaError._AUTHENTICATION and "PLAIN" in e.str(), e.str()
    # Unauthenticated requests are not answered: the connection is closed, as Kafka does.
    with rawkafka.Connection(HOST, spec.node_port, timeout=5) as c:
        with pytest.raises((rawkafka.ProtocolError, OSError)):
            rawkafka.metadata_v1(c, [topic])

    f = SaslStandIn(topic, version=13).connect(spec.bootstrap)
    f.catch_up(hw)

    def topology_persisted():
        return any(r.type == 8 and r.value and any(t["name"] == topic for t in r.value["topics"])
                   for r in read_state_records(sasl_kafka.bootstrap, topic=mg.state_topic))

    wait_until(topology_persisted, 15, interval=0.3, what="source topology persisted over SASL")

    src.nodes[0].kill()
    # A new fetcher connection authenticates against the local file with the source dead.
    f.connect(spec.bootstrap)
    res, got = f.fetch_once(max_wait_ms=200)
    assert got == [] and res.error_code == 0

    # The guard refuses Produce to the mirrored partition (librdkafka through the guard
    # authenticates to the destination: passthrough).
    guard_p = Producer({"bootstrap.servers": mg.guard_bootstrap, "message.timeout.ms": 10000,
                        "retries": 0, **sasl_conf("SCRAM-SHA-256")})
    refused: list = []
    guard_p.produce(topic, b"early", partition=0, on_delivery=lambda err, msg: refused.append(err))
    guard_p.flush(15)
    assert refused and refused[0] is not None and refused[0].code() == KafkaError.POLICY_VIOLATION, refused

    status, body = mg.post("stop", "a-to-b", topic, [0])
    assert status == 200, body
    f.follow(lambda s: any(b.kind == "barrier" for b in s.log), 20, "barrier appended")
    f.follow(lambda s: (mg.partition(topic, 0) or {}).get("state") == "STOPPED", 20, "STOPPED")
    assert [b.kind for b in f.log if b.kind in ("abort", "barrier")][-1] == "barrier"
    f.close()
    # The destination admin calls (Metadata, DescribeProducers) authenticate as `mg`.
    status, body = mg.post("abort-open", "a-to-b", topic, [0])
    assert status == 200, body
    assert [r["aborted"] for r in body["partitions"]] == [[]], body

    ok: list = []
    guard_p.produce(topic, b"after", partition=0, on_delivery=lambda err, msg: ok.append(err))
    guard_p.flush(15)
    assert ok == [None], ok
    log = mg.log_text()
    assert USERS["mg"] not in log and FETCHER_PW not in log
    assert "client not authenticated" in log


def test_mirror_upstream_reauthenticates_in_place(kafka1, kafka_factory, mirror_factory, tmp_path):
    """KIP-368 on mirrorguard's own relayed connection: the source gives sessions of
    2.5 s; a fetcher (one authenticated connection to the mirror listener) fetches for
    about three session lifetimes while records arrive. mirrorguard re-authenticates its
    upstream connection in place before each session expires: the fetcher's connection is
    never answered locally nor closed, no new connection is accepted, and every record
    arrives in order."""
    src = kafka_factory(name="srcreauth", sasl=USERS, overrides={"connections.max.reauth.ms": 2500})
    topic = harness.topic_name("mreauth")
    harness.create_topics(src.bootstrap, [topic])
    harness.create_topics(kafka1.bootstrap, [topic])  # the destination (Fetch v13 topic ids)
    creds = tmp_path / "fetchers.creds"
    credential_file(creds)
    src_pw = tmp_path / "src.pw"
    src_pw.write_text(USERS["mg"])
    spec = MirrorSpec("reauth", src.sasl_bootstrap, node_ids=src.node_ids, extra="\n".join([
        f"source_sasl = {upstream_sasl('mg', 'SCRAM-SHA-512', password_file=src_pw)}",
        f'listener_sasl = {{ credentials_file = "{creds}" }}',
        'fetcher_principals = ["User:fetcher"]',
    ]))
    mg = mirror_factory(kafka1.bootstrap, [spec])
    p = harness.new_producer(src.sasl_bootstrap, **{"enable.idempotence": True, **sasl_conf("SCRAM-SHA-256")})
    harness.produce(src.sasl_bootstrap, topic, [(None, b"r-0")], producer=p)
    sent = 1
    f = SaslStandIn(topic, version=13).connect(spec.bootstrap)
    f.catch_up(sent)
    before = mg.metrics()
    t_end = time.monotonic() + 8
    while time.monotonic() < t_end:
        harness.produce(src.sasl_bootstrap, topic, [(None, b"r-%d" % sent)], producer=p)
        sent += 1
        # Raises if the connection closes (on main: at the first fetch after the
        # source closed the expired upstream connection, once the listener sees the
        # source again).
        f.fetch_once(max_wait_ms=200)
    assert high_watermark(src.bootstrap, topic) == sent
    f.catch_up(sent)
    after = mg.metrics()
    # Every record, in order, each offset once (check_batch verified every batch).
    assert f.leo == sent and sum(b.last_offset - b.base_offset + 1 for b in f.log) == sent
    ok = after.sum("mirrorguard_reauthentications_total", result="ok")
    assert ok >= 2, ok
    assert after.sum("mirrorguard_reauthentications_total", result="error") == 0
    new_conns = (after.sum("mirrorguard_connections_total") - before.sum("mirrorguard_connections_total"))
    offline = after.sum("mirrorguard_upstream_errors_total") - before.sum("mirrorguard_upstream_errors_total")
    assert new_conns == 0 and offline == 0, (new_conns, offline)
    f.close()
    harness.close_clients()


def test_documented_acls_are_enough(kafka_factory, mirror_factory, tmp_path, monkeypatch):
    """An authorizer on one cluster (source, destination and state at once), and
    mirrorguard's principal `mg` holding exactly the README's ACLs: start-up (state
    topic created, checked, idempotent producer), the mirror's refresh and fetches,
    a seal and abort-open all pass."""
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType,
                                       ResourcePatternType, ResourceType)

    c = kafka_factory(name="acl", sasl=USERS, overrides={
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        # PLAINTEXT (inter-broker, the tests' own reads) is ANONYMOUS.
        "super.users": "User:ANONYMOUS;User:alice",
        "allow.everyone.if.no.acl.found": "false",
    })
    topic, hidden = harness.topic_name("acl"), harness.topic_name("aclhidden")
    harness.create_topics(c.bootstrap, [topic, hidden])

    def allow(rtype, name, *ops):
        return [AclBinding(rtype, name, ResourcePatternType.LITERAL, "User:mg", "*", op,
                           AclPermissionType.ALLOW) for op in ops]

    acls = (allow(ResourceType.TOPIC, "__mirror_state", AclOperation.READ, AclOperation.WRITE,
                  AclOperation.CREATE, AclOperation.DESCRIBE_CONFIGS)
            + allow(ResourceType.BROKER, "kafka-cluster", AclOperation.IDEMPOTENT_WRITE,
                    AclOperation.CLUSTER_ACTION)
            + allow(ResourceType.TOPIC, topic, AclOperation.DESCRIBE, AclOperation.READ))
    for f in harness.admin(c.bootstrap).create_acls(acls).values():
        f.result(15)
    # The authorizer is on: `mg` sees only what its ACLs grant.
    seen = wait_until(lambda: harness.admin(c.sasl_bootstrap, **sasl_conf("SCRAM-SHA-256", user="mg"))
                      .list_topics(timeout=10).topics.keys() or None, 15, what="mg's Metadata")
    assert topic in seen and hidden not in seen, sorted(seen)
    harness.produce(c.sasl_bootstrap, topic, [(None, b"a-%d" % i) for i in range(3)],
                    **{"enable.idempotence": True, **sasl_conf("SCRAM-SHA-256")})

    creds = tmp_path / "fetchers.creds"
    credential_file(creds)
    monkeypatch.setenv("MG_TEST_STATE_PW", USERS["mg"])
    identity = upstream_sasl("mg", "SCRAM-SHA-256", password_env="MG_TEST_STATE_PW")
    spec = MirrorSpec("a-to-b", c.sasl_bootstrap, node_ids=c.node_ids, extra="\n".join([
        f"source_sasl = {identity}",
        f'listener_sasl = {{ credentials_file = "{creds}" }}',
        'fetcher_principals = ["User:fetcher"]',
    ]))
    mg = mirror_factory(c.sasl_bootstrap, [spec], extra_config="\n".join([
        "[state.sasl]", 'mechanism = "SCRAM-SHA-256"', 'username = "mg"', 'password_env = "MG_TEST_STATE_PW"']))
    f = SaslStandIn(topic, version=13).connect(spec.bootstrap)
    f.catch_up(3)
    status, body = mg.post("stop", "a-to-b", topic, [0])
    assert status == 200, body
    f.follow(lambda s: (mg.partition(topic, 0) or {}).get("state") == "STOPPED", 20, "STOPPED")
    f.close()
    status, body = mg.post("abort-open", "a-to-b", topic, [0])
    assert status == 200, body
    log = mg.log_text()
    assert "AUTHORIZATION_FAILED" not in log.upper(), log[-3000:]
