"""Client-side helpers shared by the TLS, SASL and SASL_SSL tests (issue 16).

- SASL: the test users, librdkafka settings (``sasl_conf``), mirrorguard's own identity as
  TOML (``upstream_sasl``), a mirror listener's credential file (``credential_file``), an
  independent Python SCRAM client (``sasl_authenticate``) and the stand-in fetcher that
  authenticates every connection it opens (``SaslStandIn``); ``roundtrip`` (idempotent
  produce, then read back) and ``auth_error`` (a client's first error).
- TLS: the test's certificates (``Pki``), rawkafka connections over TLS (``rawkafka_tls``,
  ``tls_rawkafka`` for code that opens its own connections, like the stand-in fetcher).
- ``OPEN_TXN``: a transactional producer left with an open transaction (the seal tests).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import hmac
import os
import ssl
import subprocess
import time

from confluent_kafka import KafkaError, Producer

import harness
import mirror_harness
import rawkafka
from kafka_broker import CertAuthority
from mirror_harness import StandInFetcher

USERS = {"alice": "alice-secret", "mg": "mg-secret"}
FETCHER_PW = "fetcher-secret"


def sasl_conf(mechanism: str, user: str = "alice", password: str | None = None,
              protocol: str = "SASL_PLAINTEXT") -> dict:
    """librdkafka settings for `user` (SASL_SSL: add the TLS settings too)."""
    if mechanism == "OAUTHBEARER":
        return {"security.protocol": protocol, "sasl.mechanism": mechanism,
                "enable.sasl.oauthbearer.unsecure.jwt": True, "sasl.oauthbearer.config": f"principal={user}"}
    return {"security.protocol": protocol, "sasl.mechanism": mechanism, "sasl.username": user,
            "sasl.password": USERS.get(user, "") if password is None else password}


def upstream_sasl(user: str, mechanism: str, password_file=None, password_env=None) -> str:
    """mirrorguard's own SASL identity, as an inline TOML table."""
    secret = f'password_file = "{password_file}"' if password_file else f'password_env = "{password_env}"'
    return f'{{ mechanism = "{mechanism}", username = "{user}", {secret} }}'


def roundtrip(bootstrap: str, topic: str, conf: dict, n: int = 3) -> list[bytes]:
    """Idempotent produce of n records, then read them back (assign, no group)."""
    harness.produce(bootstrap, topic, [(None, b"%s-%d" % (topic.encode(), i)) for i in range(n)],
                    **{"enable.idempotence": True, **conf})
    return [m.value() for m in harness.consume_assign(bootstrap, topic, count=n, **conf)]


def auth_error(bootstrap: str, conf: dict, timeout: float = 15.0) -> KafkaError:
    """The first error a librdkafka client reports while connecting."""
    errors: list[KafkaError] = []
    p = Producer({"bootstrap.servers": bootstrap, "error_cb": errors.append, **conf})
    deadline = time.monotonic() + timeout
    while not errors and time.monotonic() < deadline:
        p.poll(0.2)
    assert errors, "no error reported"
    return errors[0]


class AuthFailed(Exception):
    pass


def sasl_authenticate(conn: rawkafka.Connection, user: str, password: str,
                      mechanism: str = "SCRAM-SHA-256") -> None:
    """SaslHandshake v1 + SaslAuthenticate v1 rounds, written apart from mirrorguard's
    Rust implementation (hashlib/hmac) so that each checks the other."""
    r = rawkafka.Reader(conn.request(17, 1, rawkafka.string(mechanism)))
    code = r.i16()
    if code:
        raise AuthFailed(f"SaslHandshake error {code}")

    def step(token: bytes) -> bytes:
        r = rawkafka.Reader(conn.request(36, 1, rawkafka.i32(len(token)) + token))
        code, message, data = r.i16(), r.string(), r.nbytes()
        r.i64()
        if code:
            raise AuthFailed(f"{code}: {message}")
        return data or b""

    h = hashlib.sha256 if mechanism.endswith("256") else hashlib.sha512
    bare = f"n={user},r={base64.b64encode(os.urandom(18)).decode()}"
    server_first = step(f"n,,{bare}".encode()).decode()
    attrs = dict(kv.split("=", 1) for kv in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(h().name, password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", h).digest()
    without_proof = f"c=biws,r={attrs['r']}"
    message = f"{bare},{server_first},{without_proof}".encode()
    signature = hmac.new(h(client_key).digest(), message, h).digest()
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature))).decode()
    server_final = step(f"{without_proof},p={proof}".encode()).decode()
    server_key = hmac.new(salted, b"Server Key", h).digest()
    assert server_final == "v=" + base64.b64encode(hmac.new(server_key, message, h).digest()).decode()


