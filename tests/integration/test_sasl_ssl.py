"""TLS and SASL composed (issue 16): Apache Kafka 4.4's SASL_SSL listener.

The module's Kafka node (``ksaslssl``) has PLAINTEXT (topic creation, direct reads), SSL,
SASL_PLAINTEXT and SASL_SSL listeners; mirrorguard and the clients under test only use
SASL_SSL (TLS with the test CA, then SCRAM).

- Passthrough: librdkafka speaks TLS to a plain listener and SCRAM through it; mirrorguard
  speaks TLS to Kafka's SASL_SSL listener and relays the SASL exchange; its own Metadata
  refresh authenticates as ``mg`` over the same TLS. A wrong password is the broker's
  authentication error at the client.
- The same passthrough on a ``[[guard]]`` listener: librdkafka produces idempotently and
  transactionally (committed and aborted) and reads back byte-identical batches, Kafka's
  Java client runs transactions with read_committed, a mirrored partition is refused and a
  wrong password is the broker's authentication error (the mirror's source is ``kafka1``).
- The disaster seal over SASL_SSL everywhere: the source is a SASL_SSL cluster of its own
  (``source_tls`` + ``source_sasl``), the state store is reached with ``[state.tls]`` +
  ``[state.sasl]``, the fetcher authenticates to mirrorguard over TLS against the mirror
  listener's ``listener_sasl`` credential file; records from an idempotent and a
  transactional producer (one transaction left open) are mirrored, the source is killed
  (SIGKILL) and the partition is sealed through the admin API: ABORT for the open
  transaction, then the barrier; abort-open then reaches the destination over SASL_SSL.
- Kafka's Java client (tests/clients/java, a transactional producer and a read_committed
  consumer) with SCRAM over TLS through the plain listener. The installed build is used when
  it takes ``--config``; an older one is rebuilt from source in the test's temporary
  directory (``MG_JAVA_CLIENT_CLASSES`` names another build).
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

import harness
import rawkafka
from harness import HOST, Proxy, create_topics, topic_name
from kafka_broker import JAVA, KafkaCluster, kafka_available
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    high_watermark,
    mirror_factory,
)
from secure_clients import (
    FETCHER_PW,
    OPEN_TXN,
    USERS,
    Pki,
    SaslStandIn,
    auth_error,
    credential_file,
    roundtrip,
    sasl_conf,
    tls_rawkafka,
    upstream_sasl,
)

pytestmark = pytest.mark.skipif(not kafka_available() or not shutil.which("openssl"),
                                reason="needs Apache Kafka 4.4 (.tools/kafka) and openssl")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def ksaslssl(tmp_path_factory, pki):
    """One Kafka 4.4 node with a SASL_SSL listener (no test kills it)."""
    c = KafkaCluster(tmp_path_factory.mktemp("ksaslssl"), name="ksaslssl", sasl=USERS, ssl=pki.ca_dir)
    c.start()
    yield c
    harness.close_clients()
    c.stop()


def sasl_ssl_conf(pki: Pki, mechanism: str, user: str = "alice", password: str | None = None) -> dict:
    """librdkafka over SASL_SSL: the test CA, hostname verification on, no client certificate."""
    return {**sasl_conf(mechanism, user=user, password=password, protocol="SASL_SSL"),
            "ssl.ca.location": str(pki.ca), "ssl.endpoint.identification.algorithm": "https"}


def server_ca_only(pki: Pki) -> str:
    """mirrorguard's TLS towards Kafka: the CA only (SASL, not a certificate, authenticates)."""
    return f'{{ ca = "{pki.ca}" }}'


def start_proxy(tmp_path, ksaslssl, pki) -> Proxy:
    """A plain listener: TLS towards clients, TLS towards Kafka's SASL_SSL listener; its own
    Metadata refresh authenticates as `mg` (password from a file)."""
    pw = tmp_path / "mg.pw"
    pw.write_text(USERS["mg"] + "\n")
    p = Proxy(tmp_path, [ksaslssl.sasl_ssl_bootstrap], node_ids=ksaslssl.node_ids, name="mg-saslssl")
    with p.config_path.open("a") as f:
        f.write(f"tls = {pki.server_tls(client_ca=False)}\nupstream_tls = {server_ca_only(pki)}\n"
                f"upstream_sasl = {upstream_sasl('mg', 'SCRAM-SHA-512', password_file=pw)}\n")
    return p.start()


