"""The admin listener and the secrets mirrorguard holds, attacked as a client would
(issue 30, "Why" items 6 and 7): no broker is needed, the mirrorguard binary runs with a
plain listener whose upstream is down (the admin listener serves anyway), so each test
takes about a second.

- the admin token: a placeholder (`change-me`, what the manifests shipped) or a token
  shorter than 32 bytes, or a token file others can read, stops start-up with the file
  named;
- DNS rebinding: a request whose Host is a name the operator did not allow is refused,
  so a web page on a name that resolves to 127.0.0.1 cannot read the API from a browser;
- nothing unauthenticated makes mirrorguard read a large body (a POST without the token
  is answered at once, without reading what it announces);
- reads that show producer ids need the token;
- a password given in the environment (`password_env`) is gone from the process's
  environment once read (`/proc/<pid>/environ`, what `ps e` shows);
- `ctl` speaks TLS to an admin listener with `[admin.tls]`;
- `[admin] metrics_listen` serves health, readiness and metrics only, so the admin API
  can stay on loopback while Prometheus and the kubelet reach the metrics;
- the served certificate's notAfter is a metric.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

import harness
from harness import HOST, MIRRORGUARD_BIN, ManagedProcess, wait_until
from kafka_broker import CertAuthority

GOOD_TOKEN = "4f1c0a9e7b2d48c6a35e91d07f62b8ac"  # 32 bytes, as from `openssl rand -hex 16`


class Instance:
    """mirrorguard with one plain listener towards a port nothing listens on, and an
    admin listener; `extra_admin` / `extra` are appended to `[admin]` / the file."""

    def __init__(self, work: Path, token: str | None = GOOD_TOKEN, token_mode: int = 0o600,
                 extra_admin: str = "", extra: str = "", env: dict | None = None):
        taken: set[int] = set()
        self.admin_port = harness.free_port(taken)
        taken.add(self.admin_port)
        bootstrap = harness.free_port(taken)
        taken.add(bootstrap)
        base = harness.free_node_port_base(taken, nodes=[1])
        self.work = work
        self.token_path = work / "admin.token"
        token_line = ""
        if token is not None:
            self.token_path.write_text(token + "\n")
            os.chmod(self.token_path, token_mode)
            token_line = f'token_file = "{self.token_path}"\n'
        self.config_path = work / "proxy.toml"
        self.config_path.write_text(
            f'[admin]\nlisten = "{HOST}:{self.admin_port}"\n{token_line}read_timeout_ms = 3000\n'
            f"{extra_admin}\n"
            f'[[listener]]\nname = "main"\nbootstrap = "{HOST}:{bootstrap}"\nnode_port_base = {base}\n'
            f'upstream_bootstrap = ["{HOST}:1"]\n{extra}\n')
        self.log_path = work / "mirrorguard.log"
        full_env = dict(os.environ, NO_COLOR="1")
        full_env.update(env or {})
        self.proc = ManagedProcess("mg", [MIRRORGUARD_BIN, "run", "--config", self.config_path],
                                   self.log_path, env=full_env)

    def exit_code(self, timeout: float = 10.0) -> int | None:
        return self.proc.wait(timeout)

    def wait_up(self, scheme: str = "http") -> "Instance":
        def up():
            assert self.proc.alive(), self.proc.log_text()
            try:
                with socket.create_connection((HOST, self.admin_port), timeout=1):
                    return True
            except OSError:
                return False

        wait_until(up, 15, what="admin listener up")
        return self

    def stop(self) -> None:
        self.proc.stop()

    def raw(self, data: bytes, read_for: float = 5.0) -> tuple[bytes, float]:
        """Sends `data` on a new connection; returns what came back before the server closed
        the connection, a complete response arrived or `read_for` passed, and how long
        that took."""
        t0 = time.monotonic()
        s = socket.create_connection((HOST, self.admin_port), timeout=read_for)
        try:
            s.sendall(data)
            out = b""
            while time.monotonic() - t0 < read_for:
                try:
                    chunk = s.recv(65536)
                except socket.timeout:
                    break
                if not chunk:
                    break
                out += chunk
                head, sep, body = out.partition(b"\r\n\r\n")
                if sep:
                    length = [ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")]
                    if length and len(body) >= int(length[0].split(b":", 1)[1]):
                        break
            return out, time.monotonic() - t0
        finally:
            s.close()

    def request(self, method: str, path: str, host: str | None = None, token: str | None = None,
                body: bytes = b"") -> tuple[int, bytes]:
        host = host if host is not None else f"{HOST}:{self.admin_port}"
        head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
        if token:
            head += f"Authorization: Bearer {token}\r\n"
        if body:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        resp, _ = self.raw(head.encode() + b"\r\n" + body)
        assert resp.startswith(b"HTTP/1.1 "), resp[:200]
        return int(resp.split()[1]), resp.partition(b"\r\n\r\n")[2]


@pytest.fixture
def instances(tmp_path):
    started: list[Instance] = []

    def make(name: str = "mg", **kw) -> Instance:
        work = tmp_path / name
        work.mkdir()
        inst = Instance(work, **kw)
        started.append(inst)
        return inst

    yield make
    for inst in started:
        inst.stop()


def refused_at_start(inst: Instance) -> str:
    rc = inst.exit_code()
    log = inst.proc.log_text()
    assert rc is not None and rc != 0, f"mirrorguard started (exit {rc}):\n{log}"
    return log


@pytest.mark.parametrize("token", ["change-me", "CHANGE-ME-change-me-change-me-change-me-0",
                                   "replace-with-openssl-rand-hex-32-output", "a" * 40],
                         ids=["shipped-placeholder", "long-placeholder", "replace-me", "one-letter"])
def test_a_placeholder_token_is_refused_at_start(instances, token):
    log = refused_at_start(instances(token=token))
    assert "admin.token_file" in log and "admin.token" in log, log
    assert token not in log, "the refused token itself must not be logged"


def test_a_short_token_is_refused_at_start(instances):
    log = refused_at_start(instances(token="9f8e7d6c5b4a39281706f5e4"))  # 24 bytes
    assert "admin.token_file" in log and "at least 32 bytes" in log, log
    assert "openssl rand" in log, log


def test_a_token_file_others_can_read_is_refused_at_start(instances):
    log = refused_at_start(instances(token_mode=0o644))
    assert "admin.token" in log and "readable" in log, log


def test_a_good_token_starts(instances):
    inst = instances().wait_up()
    assert inst.request("GET", "/healthz")[0] == 200


def test_dns_rebinding_host_names_are_refused(instances):
    inst = instances().wait_up()
    # A browser tricked by a name that resolves to 127.0.0.1 sends that name as Host.
    for host in ("rebind.attacker.example", "rebind.attacker.example:9644", "localhost.attacker.example"):
        status, body = inst.request("GET", "/v1/partitions", host=host)
        assert status == 403 and b"host_not_allowed" in body, (host, status, body)
        status, _ = inst.request("POST", "/v1/partitions/stop", host=host, token=GOOD_TOKEN,
                                 body=b'{"mirror": "m", "all": true}')
        assert status == 403, (host, status)
    metrics = inst.request("GET", "/metrics")[1].decode()
    assert 'mirrorguard_admin_refused_total{reason="host_not_allowed"} 6' in metrics, metrics


def test_ip_literals_localhost_and_allowed_hosts_are_served(instances):
    inst = instances(extra_admin='allowed_hosts = ["mirrorguard.internal"]\n').wait_up()
    # IP literals (a page served from a name never shares an origin with them), localhost
    # and the names in allowed_hosts are served.
    for host in (f"{HOST}:{inst.admin_port}", "127.0.0.1", f"localhost:{inst.admin_port}",
                 f"[::1]:{inst.admin_port}", "10.1.2.3:9644", "mirrorguard.internal:9644",
                 "MirrorGuard.Internal", "mirrorguard.internal."):
        status, body = inst.request("GET", "/v1/partitions", host=host)
        assert status == 200, (host, status, body)
    assert inst.request("GET", "/v1/partitions", host="other.internal")[0] == 403


def test_an_unauthenticated_post_is_answered_before_its_body_is_read(instances):
    inst = instances().wait_up()
    # 1 MiB announced, nothing sent: refused at once (401), not after the read timeout.
    resp, took = inst.raw(f"POST /v1/partitions/stop HTTP/1.1\r\nHost: {HOST}\r\n"
                          "Content-Type: application/json\r\nContent-Length: 1048576\r\n\r\n".encode())
    assert resp.startswith(b"HTTP/1.1 401"), resp[:300]
    assert took < 2.0, f"answered after {took:.1f}s: the body was waited for"
    # A wrong token: the same.
    resp, took = inst.raw(f"POST /v1/partitions/stop HTTP/1.1\r\nHost: {HOST}\r\n"
                          "Authorization: Bearer wrong\r\n"
                          "Content-Type: application/json\r\nContent-Length: 1048576\r\n\r\n".encode())
    assert resp.startswith(b"HTTP/1.1 401") and took < 2.0, (resp[:300], took)


def test_unauthenticated_bodies_are_capped_at_64_kib(instances):
    inst = instances().wait_up()
    status, body = inst.request("GET", "/healthz", body=b"x" * (64 * 1024 + 1))
    assert status == 413 and b"payload_too_large" in body, (status, body)
    assert inst.request("GET", "/healthz", body=b"x" * 1024)[0] == 200
    # With the token, a mutating call's body may be larger (here: refused as a bad body).
    status, body = inst.request("POST", "/v1/partitions/stop", token=GOOD_TOKEN,
                                body=b'{"mirror": "' + b"m" * (128 * 1024) + b'", "all": true}')
    assert status in (404, 409, 503), (status, body[:300])


@pytest.mark.parametrize("path", ["/v1/anomalies", "/v1/collisions", "/v1/partitions/t/0/producers"])
def test_reads_that_show_producer_ids_need_the_token(instances, path):
    inst = instances().wait_up()
    status, body = inst.request("GET", path)
    assert status == 401 and b"missing_token" in body, (status, body)
    status, body = inst.request("GET", path, token="0" * 32)
    assert status == 401 and b"bad_token" in body, (status, body)
    status, _ = inst.request("GET", path, token=GOOD_TOKEN)
    assert status in (200, 404), status
    # What every monitoring tool reads stays open.
    for open_path in ("/healthz", "/metrics", "/v1/partitions", "/v1/openapi.json"):
        assert inst.request("GET", open_path)[0] == 200, open_path


def test_reads_can_be_opened_explicitly(instances):
    inst = instances(extra_admin="token_for_reads = false\n").wait_up()
    assert inst.request("GET", "/v1/anomalies")[0] == 200


def test_a_password_from_the_environment_leaves_the_environment(instances, tmp_path):
    ca = CertAuthority(tmp_path / "pki")
    password = "pw-from-env-3c9a1e77d2"
    inst = instances(
        extra=('upstream_sasl = { mechanism = "SCRAM-SHA-512", username = "mg", '
               'password_env = "MG_TEST_UPSTREAM_PASSWORD" }\n'
               f'upstream_tls = {{ ca = "{ca.ca}" }}\n'),
        env={"MG_TEST_UPSTREAM_PASSWORD": password, "MG_TEST_UNRELATED": "stays"}).wait_up()
    environ = Path(f"/proc/{inst.proc.pid}/environ").read_bytes()
    assert b"MG_TEST_UNRELATED=stays" in environ
    assert password.encode() not in environ, "the password is still in the process environment"


def test_ctl_speaks_tls_to_an_admin_listener_with_tls(instances, tmp_path):
    ca = CertAuthority(tmp_path / "pki")
    cert, key = ca.issue("admin")
    inst = instances(extra_admin=f'tls = {{ cert = "{cert}", key = "{key}" }}\n').wait_up()
    argv = [MIRRORGUARD_BIN, "ctl", "--admin", f"{HOST}:{inst.admin_port}", "--token-file", inst.token_path,
            "--ca", ca.ca, "partitions"]
    r = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    assert '"partitions"' in r.stdout, r.stdout
    # Another CA: the admin listener's certificate is not trusted.
    other = CertAuthority(tmp_path / "other", name="other-ca")
    argv[argv.index("--ca") + 1] = other.ca
    r = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "certificate" in (r.stdout + r.stderr).lower(), r.stdout + r.stderr


def test_metrics_listener_serves_health_and_metrics_only(instances):
    taken = set()
    port = harness.free_port(taken)
    inst = instances(extra_admin=f'metrics_listen = "{HOST}:{port}"\n').wait_up()

    def get(path: str) -> int:
        try:
            return harness.http_get(f"http://{HOST}:{port}{path}", timeout=3)[0]
        except OSError:
            return -1

    wait_until(lambda: get("/healthz") == 200, 10, what="metrics listener up")
    assert get("/metrics") == 200
    assert get("/readyz") == 503  # the upstream is down
    for path in ("/v1/partitions", "/v1/anomalies", "/v1/openapi.json"):
        assert get(path) == 404, path


def test_the_served_certificate_expiry_is_a_metric(instances, tmp_path):
    ca = CertAuthority(tmp_path / "pki")
    cert, key = ca.issue("admin")
    inst = instances(extra_admin=f'tls = {{ cert = "{cert}", key = "{key}" }}\n').wait_up()
    out = subprocess.run(["openssl", "x509", "-enddate", "-noout", "-in", str(cert)],
                         capture_output=True, text=True, check=True).stdout
    not_after = int(time.mktime(time.strptime(out.strip().split("=", 1)[1], "%b %d %H:%M:%S %Y %Z"))
                    - time.timezone)
    import ssl
    import urllib.request
    ctx = ssl.create_default_context(cafile=str(ca.ca))
    req = urllib.request.Request(f"https://{HOST}:{inst.admin_port}/metrics")
    with urllib.request.urlopen(req, timeout=5, context=ctx) as r:
        text = r.read().decode()
    m = harness.Metrics(harness.parse_prometheus(text))
    got = m.select("mirrorguard_tls_certificate_expiry_timestamp_seconds", tls="admin tls", role="server")
    assert got and abs(got[0][1] - not_after) <= 1, (got, not_after)
    ca_got = m.select("mirrorguard_tls_certificate_expiry_timestamp_seconds", tls="admin tls", role="ca")
    assert ca_got == [], "a server section without client_ca has no CA bundle"
