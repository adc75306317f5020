"""Least privilege on every listener (issue 30, SPEC 5): each attack of the issue's "Why" 1-5
run as a client would, against Apache Kafka 4.4 with an authorizer.

The source (``ksec``) runs ``StandardAuthorizer``: its PLAINTEXT listener (ANONYMOUS, a super
user) is the test's own back door; on its SASL_PLAINTEXT and SSL listeners mirrorguard's
principals (``User:mg`` by SCRAM, ``User:CN=mirrorguard-client`` by certificate) are given far
more than a fetcher needs (every operation on every topic and on the cluster), so an identity
mirrorguard lends to someone else shows as a privilege gap: a write on the source.

1. A ``[[mirror]]`` listener forwarded any API as mirrorguard: an anonymous Produce v8 was
   appended at the source and CreateTopics created a topic. Now only the documented list of
   read APIs passes; the rest is refused in the API's own shape (and counted), while the
   stand-in fetcher and a librdkafka assign() reader read as before.
2. A mirror listener off loopback without client authentication started; now start-up is
   refused naming the settings. With ``listener_sasl`` only ``fetcher_principals`` move a seal:
   another authenticated user on the fetcher ports no longer completes one.
3. A ``[[listener]]`` with an upstream client certificate lent it to anonymous clients (a
   Produce appended as ``User:CN=mirrorguard-client``); now it must require client
   certificates (``client_ca``) or say ``upstream_identity = "shared"``.
4. Before authentication a mirror listener opened and authenticated an upstream connection
   per client (amplification), and any listener held announced frames whole: 1,000 anonymous
   connections from 127.0.0.0/8 announcing 100 MiB each took the RSS far past 100 MB. Now
   nothing is opened upstream before authentication and the buffered bytes have a budget,
   while the fetcher keeps fetching.
5. A destination reached without TLS got ``[state.sasl]``'s password (PLAIN) in cleartext;
   now start-up refuses it.

``MG_SECURITY_BASELINE=1`` leaves out the settings the fix introduced, so the module can be
run against a binary from before it (``MIRRORGUARD_BIN=...``): every test then fails on the
attack succeeding.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, ResourcePatternType,
                                   ResourceType)

import harness
import rawkafka
from harness import HOST, HarnessError, Proxy, create_topics, topic_name, wait_until
from kafka_broker import KafkaCluster, kafka_available
from kafka_dest import data_batch
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    StandInFetcher,
    high_watermark,
    mirror_factory,
)
from secure_clients import FETCHER_PW, Pki, SaslStandIn, sasl_authenticate, upstream_sasl

pytestmark = pytest.mark.skipif(not kafka_available() or not shutil.which("openssl"),
                                reason="needs Apache Kafka 4.4 (.tools/kafka) and openssl")

BASELINE = os.environ.get("MG_SECURITY_BASELINE") == "1"
USERS = {"alice": "alice-secret", "mg": "mg-secret"}
READER_PW = "reader-secret"
TOPIC_AUTHORIZATION_FAILED = 29
MIB = 1024 * 1024
# What a mirror listener advertises (README, "Security"): the reads of a fetcher and of an
# assign() reader, SASL where the listener terminates it, and Produce and FindCoordinator,
# refused but listed because librdkafka enables its message formats from them.
MIRROR_APIS = {0, 1, 2, 3, 10, 17, 18, 23, 36, 60}


def new_setting(line: str) -> str:
    """A setting the fix introduced: left out of baseline runs (an older binary refuses it)."""
    return "" if BASELINE else line


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def ksec(tmp_path_factory, pki):
    """Kafka 4.4 with StandardAuthorizer; mirrorguard's principals may do anything."""
    c = KafkaCluster(tmp_path_factory.mktemp("ksec"), name="ksec", sasl=USERS, ssl=pki.ca_dir, overrides={
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",
        "allow.everyone.if.no.acl.found": "false",
    })
    c.start()
    grants = []
    for principal in ("User:mg", "User:CN=mirrorguard-client", "User:alice", "User:CN=app"):
        grants += [AclBinding(ResourceType.TOPIC, "*", ResourcePatternType.LITERAL, principal, "*",
                              AclOperation.ALL, AclPermissionType.ALLOW),
                   AclBinding(ResourceType.GROUP, "*", ResourcePatternType.LITERAL, principal, "*",
                              AclOperation.ALL, AclPermissionType.ALLOW)]
    grants += [AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, p, "*",
                          AclOperation.ALL, AclPermissionType.ALLOW)
               for p in ("User:mg", "User:CN=mirrorguard-client")]
    a = harness.admin(c.bootstrap)
    for f in a.create_acls(grants, request_timeout=20).values():
        f.result()
    yield c
    harness.close_clients()
    c.stop()