@pytest.mark.quick  # scripts/test.sh --quick: TLS and SASL
def test_passthrough_sasl_over_tls(ksaslssl, pki, tmp_path):
    p = start_proxy(tmp_path, ksaslssl, pki)
    try:
        for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            topic = topic_name("saslssl")
            create_topics(ksaslssl.bootstrap, [topic])
            got = roundtrip(p.bootstrap, topic, sasl_ssl_conf(pki, mech))
            assert got == [b"%s-%d" % (topic.encode(), i) for i in range(3)], mech
            assert high_watermark(ksaslssl.bootstrap, topic) == 3
        e = auth_error(p.bootstrap, sasl_ssl_conf(pki, "SCRAM-SHA-256", password="wrong"))
        assert e.code() == KafkaError._AUTHENTICATION, e
        assert "invalid credentials" in e.str(), e.str()
        m = p.metrics()
        assert m.sum("mirrorguard_requests_total", listener="main", api="SaslAuthenticate") >= 6
        # (the harness's readiness probe opens and closes a TCP connection: kind "eof")
        assert (m.sum("mirrorguard_tls_handshake_errors_total")
                == m.sum("mirrorguard_tls_handshake_errors_total", kind="eof")), m
        log = p.log_path.read_text(errors="replace")
        assert USERS["mg"] not in log and "panicked" not in log
    finally:
        harness.close_clients()
        assert p.terminate() == 0


JAVA_SRC = harness.ROOT / "tests" / "clients" / "java" / "src" / "main" / "java" / "mgtest" / "KafkaClientCheck.java"
JAVA_LIBS = harness.ROOT / ".tools" / "clients" / "java" / "libs"


@pytest.fixture(scope="module")
def java_client(tmp_path_factory):
    """The Java test client's classes: MG_JAVA_CLIENT_CLASSES, else the installed build if it
    takes --config (older builds do not), else a build of the current source made here."""
    if not shutil.which(JAVA) or not JAVA_LIBS.is_dir():
        pytest.fail("Java test client libraries missing: run scripts/install-test-deps.sh", pytrace=False)
    named = os.environ.get("MG_JAVA_CLIENT_CLASSES")
    installed = JAVA_LIBS.parent / "classes"
    if named:
        return Path(named)
    cls = installed / "mgtest" / "KafkaClientCheck.class"
    if cls.exists() and b"config" in cls.read_bytes():
        return installed
    classes = tmp_path_factory.mktemp("javaclient")
    subprocess.run(["javac", "-nowarn", "-cp", f"{JAVA_LIBS}/*", "-d", classes, JAVA_SRC], check=True, timeout=180,
                   capture_output=True)
    return classes