class SaslStandIn(StandInFetcher):
    """The stand-in destination fetcher, authenticating every connection it opens."""

    def __init__(self, *a, user: str = "fetcher", password: str = FETCHER_PW,
                 mechanism: str = "SCRAM-SHA-256", **kw):
        super().__init__(*a, **kw)
        self.user, self.password, self.mechanism = user, password, mechanism

    def _conn(self, host: str, port: int, timeout: float) -> rawkafka.Connection:
        c = rawkafka.Connection(host, port, timeout=timeout)
        sasl_authenticate(c, self.user, self.password, self.mechanism)
        return c

    def connect(self, bootstrap: str, rebase: bool = False, source_offset: int = 0) -> "SaslStandIn":
        self.close()
        host, port = bootstrap.rsplit(":", 1)
        with self._conn(host, int(port), 5) as c:
            md = rawkafka.metadata_v1(c, [self.topic])
            lhost, lport = md.brokers[md.topics[self.topic][self.partition]]
            if self.version >= 13:
                ids, _ = rawkafka.topic_ids_v12(c, [self.topic])
                self.topic_id = ids[self.topic]
        self.conn = self._conn(lhost, lport, 10)
        self.source_offset = None
        return self


def credential_file(path) -> None:
    """A mirror listener's credential file for `fetcher` (both SCRAM mechanisms), made by
    `mirrorguard sasl-credential`."""
    lines = []
    for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        r = subprocess.run([harness.MIRRORGUARD_BIN, "sasl-credential", "--user", "fetcher",
                            "--mechanism", mech], input=FETCHER_PW + "\n", capture_output=True,
                           text=True, timeout=30, check=True)
        assert FETCHER_PW not in r.stdout
        lines.append(r.stdout.strip())
    path.write_text("# mirror listener clients\n" + "\n".join(lines) + "\n")


class Pki:
    """The test's certificates (paths)."""

    def __init__(self, root):
        self.ca_dir = CertAuthority(root / "ca")
        self.ca = self.ca_dir.ca
        self.server = self.ca_dir.issue("mirrorguard")           # mirrorguard's listeners
        self.upstream = self.ca_dir.issue("mirrorguard-client")  # mirrorguard towards Kafka
        self.app = self.ca_dir.issue("app")                      # a Kafka client
        self.foreign = CertAuthority(root / "foreign", name="foreign-ca").issue("intruder")

    @functools.cached_property
    def expired(self):
        """A client certificate of the test CA that expired yesterday (made on first use)."""
        return self.ca_dir.issue("app-expired", expired=True)

    def server_tls(self, client_ca: bool = True, timeout_ms: int = 10000) -> str:
        cert, key = self.server
        ca = f'client_ca = "{self.ca}", ' if client_ca else ""
        return f'{{ cert = "{cert}", key = "{key}", {ca}handshake_timeout_ms = {timeout_ms} }}'

    def client_tls(self) -> str:
        cert, key = self.upstream
        return f'{{ ca = "{self.ca}", cert = "{cert}", key = "{key}" }}'

    def rdkafka(self, cert=None) -> dict:
        cert, key = cert or self.app
        return {"security.protocol": "SSL", "ssl.ca.location": str(self.ca),
                "ssl.certificate.location": str(cert), "ssl.key.location": str(key),
                "ssl.endpoint.identification.algorithm": "https"}

    def context(self, cert=None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        cert, key = cert or self.app
        ctx.load_cert_chain(str(cert), str(key))
        return ctx


def rawkafka_tls(ctx: ssl.SSLContext, host: str, port: int, timeout: float = 5.0) -> rawkafka.Connection:
    """A rawkafka connection over TLS."""
    c = rawkafka.Connection(host, port, timeout=timeout)
    c.sock = ctx.wrap_socket(c.sock, server_hostname=host)
    return c


@contextlib.contextmanager
def tls_rawkafka(ctx: ssl.SSLContext, sasl: tuple[str, str, str] | None = None):
    """rawkafka connections made inside (the stand-in fetcher's) speak TLS with `ctx`; with
    `sasl` = (user, password, mechanism) each then authenticates with SCRAM."""
    plain = rawkafka.Connection

    class Tls(plain):
        def __init__(self, host, port, timeout=10.0, client_id="rawkafka"):
            super().__init__(host, port, timeout=timeout, client_id=client_id)
            self.sock = ctx.wrap_socket(self.sock, server_hostname=host)
            if sasl:
                user, password, mechanism = sasl
                sasl_authenticate(self, user, password, mechanism)

    rawkafka.Connection = Tls
    mirror_harness.rawkafka.Connection = Tls
    try:
        yield
    finally:
        rawkafka.Connection = plain
        mirror_harness.rawkafka.Connection = plain


# A transactional producer (a child process): a committed transaction, then an open one;
# prints "open" and waits for stdin to close.
OPEN_TXN = r"""
import sys
from confluent_kafka import Producer
bootstrap, topic = sys.argv[1], sys.argv[2]
p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"txn-{topic}",
              "transaction.timeout.ms": 120000, "message.timeout.ms": 20000})
p.init_transactions(20)
p.begin_transaction()
for i in range(3):
    p.produce(topic, value=b"c-%d" % i, partition=0)
p.commit_transaction(20)
p.begin_transaction()
for i in range(2):
    p.produce(topic, value=b"open-%d" % i, partition=0)
assert p.flush(20) == 0
print("open", flush=True)
sys.stdin.read()
"""