def source_spec(ksec, name: str = "sec", extra: str = "") -> MirrorSpec:
    """A mirror of `ksec` whose upstream connections authenticate as `mg` (SCRAM)."""
    return MirrorSpec(name, ksec.sasl_bootstrap, node_ids=list(ksec.node_ids), extra="\n".join([
        f"source_sasl = {upstream_sasl('mg', 'SCRAM-SHA-512', password_env='MG_SEC_SOURCE_PW')}",
        "upstream_request_timeout_ms = 3000",
        extra,
    ]))


@pytest.fixture(autouse=True)
def _source_password(monkeypatch):
    monkeypatch.setenv("MG_SEC_SOURCE_PW", USERS["mg"])


def produce_v8(conn: rawkafka.Connection, topic: str, values: list[bytes]) -> int:
    """One Produce v8 (acks=-1) of a plain batch; the partition's error code."""
    records = data_batch(values)
    body = (rawkafka.string(None) + rawkafka.i16(-1) + rawkafka.i32(10000)
            + rawkafka.array([rawkafka.string(topic) + rawkafka.array([rawkafka.i32(0) + rawkafka.i32(len(records))
                                                                       + records])]))
    r = rawkafka.Reader(conn.request(0, 8, body))
    code = None
    for _ in range(r.count()):
        name = r.string()
        for _ in range(r.count()):
            idx, err = r.i32(), r.i16()
            r.i64(), r.i64(), r.i64()  # base offset, log append time, log start offset
            for _ in range(r.count()):  # record errors
                r.i32(), r.string()
            r.string()  # error message
            if name == topic and idx == 0:
                code = err
    assert code is not None, "partition missing from the Produce response"
    return code


def create_topics_v4(conn: rawkafka.Connection, topic: str) -> int:
    """CreateTopics v4 for one topic (1 partition, replication 1); its error code."""
    body = (rawkafka.array([rawkafka.string(topic) + rawkafka.i32(1) + rawkafka.i16(1) + rawkafka.array([])
                            + rawkafka.array([])]) + rawkafka.i32(10000) + rawkafka.i8(0))
    r = rawkafka.Reader(conn.request(19, 4, body))
    r.i32()
    for _ in range(r.count()):
        name, code, _msg = r.string(), r.i16(), r.string()
        if name == topic:
            return code
    raise AssertionError("topic missing from the CreateTopics response")


def topics_of(bootstrap: str) -> set[str]:
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    with rawkafka.Connection(host, int(port)) as c:
        return set(rawkafka.metadata_v1(c, None).topics)