def java_sasl_ssl(classes: Path, pki: Pki, work: Path, bootstrap: str, topic: str, mechanism: str,
                  password: str, **kw) -> dict:
    """Kafka's Java client over SASL_SSL (PEM truststore, hostname verification on) as alice."""
    props = work / f"saslssl-{mechanism}.properties"
    props.write_text(
        "security.protocol=SASL_SSL\n"
        f"sasl.mechanism={mechanism}\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="alice" password="{password}";\n'
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={pki.ca}\n"
        "ssl.endpoint.identification.algorithm=https\n")
    argv = [JAVA, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp", f"{classes}{os.pathsep}{JAVA_LIBS}/*", "mgtest.KafkaClientCheck",
            "--bootstrap", bootstrap, "--topic", topic, "--config", props]
    for k, v in kw.items():
        argv += [f"--{k}", v]
    from test_java_go_clients import _run

    return _run(argv)


def test_java_client_sasl_over_tls(ksaslssl, pki, java_client, tmp_path):
    """Transactions and a read_committed consumer (Kafka's Java client, SCRAM-SHA-512 over
    TLS) through the plain listener; a wrong password is Kafka's SaslAuthenticationException."""
    p = start_proxy(tmp_path, ksaslssl, pki)
    try:
        topic = topic_name("saslssl-java")
        create_topics(ksaslssl.bootstrap, [topic])
        out = java_sasl_ssl(java_client, pki, tmp_path, p.bootstrap, topic, "SCRAM-SHA-512", USERS["alice"],
                            mode="txn", n="5")
        assert out["_rc"] == 0, out
        assert out["consumed"] == [f"java-committed-{i}" for i in range(5)] + [f"java-late-{i}" for i in range(5)]
        bad = java_sasl_ssl(java_client, pki, tmp_path, p.bootstrap, topic, "SCRAM-SHA-256", "wrong",
                            mode="produce-one")
        assert bad.get("error") == "SaslAuthenticationException", bad
        assert "invalid credentials with SASL mechanism SCRAM-SHA-256" in bad.get("message", ""), bad
        m = p.metrics()
        assert m.sum("mirrorguard_requests_total", listener="main", api="SaslAuthenticate") >= 2
    finally:
        assert p.terminate() == 0


POLICY_VIOLATION = 44


def test_guard_passthrough_sasl_over_tls(ksaslssl, pki, java_client, kafka1, mirror_factory, tmp_path):
    """A [[guard]] listener with TLS towards its clients, TLS towards Kafka's SASL_SSL
    listener and SCRAM passed through: librdkafka produces idempotently and transactionally
    (one committed, one aborted transaction) and reads back byte-identical batches; Kafka's
    Java client runs transactions with read_committed; a topic the mirror's source also has
    is refused; a wrong password is the broker's authentication error."""
    # The mirror's source is the session's plain Kafka node: a topic only on `ksaslssl` is
    # not mirrored, so the guard forwards its Produce requests.
    topic, java_topic, mirrored = topic_name("gsaslssl"), topic_name("gsaslssl-java"), topic_name("gsaslssl-m")
    create_topics(ksaslssl.bootstrap, [topic, java_topic, mirrored])
    create_topics(kafka1.bootstrap, [mirrored])
    spec = MirrorSpec("g-src", kafka1.bootstrap, node_ids=kafka1.node_ids)
    pw = tmp_path / "mg.pw"
    pw.write_text(USERS["mg"] + "\n")
    # The lines below follow the [[guard]] table, so they are its keys.
    mg = mirror_factory(ksaslssl.bootstrap, [spec], state_topic=f"__mirror_state_{os.urandom(4).hex()}",
                        guard_upstream=ksaslssl.sasl_ssl_bootstrap, guard_node_ids=ksaslssl.node_ids,
                        extra_config="\n".join([
                            f"tls = {pki.server_tls(client_ca=False)}",
                            f"upstream_tls = {server_ca_only(pki)}",
                            f"upstream_sasl = {upstream_sasl('mg', 'SCRAM-SHA-512', password_file=pw)}",
                        ]))
    mg.wait_sources_known()
    g = mg.guard_bootstrap
    conf = sasl_ssl_conf(pki, "SCRAM-SHA-256")

    idem = [(b"k%d" % i, b"idem-%d-" % i + bytes(range(256))) for i in range(4)]
    harness.produce(g, topic, idem, headers=[("h", b"\x00\xff")], **{"enable.idempotence": True, **conf})
    txp = harness.new_producer(g, **{**sasl_ssl_conf(pki, "SCRAM-SHA-512"), "transactional.id": f"tx-{topic}",
                                     "message.timeout.ms": 15000})
    txp.init_transactions(20)
    for outcome in ("commit", "abort"):
        txp.begin_transaction()
        for i in range(3):
            txp.produce(topic, value=b"%s-%d" % (outcome.encode(), i), key=b"t", partition=0)
        if outcome == "commit":
            txp.commit_transaction(20)
        else:
            assert txp.flush(20) == 0
            txp.abort_transaction(20)
    # 4 idempotent, 3 committed + COMMIT marker, 3 aborted + ABORT marker (the coordinator
    # writes the markers after EndTxn has answered).
    harness.wait_until(lambda: high_watermark(ksaslssl.bootstrap, topic) == 12, 10, what="ABORT marker written")
    got = harness.consume_assign(g, topic, count=7, **{**conf, "isolation.level": "read_committed"})
    assert [(m.key(), m.value()) for m in got] == idem + [(b"t", b"commit-%d" % i) for i in range(3)]
    assert got[0].headers() == [("h", b"\x00\xff")]
    # Every batch (data and markers) read through the guard, over TLS + SCRAM, is the
    # broker's byte for byte.
    direct, direct_raw = rawkafka.fetch_all_batches(HOST, ksaslssl.port, topic)
    with tls_rawkafka(ssl.create_default_context(cafile=str(pki.ca)), sasl=("alice", USERS["alice"], "SCRAM-SHA-256")):
        host, port = g.rsplit(":", 1)
        _, via_guard = rawkafka.fetch_all_batches(host, int(port), topic)
    assert len(direct) == 5 and via_guard == direct_raw

    # A partition the mirror's source also has is refused over the same TLS + SCRAM path.
    with pytest.raises(KafkaException) as e:
        harness.produce(g, mirrored, [(None, b"x")], timeout=10, **{**conf, "enable.idempotence": False,
                                                                    "retries": 0})
    assert e.value.args[0].code() == POLICY_VIOLATION
    assert high_watermark(ksaslssl.bootstrap, mirrored) == 0

    e = auth_error(g, sasl_ssl_conf(pki, "SCRAM-SHA-512", password="wrong"))
    assert e.code() == KafkaError._AUTHENTICATION and "invalid credentials" in e.str(), e.str()

    out = java_sasl_ssl(java_client, pki, tmp_path, g, java_topic, "SCRAM-SHA-512", USERS["alice"],
                        mode="txn", n="3")
    assert out["_rc"] == 0, out
    assert out["consumed"] == [f"java-committed-{i}" for i in range(3)] + [f"java-late-{i}" for i in range(3)]

    m = mg.metrics()
    assert m.sum("mirrorguard_requests_total", listener="guard", api="SaslAuthenticate") >= 6, m
    assert m.sum("mirrorguard_requests_total", listener="guard", api="EndTxn") >= 2, m
    assert (m.sum("mirrorguard_tls_handshake_errors_total")
            == m.sum("mirrorguard_tls_handshake_errors_total", kind="eof")), m
    log = mg.log_text()
    assert USERS["mg"] not in log and USERS["alice"] not in log


def test_seal_over_sasl_ssl_with_source_killed(ksaslssl, pki, kafka_factory, mirror_factory, tmp_path,
                                              monkeypatch):
    src = kafka_factory(name="src-saslssl", sasl=USERS, ssl=pki.ca_dir)
    topic = topic_name("saslssl-seal")
    create_topics(src.bootstrap, [topic])
    create_topics(ksaslssl.bootstrap, [topic])
    creds = tmp_path / "fetchers.creds"
    credential_file(creds)
    src_pw = tmp_path / "src.pw"
    src_pw.write_text(USERS["mg"])
    monkeypatch.setenv("MG_TEST_STATE_PW", USERS["mg"])
    spec = MirrorSpec("a-to-b", src.sasl_ssl_bootstrap, node_ids=src.node_ids, extra="\n".join([
        "upstream_request_timeout_ms = 2000",
        f"tls = {pki.server_tls(client_ca=False)}",
        f"source_tls = {server_ca_only(pki)}",
        f"source_sasl = {upstream_sasl('mg', 'SCRAM-SHA-512', password_file=src_pw)}",
        # PLAIN is checked against the SCRAM credential; the README allows it over TLS only.
        f'listener_sasl = {{ credentials_file = "{creds}", mechanisms = ["SCRAM-SHA-512", "PLAIN"] }}',
        'fetcher_principals = ["User:fetcher"]',
    ]))
    mg = mirror_factory(ksaslssl.sasl_ssl_bootstrap, [spec], extra_config="\n".join([
        "[state.tls]", f'ca = "{pki.ca}"',
        "[state.sasl]", 'mechanism = "SCRAM-SHA-256"', 'username = "mg"', 'password_env = "MG_TEST_STATE_PW"',
    ]))
    # An idempotent producer over SASL_SSL, then a transactional one left open.
    harness.produce(src.sasl_ssl_bootstrap, topic, [(None, b"i-%d" % i) for i in range(4)],
                    **{"enable.idempotence": True, **sasl_ssl_conf(pki, "SCRAM-SHA-256")})
    child = subprocess.Popen([sys.executable, "-c", OPEN_TXN, src.bootstrap, topic],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "open"
        hw = high_watermark(src.bootstrap, topic)
        assert hw == 4 + 3 + 1 + 2  # idempotent, committed, COMMIT marker, open

        # librdkafka over SASL_SSL as `fetcher`, known only to mirrorguard's credential file.
        got = harness.consume_assign(spec.bootstrap, topic, count=4,
                                     **sasl_ssl_conf(pki, "SCRAM-SHA-512", user="fetcher", password=FETCHER_PW))
        assert [m.value() for m in got] == [b"i-%d" % i for i in range(4)]
        got = harness.consume_assign(spec.bootstrap, topic, count=4,
                                     **sasl_ssl_conf(pki, "PLAIN", user="fetcher", password=FETCHER_PW))
        assert [m.value() for m in got] == [b"i-%d" % i for i in range(4)]
        e = auth_error(spec.bootstrap, sasl_ssl_conf(pki, "PLAIN", user="fetcher", password="wrong"))
        assert e.code() == KafkaError._AUTHENTICATION and "invalid credentials" in e.str(), e.str()
        # SCRAM-SHA-256 is not in this listener's list: refused with the enabled ones.
        e = auth_error(spec.bootstrap, sasl_ssl_conf(pki, "SCRAM-SHA-256", user="fetcher", password=FETCHER_PW))
        assert e.code() == KafkaError._AUTHENTICATION and "SCRAM-SHA-256" in e.str(), e.str()

        # The stand-in fetcher: TLS, then SCRAM on every connection it opens.
        with tls_rawkafka(pki.context()):
            f = SaslStandIn(topic, version=13, mechanism="SCRAM-SHA-512").connect(spec.bootstrap)
        f.catch_up(hw)
        data = [b for b in f.log if b.kind == "data"]
        assert len({b.producer_id for b in data}) == 2, data
        open_pid = data[-1].producer_id
        from test_disaster_failover import _wait_topology

        _wait_topology(ksaslssl.bootstrap, "a-to-b", topic, mg.state_topic)

        src.nodes[0].kill()
        res, got = f.fetch_once(max_wait_ms=300)
        assert got == [] and res.error_code == 0
        with tls_rawkafka(pki.context()):  # a new TLS + SCRAM connection, answered locally
            f.connect(spec.bootstrap)
        status, body = mg.post("stop", "a-to-b", topic, [0])
        assert status == 200, body
        f.follow(lambda s: any(b.kind == "barrier" for b in s.log), 20, "barrier appended")
        f.follow(lambda s: (mg.partition(topic, 0) or {}).get("state") == "STOPPED", 20, "STOPPED")
        tail = [b for b in f.log if b.kind in ("abort", "barrier")]
        assert [b.kind for b in tail] == ["abort", "barrier"]
        assert tail[0].producer_id == open_pid and tail[0].base_offset == hw
        f.close()
        # The destination calls (Metadata, DescribeProducers) go over SASL_SSL too: the
        # destination is the state cluster, so [state].tls and [state.sasl] apply.
        status, body = mg.post("abort-open", "a-to-b", topic, [0])
        assert status == 200, body
        assert [r["aborted"] for r in body["partitions"]] == [[]], body
        # The seal's records reached the state cluster over SASL_SSL.
        assert mg.metrics().sum("mirrorguard_state_store_ops_total", kind="append") >= 1
        log = mg.log_text()
        assert USERS["mg"] not in log and FETCHER_PW not in log
    finally:
        child.kill()
        child.wait(5)
        harness.close_clients()
