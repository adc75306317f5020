"""TLS on mirrorguard's listeners and outbound connections (issue 16, items 1, 5, 6), against
Apache Kafka 4.4's own SSL listener with mutual TLS required.

Certificates are made at test time with ``openssl`` (``kafka_broker.CertAuthority``): one CA for
Kafka's broker certificate, mirrorguard's server certificate and every client certificate,
and a second, foreign CA for an intruder. The module's Kafka node (``kssl``) has a PLAINTEXT
listener (direct checks, topic creation) and an SSL listener that requires a client
certificate; everything mirrorguard does upstream goes to the SSL one.

- plain listener, TLS + mTLS on both sides: librdkafka and Kafka's Java client produce and
  consume through it;
- hostile input on the TLS port: plaintext, a stalled handshake, a foreign client
  certificate, an expired one (``openssl ca`` backdates it), no client certificate: each
  closed and counted, a good client unaffected;
- SIGHUP: a new server certificate is served to new connections; a bad key keeps the old;
- guard (librdkafka and the Java client refused on a mirrored partition) and mirror listeners
  over TLS, the state store over TLS, and the seal over TLS
  with the source (an SSL cluster of its own) killed;
- the reference destination's Kafka-engine fetcher (tests/kafka-dest, SSLSocket with a
  client certificate) mirroring through an mTLS mirror listener;
- the admin endpoint over HTTPS;
- hostname verification towards Kafka (on by default; the documented opt-out).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import sys
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

import harness
import kafka_dest
import mirror_harness
import rawkafka
from harness import HOST, create_topics, topic_name, wait_until
from kafka_broker import JAVA, KafkaCluster, kafka_available
from kafka_dest import kafka_dest_factory  # noqa: F401 - fixture
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    StandInFetcher,
    high_watermark,
    mirror_factory,
)
from secure_clients import OPEN_TXN, Pki, rawkafka_tls, tls_rawkafka

# The mirror listeners below require client certificates: the test clients' one (CN=app) is
# the destination fetcher's (issue 30: only fetcher principals move a seal).
FETCHER = 'fetcher_principals = ["User:CN=app"]\n'

pytestmark = pytest.mark.skipif(not kafka_available() or not shutil.which("openssl"),
                                reason="needs Apache Kafka 4.4 (.tools/kafka) and openssl")

POLICY_VIOLATION = 44


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def kssl(tmp_path_factory, pki):
    """One Kafka 4.4 node with an mTLS-required SSL listener next to PLAINTEXT."""
    cluster = KafkaCluster(tmp_path_factory.mktemp("kssl"), nodes=1, name="kssl", ssl=pki.ca_dir)
    cluster.start()
    yield cluster
    harness.close_clients()
    cluster.stop()


def _proxy(work_dir, kssl, pki, name: str, listener_tls: str, upstream_tls: str | None = None,
           log_level: str = "info") -> harness.Proxy:
    p = harness.Proxy(work_dir, [kssl.ssl_bootstrap], node_ids=kssl.node_ids, name=name, log_level=log_level)
    with p.config_path.open("a") as f:
        f.write(f"tls = {listener_tls}\nupstream_tls = {upstream_tls or pki.client_tls()}\n")
        if "client_ca" not in listener_tls:
            # Clients without certificates act as mirrorguard's: said explicitly (issue 30).
            f.write('upstream_identity = "shared"\n')
    return p


@pytest.fixture(scope="module")
def tls_proxy(tmp_path_factory, kssl, pki):
    """A plain listener: mTLS towards clients (1 s handshake timeout), mTLS towards Kafka."""
    p = _proxy(tmp_path_factory.mktemp("tls-proxy"), kssl, pki, "mg-tls",
               pki.server_tls(client_ca=True, timeout_ms=1000)).start()
    yield p
    harness.close_clients()
    rc = p.terminate()
    assert rc == 0, f"exit code {rc}"
    assert "panicked" not in p.log_path.read_text(errors="replace")


def _roundtrip(bootstrap: str, topic: str, conf: dict, n: int = 20) -> None:
    delivered = harness.produce(bootstrap, topic, [(b"k%d" % i, b"v%d" % i) for i in range(n)], **conf,
                                **{"enable.idempotence": True})
    assert [m.offset() for m in delivered] == list(range(n))
    got = harness.consume_assign(bootstrap, topic, count=n, **conf)
    assert [m.value() for m in got] == [b"v%d" % i for i in range(n)]


def test_listener_tls_both_sides_librdkafka(tls_proxy, kssl, pki):
    topic = topic_name("tls")
    create_topics(kssl.bootstrap, [topic])
    _roundtrip(tls_proxy.bootstrap, topic, pki.rdkafka())
    # What went through reached Kafka's SSL listener (mTLS required there).
    assert high_watermark(kssl.bootstrap, topic) == 20
    m = tls_proxy.metrics()
    for api in ("Produce", "Fetch", "InitProducerId", "Metadata"):
        assert m.sum("mirrorguard_requests_total", listener="main", api=api) > 0, api
    # Advertised node ports are the proxy's, served over TLS too.
    md = harness.admin(tls_proxy.bootstrap, **pki.rdkafka()).list_topics(timeout=10)
    assert {b.port for b in md.brokers.values()} == {tls_proxy.ports.node_port_of(n) for n in kssl.node_ids}


JAVA_DIR = harness.ROOT / ".tools" / "clients" / "java"
# scripts/install-test-deps.sh compiles tests/clients/java there; a fresh build elsewhere
# may be named instead (its classes directory).
JAVA_CLASSES = Path(os.environ.get("MG_JAVA_CLIENT_CLASSES", JAVA_DIR / "classes"))


def _java(pki, work, bootstrap: str, topic: str, mode: str, **kw) -> dict:
    """Kafka's Java client (tests/clients/java) over SSL: PEM truststore and keystore,
    hostname verification on."""
    cls = JAVA_CLASSES / "mgtest" / "KafkaClientCheck.class"
    if not cls.exists() or not shutil.which(JAVA):
        pytest.fail("Java test client missing: run scripts/install-test-deps.sh", pytrace=False)
    cert, key = pki.app
    props = work / "ssl.properties"
    props.write_text(
        "security.protocol=SSL\n"
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={pki.ca}\n"
        "ssl.keystore.type=PEM\n"
        f"ssl.keystore.location={_keystore(work, cert, key)}\n"
        "ssl.endpoint.identification.algorithm=https\n")
    argv = [JAVA, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp", f"{JAVA_CLASSES}{os.pathsep}{JAVA_DIR / 'libs'}/*", "mgtest.KafkaClientCheck",
            "--bootstrap", bootstrap, "--topic", topic, "--mode", mode, "--config", props]
    for k, v in kw.items():
        argv += [f"--{k}", v]
    from test_java_go_clients import _run

    return _run(argv)


def test_java_client_through_tls_listener(tls_proxy, kssl, pki, tmp_path):
    """Transactions and a read_committed consumer through the TLS listener."""
    topic = topic_name("tls-java")
    create_topics(kssl.bootstrap, [topic])
    out = _java(pki, tmp_path, tls_proxy.bootstrap, topic, "txn", n="5")
    assert out["_rc"] == 0, out
    assert out["consumed"] == [f"java-committed-{i}" for i in range(5)] + [f"java-late-{i}" for i in range(5)]


def _keystore(d, cert, key):
    p = d / "app.keystore.pem"
    p.write_text(key.read_text() + cert.read_text())
    return p


def _handshake_errors(p, kind: str) -> float:
    return p.metrics().sum("mirrorguard_tls_handshake_errors_total", listener="main", kind=kind)


def _closed_by_peer(s: socket.socket, timeout: float) -> float:
    """Seconds until the peer closes `s` (reads until EOF or reset)."""
    t0 = time.monotonic()
    s.settimeout(timeout)
    try:
        while s.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - t0


def test_hostile_input_on_tls_port(tls_proxy, kssl, pki):
    topic = topic_name("tls-hostile")
    create_topics(kssl.bootstrap, [topic])
    host, port = HOST, tls_proxy.ports.bootstrap
    # A good TLS client keeps working across everything below.
    good = rawkafka_tls(pki.context(), host, port)

    # 1. Plaintext Kafka (ApiVersions) on the TLS port: closed at once, counted.
    before = _handshake_errors(tls_proxy, "plaintext")
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(bytes.fromhex("0000000a00120003000000010000"))
        assert _closed_by_peer(s, 5) < 2
    wait_until(lambda: _handshake_errors(tls_proxy, "plaintext") == before + 1, 5, what="plaintext counted")

    # 2. A handshake that never finishes: closed after the 1 s handshake timeout.
    before = _handshake_errors(tls_proxy, "timeout")
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(b"\x16\x03\x01")
        took = _closed_by_peer(s, 10)
        assert 0.8 <= took < 5, took
    wait_until(lambda: _handshake_errors(tls_proxy, "timeout") == before + 1, 5, what="timeout counted")

    # 3. Garbage after a ClientHello record header.
    before = _handshake_errors(tls_proxy, "protocol")
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(b"\x16\x03\x01\x00\x40\x01\x00\x00\x3c" + b"\xab" * 0x3c)
        assert _closed_by_peer(s, 5) < 2
    wait_until(lambda: _handshake_errors(tls_proxy, "protocol") == before + 1, 5, what="garbage counted")

    # 4. A client certificate from a foreign CA, an expired one of the right CA, and none at
    # all (mTLS required).
    for cert, kind in ((pki.foreign, "unknown_ca"), (pki.expired, "cert_expired"), (None, "no_client_cert")):
        before = _handshake_errors(tls_proxy, kind)
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        if cert:
            ctx.load_cert_chain(str(cert[0]), str(cert[1]))
        with pytest.raises((ssl.SSLError, ConnectionError, rawkafka.ProtocolError, OSError)):
            c = rawkafka_tls(ctx, host, port)
            rawkafka.api_versions(c)  # TLS 1.3: the refusal arrives after the client's Finished
        wait_until(lambda: _handshake_errors(tls_proxy, kind) == before + 1, 5, what=f"{kind} counted")
    # librdkafka with the foreign certificate cannot produce.
    with pytest.raises((KafkaException, TimeoutError)):
        harness.produce(tls_proxy.bootstrap, topic, [(None, b"x")], timeout=3, **pki.rdkafka(pki.foreign))

    # The good connection opened first is still served; only the hostile ones were closed.
    assert rawkafka.API_FETCH in rawkafka.api_versions(good)
    good.close()
    log = tls_proxy.log_path.read_text(errors="replace")
    assert "TLS handshake failed" in log and "plaintext" in log and "unknown_ca" in log and "cert_expired" in log


def _peer_cert(pki, port: int) -> bytes:
    with socket.create_connection((HOST, port), timeout=5) as s:
        with pki.context().wrap_socket(s, server_hostname=HOST) as t:
            return t.getpeercert(binary_form=True)


def test_sighup_reloads_certificates_and_keeps_old_on_bad_key(tmp_path, kssl, pki):
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    shutil.copy(pki.server[0], cert)
    shutil.copy(pki.server[1], key)
    p = _proxy(tmp_path, kssl, pki, "mg-reload",
               f'{{ cert = "{cert}", key = "{key}" }}').start()
    try:
        first = _peer_cert(pki, p.ports.bootstrap)
        new_cert, new_key = pki.ca_dir.issue("mirrorguard-rotated")
        shutil.copy(new_cert, cert)
        shutil.copy(new_key, key)
        p.proc.send_signal(signal.SIGHUP)

        def reloads(result):
            return p.metrics().sum("mirrorguard_tls_reloads_total", result=result)

        wait_until(lambda: reloads("ok") >= 2, 5, what="reload counted")  # tls and upstream_tls
        second = _peer_cert(pki, p.ports.bootstrap)
        assert second != first and second == ssl.PEM_cert_to_DER_cert(new_cert.read_text())
        # A key that is not the certificate's: refused, the rotated pair stays in use.
        shutil.copy(pki.app[1], key)
        p.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: reloads("error") >= 1, 5, what="refused reload counted")
        assert _peer_cert(pki, p.ports.bootstrap) == second
        log = p.log_path.read_text(errors="replace")
        assert "keeping the previous certificates and keys" in log and "does not belong" in log
        # Still a working proxy.
        topic = topic_name("tls-reload")
        create_topics(kssl.bootstrap, [topic])
        harness.produce(p.bootstrap, topic, [(None, b"after-reload")],
                        **{"security.protocol": "SSL", "ssl.ca.location": str(pki.ca)})
    finally:
        harness.close_clients()
        assert p.terminate() == 0


def test_guard_and_mirror_over_tls_with_state_over_tls(kssl, pki, mirror_factory, tmp_path):
    """One SSL cluster is source, destination and state cluster (a one-cluster bed):
    the state store, the mirror's source and the guard's upstream are all mTLS to Kafka;
    the mirror and guard listeners are mTLS to their clients."""
    mirrored = topic_name("tls-m")
    create_topics(kssl.bootstrap, [mirrored])
    harness.produce(kssl.bootstrap, mirrored, [(None, b"m%d" % i) for i in range(5)], **{"enable.idempotence": True})
    spec = MirrorSpec("s-to-d", kssl.ssl_bootstrap, node_ids=kssl.node_ids,
                      extra=f"tls = {pki.server_tls()}\nsource_tls = {pki.client_tls()}\n{FETCHER}")
    mg = mirror_factory(kssl.ssl_bootstrap, [spec], start=False, guard_upstream=kssl.ssl_bootstrap,
                        guard_node_ids=kssl.node_ids,
                        extra_config=f"[state.tls]\nca = \"{pki.ca}\"\ncert = \"{pki.upstream[0]}\"\n"
                                     f"key = \"{pki.upstream[1]}\"\n"
                                     f"[guard.tls]\ncert = \"{pki.server[0]}\"\nkey = \"{pki.server[1]}\"\n"
                                     f"client_ca = \"{pki.ca}\"\n"
                                     f"[guard.upstream_tls]\nca = \"{pki.ca}\"\ncert = \"{pki.upstream[0]}\"\n"
                                     f"key = \"{pki.upstream[1]}\"\n")
    mg.start()
    mg.wait_sources_known()
    conf = pki.rdkafka()
    # Mirror listener: a librdkafka consumer over TLS reads the source through it.
    got = harness.consume_assign(spec.bootstrap, mirrored, count=5, **conf)
    assert [m.value() for m in got] == [b"m%d" % i for i in range(5)]
    # The stand-in fetcher over TLS: PIDs rewritten into the source's region.
    with tls_rawkafka(pki.context()):
        f = StandInFetcher(mirrored, version=12).connect(spec.bootstrap)
    f.catch_up(5)
    src_pid = [b for b in mirror_harness.direct_batches(kssl.bootstrap, mirrored)][0].producer_id
    assert f.log[0].producer_id == mirror_harness.map_pid(src_pid, mirror_harness.fold(kssl.cluster_id))
    f.close()
    # Guard over TLS: a mirrored partition is refused (in this one-cluster bed every topic
    # of the destination is also the source's, so all are); reads pass.
    with pytest.raises(KafkaException) as e:
        harness.produce(mg.guard_bootstrap, mirrored, [(None, b"x")], timeout=10, **conf,
                        **{"enable.idempotence": False, "retries": 0})
    assert e.value.args[0].code() == POLICY_VIOLATION
    j = _java(pki, tmp_path, mg.guard_bootstrap, mirrored, "produce-one")
    assert j.get("error") == "PolicyViolationException" and "s-to-d" in j.get("message", ""), j
    assert high_watermark(kssl.bootstrap, mirrored) == 5
    got = harness.consume_assign(mg.guard_bootstrap, mirrored, count=5, **conf)
    assert [m.value() for m in got] == [b"m%d" % i for i in range(5)]
    # The state store wrote __mirror_state through TLS.
    assert mg.metrics().sum("mirrorguard_state_store_ops_total", kind="append") >= 1


def test_seal_over_tls_with_source_killed(tmp_path, kssl, pki, mirror_factory):
    """The disaster seal with TLS everywhere: the source is an SSL cluster of its own
    (killed), the state/destination cluster is reached over mTLS, the fetcher reaches
    mirrorguard over mTLS and keeps being served locally after the source died."""
    src = KafkaCluster(tmp_path / "src", nodes=1, name="src-ssl", ssl=pki.ca_dir).start()
    child = None
    try:
        topic = topic_name("tls-seal")
        create_topics(src.bootstrap, [topic])
        create_topics(kssl.bootstrap, [topic])
        spec = MirrorSpec("a-to-b", src.ssl_bootstrap, node_ids=src.node_ids,
                          extra=f"tls = {pki.server_tls()}\nsource_tls = {pki.client_tls()}\n{FETCHER}"
                                "upstream_request_timeout_ms = 2000\n")
        mg = mirror_factory(kssl.ssl_bootstrap, [spec],
                            extra_config=f"[state.tls]\nca = \"{pki.ca}\"\ncert = \"{pki.upstream[0]}\"\n"
                                         f"key = \"{pki.upstream[1]}\"\n")
        child = subprocess.Popen([sys.executable, "-c", OPEN_TXN, src.bootstrap, topic],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "open"
        hw = high_watermark(src.bootstrap, topic)
        with tls_rawkafka(pki.context()):
            f = StandInFetcher(topic, version=13).connect(spec.bootstrap)
        f.catch_up(hw)
        open_pid = [b for b in f.log if b.kind == "data"][-1].producer_id
        from test_disaster_failover import _wait_topology

        _wait_topology(kssl.bootstrap, "a-to-b", topic, mg.state_topic)

        src.nodes[0].kill()
        res, got = f.fetch_once(max_wait_ms=300)
        assert got == [] and res.error_code == 0
        with tls_rawkafka(pki.context()):  # a new TLS connection, answered locally
            f.connect(spec.bootstrap)
        status, body = mg.post("stop", "a-to-b", topic, [0])
        assert status == 200, body
        f.follow(lambda s: any(b.kind == "barrier" for b in s.log), 20, "barrier appended")
        f.follow(lambda s: (mg.partition(topic, 0) or {}).get("state") == "STOPPED", 20, "STOPPED")
        tail = [b for b in f.log if b.kind in ("abort", "barrier")]
        assert [b.kind for b in tail] == ["abort", "barrier"]
        assert tail[0].producer_id == open_pid and tail[0].base_offset == hw
        f.close()
    finally:
        if child is not None:
            child.kill()
            child.wait(5)
        src.stop()


def test_admin_endpoint_over_https(tmp_path, kssl, pki):
    """[admin.tls]: health, readiness and metrics over HTTPS; plain HTTP on that port is
    refused and counted under listener="admin"."""
    p = harness.Proxy(tmp_path, [kssl.bootstrap], node_ids=kssl.node_ids, name="mg-https", log_level="info")
    with p.config_path.open("a") as f:
        f.write(f'[admin.tls]\ncert = "{pki.server[0]}"\nkey = "{pki.server[1]}"\n')
    p.proc = harness.ManagedProcess(p.name, [harness.MIRRORGUARD_BIN, "run", "--config", p.config_path], p.log_path)
    url = f"https://{HOST}:{p.ports.admin}"
    ctx = ssl.create_default_context(cafile=str(pki.ca))

    def get(path: str) -> tuple[int, str]:
        with urllib.request.urlopen(url + path, timeout=3, context=ctx) as r:
            return r.status, r.read().decode()

    def ready():
        assert p.proc.alive(), p.proc.log_text()
        try:
            return get("/readyz")[0] == 200
        except OSError:
            return False

    try:
        wait_until(ready, 20, what="/readyz over HTTPS")
        with pytest.raises(OSError):
            harness.http_get(f"http://{HOST}:{p.ports.admin}/healthz", timeout=3)
        status, text = get("/metrics")
        assert status == 200
        m = harness.Metrics(harness.parse_prometheus(text))
        assert m.sum("mirrorguard_tls_handshake_errors_total", listener="admin", kind="plaintext") == 1
    finally:
        assert p.terminate() == 0


def test_kafka_engine_fetcher_over_mtls(kssl, pki, mirror_factory, kafka_dest_factory):  # noqa: F811
    """The reference destination's fetcher (Kafka's FetchSessionHandler, SSLSocket with
    hostname verification and a client certificate) mirrors through a mirror listener that
    requires mTLS, from a source reached over mTLS: the destination's Kafka engine appends
    the region-mapped batches. A stop then seals the partition on mirrorguard's default rule:
    STOPPED once the destination's high watermark (the stand-in's listener, plaintext: it
    is the destination cluster here, `destination_bootstrap`) passed the barrier."""
    if not kafka_dest.available():
        pytest.fail("reference destination missing: run scripts/install-test-deps.sh", pytrace=False)
    topic = topic_name("tls-dest")
    create_topics(kssl.bootstrap, [topic])
    harness.produce(kssl.bootstrap, topic, [(None, b"d%d" % i) for i in range(6)], **{"enable.idempotence": True})
    dest = kafka_dest_factory("tls-dest")
    dest.open(topic)
    # The stand-in's listener speaks plaintext: it is the destination cluster (topic ids,
    # the high watermark), so [state.tls] does not apply toward it.
    listener = kafka_dest.dest_hw_bootstrap(dest)
    spec = MirrorSpec("s-to-d", kssl.ssl_bootstrap, node_ids=kssl.node_ids, destination_bootstrap=listener,
                      destination_hw=listener,
                      extra=f"tls = {pki.server_tls()}\nsource_tls = {pki.client_tls()}\n{FETCHER}")
    mg = mirror_factory(kssl.ssl_bootstrap, [spec],
                        extra_config=f"[state.tls]\nca = \"{pki.ca}\"\ncert = \"{pki.upstream[0]}\"\n"
                                     f"key = \"{pki.upstream[1]}\"\n")
    mg.wait_sources_known()
    cert, key = pki.app
    f = dest.mirror("s-to-d", spec.bootstrap, [(topic, 0)], tls_ca=str(pki.ca), tls_cert=str(cert),
                    tls_key=str(key))
    report = f.catch_up(topic, 6)
    assert not report["errors"], report
    st = dest.state(topic)
    assert st["log_end_offset"] == 6
    src_pid = mirror_harness.direct_batches(kssl.bootstrap, topic)[0].producer_id
    assert list(st["producers"]) == [mirror_harness.map_pid(src_pid, mirror_harness.fold(kssl.cluster_id))]
    assert [v for _, v in dest.values(topic)] == [b"d%d" % i for i in range(6)]
    status, body = mg.post("stop", "s-to-d", topic, [0])
    assert status == 200, body
    harness.wait_until(lambda: mg.partition(topic, 0)["state"] == "STOPPED", 30, interval=0.05,
                       what="partition STOPPED")
    view = mg.partition(topic, 0)
    assert (view["cut"], view["seal_batches"]) == (6, 1), view  # the barrier alone
    st = dest.state(topic)
    assert st["high_watermark"] == st["log_end_offset"] == 7, st
    assert [b["kind"] for b in dest.batches(topic)][-1] == "TYPE_7", dest.batches(topic)
    f.stop()


def test_upstream_hostname_is_verified(tmp_path, kssl, pki):
    """Kafka's certificate names 127.0.0.1 and localhost: with another name to verify
    (`server_name`), every upstream connection is refused (counted as tls_handshake), and
    `insecure_skip_hostname_verification` (chain still checked) lets it through."""
    cert, key = pki.upstream
    wrong = f'{{ ca = "{pki.ca}", cert = "{cert}", key = "{key}", server_name = "kafka.invalid" }}'
    p = _proxy(tmp_path, kssl, pki, "mg-wrong-name", pki.server_tls(client_ca=False), upstream_tls=wrong)
    p.start(wait_ready=False)
    try:
        c = rawkafka_tls(pki.context(), HOST, p.ports.bootstrap)
        with pytest.raises((rawkafka.ProtocolError, OSError)):
            rawkafka.api_versions(c)  # closed: the upstream cannot be reached
        c.close()
        wait_until(lambda: p.metrics().sum("mirrorguard_upstream_errors_total", kind="tls_handshake") >= 1, 10,
                   what="upstream TLS failure counted")
        assert p.readyz() != 200
        assert 'not valid for name "kafka.invalid"' in p.log_path.read_text(errors="replace")
    finally:
        assert p.terminate() == 0
    skip = wrong.replace(" }", ", insecure_skip_hostname_verification = true }")
    p = _proxy(tmp_path, kssl, pki, "mg-skip-name", pki.server_tls(client_ca=False), upstream_tls=skip).start()
    try:
        c = rawkafka_tls(pki.context(), HOST, p.ports.bootstrap)
        assert rawkafka.API_FETCH in rawkafka.api_versions(c)
        c.close()
    finally:
        assert p.terminate() == 0