def test_mirror_listener_refuses_writes_and_admin_as_mirrorguard(ksec, kafka1, mirror_factory):
    """"Why" 1: anonymous Produce v8 and CreateTopics through a mirror listener on loopback."""
    topic, created = topic_name("sec"), topic_name("sec-new")
    create_topics(ksec.bootstrap, [topic])
    create_topics(kafka1.bootstrap, [topic])
    harness.produce(ksec.bootstrap, topic, [(None, b"r-%d" % i) for i in range(3)])
    spec = source_spec(ksec)
    mg = mirror_factory(kafka1.bootstrap, [spec])
    mg.wait_sources_known()
    with rawkafka.Connection(HOST, spec.bootstrap_port) as c:
        advertised = set(rawkafka.api_versions(c))
        produced = produce_v8(c, topic, [b"intruder"])
        create = create_topics_v4(c, created)
    print(f"Produce v8 through the mirror listener: error {produced}; CreateTopics: error {create}; "
          f"source log end {high_watermark(ksec.bootstrap, topic)}; advertised {sorted(advertised)}")
    assert high_watermark(ksec.bootstrap, topic) == 3, "the anonymous Produce reached the source"
    assert created not in topics_of(ksec.bootstrap), "CreateTopics created a topic on the source"
    assert produced == TOPIC_AUTHORIZATION_FAILED and create == TOPIC_AUTHORIZATION_FAILED
    assert advertised <= MIRROR_APIS and {1, 2, 3, 18, 23} <= advertised, sorted(advertised)
    m = mg.metrics()
    # spec.bootstrap is the fetcher's listener ("sec-fetcher"): the refusal counts there.
    assert m.sum("mirrorguard_mirror_refused_total", listener="sec-fetcher", api="Produce") == 1, m
    assert m.sum("mirrorguard_mirror_refused_total", listener="sec-fetcher", api="CreateTopics") == 1, m
    assert "refused on a mirror listener" in mg.log_text()
    # The legitimate readers: the stand-in fetcher, and librdkafka with assign().
    f = StandInFetcher(topic, version=12).connect(spec.bootstrap)
    f.catch_up(3)
    assert {b.kind for b in f.log} == {"data"}
    f.close()
    got = harness.consume_assign(spec.bootstrap, topic, count=3, **{"group.id": "sec-reader"})
    assert [x.value() for x in got] == [b"r-%d" % i for i in range(3)]


def test_mirror_listener_off_loopback_requires_authentication(ksec, kafka1, mirror_factory):
    """"Why" 1: a mirror listener bound to every interface, for anyone."""
    spec = source_spec(ksec, "wide")
    mg = mirror_factory(kafka1.bootstrap, [spec], start=False)
    text = mg.config_path.read_text()
    text = text.replace(f'bootstrap = "{spec.bootstrap}"', f'bootstrap = "0.0.0.0:{spec.bootstrap_port}"')
    text = text.replace(f'listen_host = "{HOST}"', 'listen_host = "0.0.0.0"', 1)
    mg.config_path.write_text(text)
    with pytest.raises(HarnessError) as e:
        mg.start(timeout=15)
        with rawkafka.Connection(HOST, spec.bootstrap_port) as c:
            print("anonymous Metadata through 0.0.0.0 lists", len(rawkafka.metadata_v1(c, None).topics), "topics")
    assert "listener_sasl" in str(e.value) and "client_ca" in str(e.value), str(e.value)[-2000:]


def credentials(path: Path, users: dict[str, str]) -> None:
    lines = []
    for user, pw in users.items():
        for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            r = subprocess.run([harness.MIRRORGUARD_BIN, "sasl-credential", "--user", user, "--mechanism", mech],
                               input=pw + "\n", capture_output=True, text=True, timeout=30, check=True)
            lines.append(r.stdout.strip())
    path.write_text("\n".join(lines) + "\n")


def test_only_fetcher_principals_move_a_seal(ksec, kafka1, mirror_factory, tmp_path):
    """"Why" 1: with listener_sasl every credential was equal; another user on the fetcher
    ports took the cut and completed the seal."""
    topic = topic_name("sec-seal")
    create_topics(ksec.bootstrap, [topic])
    create_topics(kafka1.bootstrap, [topic])
    harness.produce(ksec.bootstrap, topic, [(None, b"s-%d" % i) for i in range(3)])
    creds = tmp_path / "listener.creds"
    credentials(creds, {"fetcher": FETCHER_PW, "reader": READER_PW})
    spec = source_spec(ksec, "seal", extra="\n".join([
        f'listener_sasl = {{ credentials_file = "{creds}", mechanisms = ["SCRAM-SHA-256"] }}',
        new_setting('fetcher_principals = ["User:fetcher"]'),
    ]))
    mg = mirror_factory(kafka1.bootstrap, [spec])
    mg.wait_sources_known()
    fetcher_bootstrap = spec.bootstrap  # the harness gives every mirror fetcher ports
    # The fetcher is where the source is; then another user fetches on the same ports.
    fetcher = SaslStandIn(topic, version=12).connect(fetcher_bootstrap)
    fetcher.catch_up(3)
    reader = SaslStandIn(topic, version=12, user="reader", password=READER_PW).connect(fetcher_bootstrap)
    reader.catch_up(3)
    status, body = mg.post("stop", "seal", topic, [0])
    assert status == 200, body
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        reader.fetch_once(max_wait_ms=100)
    state = (mg.partition(topic, 0) or {}).get("state")
    print(f"after 6 s of fetches by User:reader on the fetcher ports: {state}; reader log "
          f"{[b.kind for b in reader.log]}")
    assert state == "STOPPING", "a principal that is not the fetcher moved the seal"
    assert {b.kind for b in reader.log} == {"data"}
    reader.close()
    fetcher.follow(lambda s: (mg.partition(topic, 0) or {}).get("state") == "STOPPED", 20, "STOPPED")
    kinds = [b.kind for b in fetcher.log]
    assert kinds[-1] == "barrier" and set(kinds[:-1]) == {"data"}, kinds
    fetcher.close()
    assert "user=reader" in mg.log_text()


def test_upstream_certificate_is_not_lent_to_anonymous_clients(ksec, pki, tmp_path):
    """"Why" 2: a [[listener]] presenting mirrorguard's client certificate to Kafka's mTLS
    listener for whoever connects."""
    topic = topic_name("sec-cert")
    create_topics(ksec.bootstrap, [topic])
    p = Proxy(tmp_path, [ksec.ssl_bootstrap], node_ids=ksec.node_ids, name="lender")
    with p.config_path.open("a") as f:
        f.write(f"upstream_tls = {pki.client_tls()}\n")
    started = True
    try:
        p.start()
    except HarnessError as e:
        started, why = False, str(e)
    if started:
        try:
            with rawkafka.Connection(HOST, p.ports.bootstrap) as c:
                produced = produce_v8(c, topic, [b"as-mirrorguard"])
            print(f"anonymous Produce through the listener: error {produced}; "
                  f"log end {high_watermark(ksec.bootstrap, topic)}")
        finally:
            p.terminate()
        pytest.fail("a listener lent its upstream certificate to anonymous clients")
    assert "upstream_identity" in why and "client_ca" in why, why[-2000:]
    # Requiring client certificates: an application with its own certificate produces, a
    # client without one is refused at the handshake.
    p = Proxy(tmp_path, [ksec.ssl_bootstrap], node_ids=ksec.node_ids, name="mtls")
    with p.config_path.open("a") as f:
        f.write(f"tls = {pki.server_tls(client_ca=True)}\nupstream_tls = {pki.client_tls()}\n")
    p.start()
    try:
        harness.produce(p.bootstrap, topic, [(None, b"app")], **pki.rdkafka())
        assert high_watermark(ksec.bootstrap, topic) == 1
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        with pytest.raises((ssl.SSLError, OSError, rawkafka.ProtocolError)):
            with socket.create_connection((HOST, p.ports.bootstrap), timeout=5) as s:
                with ctx.wrap_socket(s, server_hostname=HOST) as t:
                    t.sendall(struct.pack(">i", 10) + b"\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff")
                    if not t.recv(4):
                        raise rawkafka.ProtocolError("closed")
        assert high_watermark(ksec.bootstrap, topic) == 1
    finally:
        harness.close_clients()
        assert p.terminate() == 0
    # Sharing on purpose starts, with a warning.
    p = Proxy(tmp_path, [ksec.ssl_bootstrap], node_ids=ksec.node_ids, name="shared")
    with p.config_path.open("a") as f:
        f.write(f'upstream_tls = {pki.client_tls()}\nupstream_identity = "shared"\n')
    p.start()
    assert p.terminate() == 0
    assert "upstream_identity = \"shared\"" in p.log_path.read_text()


def upstream_connections(pid: int, port: int) -> int:
    """Established TCP connections of process `pid` to local port `port`."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    n = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[3] == "01" and int(f[2].split(":")[1], 16) == port and f[9] in inodes:
            n += 1
    return n


def api_versions_frame() -> bytes:
    body = struct.pack(">hhi", 18, 0, 1) + struct.pack(">h", 3) + b"sec"
    return struct.pack(">i", len(body)) + body


def test_nothing_upstream_before_authentication(ksec, kafka1, mirror_factory, tmp_path):
    """"Why" 4: every connection to a mirror listener with listener_sasl cost a TCP and SCRAM
    session on the source before the client had authenticated."""
    topic = topic_name("sec-amp")
    create_topics(ksec.bootstrap, [topic])
    create_topics(kafka1.bootstrap, [topic])
    creds = tmp_path / "listener.creds"
    credentials(creds, {"fetcher": FETCHER_PW})
    spec = source_spec(ksec, "amp", extra="\n".join([
        f'listener_sasl = {{ credentials_file = "{creds}", mechanisms = ["SCRAM-SHA-256"] }}',
        new_setting('fetcher_principals = ["User:fetcher"]'),
    ]))
    mg = mirror_factory(kafka1.bootstrap, [spec], metadata_refresh_ms=60000)
    mg.wait_sources_known()
    sasl_port = ksec.nodes[0].sasl_port
    idle = []
    try:
        for _ in range(30):
            s = socket.create_connection((HOST, spec.bootstrap_port), timeout=5)
            s.sendall(api_versions_frame())
            size = struct.unpack(">i", s.recv(4))[0]
            body = b""
            while len(body) < size:
                body += s.recv(size - len(body))
            idle.append(s)
        time.sleep(0.5)
        held = upstream_connections(mg.proc.pid, sasl_port)
        print(f"30 unauthenticated clients (ApiVersions answered): {held} upstream connections to the source")
        assert held <= 2, f"{held} upstream connections opened for unauthenticated clients"
        # The ApiVersions answered before authentication lists the source's read APIs.
        keys = {struct.unpack(">h", body[10 + 6 * i:12 + 6 * i])[0] for i in range(struct.unpack(">i", body[6:10])[0])}
        assert {1, 2, 3, 17, 36} <= keys and not keys & {19, 20, 21, 22}, sorted(keys)
    finally:
        for s in idle:
            s.close()
    # An authenticated fetcher reads as before.
    f = SaslStandIn(topic, version=12).connect(spec.bootstrap)
    harness.produce(ksec.bootstrap, topic, [(None, b"a")])
    f.catch_up(1)
    f.close()


def rss_kb(pid: int, field: str = "VmHWM") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def flood(port: int, n: int, body: int, deadline: float) -> tuple[int, int, list]:
    """`n` connections from 127.0.0.0/8 addresses, each announcing a 100 MiB frame and
    sending `body` bytes of it; returns (connected, bytes sent, the sockets). Bounded by `deadline`."""
    socks, sent = [], 0
    piece = b"\x00\x01\x00\x0c" + b"\x00" * (64 * 1024 - 4)  # Fetch v12-ish head, then zeros
    for i in range(n):
        if time.monotonic() > deadline:
            break
        s = socket.socket()
        s.bind((f"127.{1 + i // 60000}.{(i // 250) % 240 + 1}.{i % 250 + 2}", 0))
        s.settimeout(1.0)
        try:
            s.connect((HOST, port))
            s.sendall(struct.pack(">i", 100 * MIB))
        except OSError:
            s.close()
            continue
        socks.append(s)
    for s in socks:
        s.setblocking(False)
    left = {id(s): body for s in socks}
    while left and time.monotonic() < deadline:
        for s in socks:
            k = left.get(id(s))
            if not k:
                continue
            try:
                m = s.send(piece[:min(k, len(piece))])
                sent += m
                left[id(s)] = k - m
            except BlockingIOError:
                continue
            except OSError:
                left.pop(id(s), None)
        time.sleep(0.01)
    return len(socks), sent, socks


def test_flood_of_large_announced_frames_stays_bounded(ksec, kafka1, mirror_factory):
    """"Why" 3: 1,000 anonymous connections from 127.0.0.0/8, each announcing 100 MiB and
    sending 384 KiB of it, while the stand-in fetcher keeps fetching."""
    topic = topic_name("sec-flood")
    create_topics(ksec.bootstrap, [topic])
    create_topics(kafka1.bootstrap, [topic])
    spec = source_spec(ksec, "flood")
    mg = mirror_factory(kafka1.bootstrap, [spec])
    mg.wait_sources_known()
    base = rss_kb(mg.proc.pid, "VmRSS")
    f = StandInFetcher(topic, version=12).connect(spec.bootstrap)
    stop = threading.Event()
    fetched: list[int] = []

    def fetch_loop():
        while not stop.is_set():
            try:
                f.fetch_once(max_wait_ms=100)
                fetched.append(f.leo)
            except Exception as e:  # noqa: BLE001 - reported below
                fetched.append(-1)
                print("fetcher:", e)
                return

    t = threading.Thread(target=fetch_loop, daemon=True)
    t.start()
    socks = []
    try:
        connected, sent, socks = flood(spec.bootstrap_port, 1000, 384 * 1024, time.monotonic() + 25)
        harness.produce(ksec.bootstrap, topic, [(None, b"during-%d" % i) for i in range(5)])
        wait_until(lambda: f.leo == 5 or -1 in fetched, 15, interval=0.1, what="fetcher caught up during the flood")
        hwm = rss_kb(mg.proc.pid)
        print(f"flood: {connected} connections, {sent // MIB} MiB sent; mirrorguard RSS {base // 1024} MB before, "
              f"peak {hwm // 1024} MB; fetcher at {f.leo}")
    finally:
        stop.set()
        t.join(10)
        for s in socks:
            s.close()
    assert -1 not in fetched and f.leo == 5
    assert connected >= 900, connected
    assert hwm < 100 * 1024, f"RSS peaked at {hwm // 1024} MB"
    f.close()


class CapturingBroker:
    """A TCP listener that answers SaslHandshake like a broker offering PLAIN and keeps every
    byte it is sent (what a host on the path would see)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind((HOST, harness.free_port(set())))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.seen = b""
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.done.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            c.settimeout(2)
            try:
                while True:
                    size = struct.unpack(">i", c.recv(4))[0]
                    req = b""
                    while len(req) < size:
                        req += c.recv(size - len(req))
                    self.seen += req
                    api, corr = struct.unpack(">hxxi", req[:8])
                    if api == 17:
                        resp = struct.pack(">ihi", corr, 0, 1) + struct.pack(">h", 5) + b"PLAIN"
                    elif api == 36:
                        resp = struct.pack(">ihhiq", corr, 0, -1, 0, 0)
                    else:
                        break
                    c.sendall(struct.pack(">i", len(resp)) + resp)
            except (OSError, struct.error):
                pass
            finally:
                c.close()

    def close(self):
        self.done.set()
        self.thread.join(5)
        self.sock.close()


def test_state_credentials_never_go_to_the_destination_in_cleartext(ksec, pki, tmp_path, monkeypatch):
    """"Why" 5: `destination_bootstrap` without `destination_tls` reached the destination in
    plaintext with `[state.sasl]`'s PLAIN password."""
    monkeypatch.setenv("MG_SEC_STATE_PW", USERS["mg"])
    dest = CapturingBroker()
    ports = {harness.free_port({dest.port})}
    bs = ports.pop()
    cfg = tmp_path / "cleartext.toml"
    cfg.write_text(f"""[admin]
listen = "{HOST}:{harness.free_port({dest.port, bs})}"
[state]
bootstrap = ["{ksec.nodes[0].sasl_ssl_bootstrap}"]
topic = "__mirror_state_sec"
production = false
allow_source_cluster = true
[state.tls]
ca = "{pki.ca}"
[state.sasl]
mechanism = "PLAIN"
username = "mg"
password_env = "MG_SEC_STATE_PW"
[[mirror]]
name = "clear"
bootstrap = "{HOST}:{bs}"
node_port_base = {harness.free_node_port_base({dest.port, bs}, nodes=ksec.node_ids)}
source_bootstrap = ["{ksec.bootstrap}"]
destination_bootstrap = ["{HOST}:{dest.port}"]
{new_setting('stopped_when = "fetcher_offset"')}
{new_setting('fetcher_identity = "any-reader"')}
""")
    proc = subprocess.Popen([harness.MIRRORGUARD_BIN, "run", "--config", cfg], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "NO_COLOR": "1"})
    try:
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.terminate()
            out, _ = proc.communicate(timeout=10)
    finally:
        dest.close()
    leaked = USERS["mg"].encode() in dest.seen
    print(f"mirrorguard exit {proc.returncode}; the password reached the cleartext destination: {leaked}")
    assert not leaked, "[state.sasl]'s password crossed a cleartext connection"
    assert proc.returncode not in (0, None) and "destination_tls" in out, out[-3000:]


def test_listener_sessions_expire_and_clients_reauthenticate(ksec, kafka1, mirror_factory, tmp_path):
    """Item 7 (SASL): a mirror listener's sessions expire (KIP-368). librdkafka
    re-authenticates in place and keeps reading; a client that does not is closed at its
    next request after the session's end."""
    topic = topic_name("sec-reauth")
    create_topics(ksec.bootstrap, [topic])
    create_topics(kafka1.bootstrap, [topic])
    creds = tmp_path / "listener.creds"
    credentials(creds, {"fetcher": FETCHER_PW})
    spec = source_spec(ksec, "reauth", extra="\n".join([
        f'listener_sasl = {{ credentials_file = "{creds}", mechanisms = ["SCRAM-SHA-256"]'
        + new_setting(", session_lifetime_ms = 3000") + " }",
        new_setting('fetcher_principals = ["User:fetcher"]'),
    ]))
    mg = mirror_factory(kafka1.bootstrap, [spec])
    mg.wait_sources_known()
    raw = rawkafka.Connection(HOST, spec.bootstrap_port)
    sasl_authenticate(raw, "fetcher", FETCHER_PW)
    rawkafka.metadata_v1(raw, [topic])
    conf = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": "fetcher", "sasl.password": FETCHER_PW, "group.id": "reauth",
            "enable.auto.commit": False, "fetch.wait.max.ms": 100}
    c = harness.new_consumer(spec.bootstrap, **conf)
    c.assign([harness.TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    t0 = time.monotonic()
    for i in range(8):
        harness.produce(ksec.bootstrap, topic, [(None, b"r-%d" % i)])
        deadline = time.monotonic() + 5
        while len(got) <= i and time.monotonic() < deadline:
            for m in c.consume(1, 0.2):
                assert not m.error(), m.error()
                got.append(m.value())
        time.sleep(0.6)
    elapsed = time.monotonic() - t0
    assert got == [b"r-%d" % i for i in range(8)], got
    expired = True
    try:
        rawkafka.metadata_v1(raw, [topic])
        expired = False
    except (OSError, rawkafka.ProtocolError):
        pass
    raw.close()
    m = mg.metrics()
    # spec.bootstrap is the fetcher's listener ("reauth-fetcher").
    ok = m.sum("mirrorguard_client_authentications_total", listener="reauth-fetcher", kind="ok")
    print(f"librdkafka read 8 records over {elapsed:.1f}s of 3 s sessions; authentications ok {ok}; "
          f"raw client without re-authentication closed: {expired}")
    assert expired, "a session that never expires"
    assert m.sum("mirrorguard_client_authentications_total", listener="reauth-fetcher", kind="expired") >= 1
    assert ok >= 4, ok  # the raw client, librdkafka's two connections, and re-authentications
    assert "client re-authenticated" in mg.log_text(), "librdkafka reconnected instead"
