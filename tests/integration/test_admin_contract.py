"""The admin API against its OpenAPI document (issue 18), on a live, throwaway instance.

schemathesis (pinned, installed by scripts/install-test-deps.sh into its own venv)
generates positive and negative requests from docs/openapi.json, with and without the
bearer token, and checks every answer: no server error, status codes and content types
as documented, response bodies matching their schemas, negative data refused, and
authentication not ignored. The documented example selects the mirror `a-to-b`, so the
examples phase really stops its partitions. Hand-made slow, oversized and malformed
requests check what a generator does not send: header and body read timeouts, 413 for
announced and sent oversized bodies, JSON errors for path and routing errors, and the
case-insensitive bearer scheme. (tests/integration/test_admin_hardening.py has the
attacks: Host names of DNS rebinding, bodies sent before the token, weak tokens.)
"""

from __future__ import annotations

import json
import socket
import subprocess
import time

import pytest

import harness
from harness import HOST
from mirror_harness import MirrorGuard, MirrorSpec

# Run through the venv's python (`-m schemathesis.cli`), not the `st` script, whose
# shebang names the path the venv was created at.
SCHEMATHESIS = harness.ROOT / ".tools" / "schemathesis" / "bin" / "python"
READ_TIMEOUT_MS = 1500
# The checks the contract is held to, by schemathesis' names.
CHECKS = [
    "not_a_server_error",  # no 5xx, ever
    "status_code_conformance",  # every status is documented for its operation
    "content_type_conformance",  # and comes with its documented content type
    "response_schema_conformance",  # bodies match the documented schemas
    "negative_data_rejection",  # requests that break the schema get 4xx
    "ignored_auth",  # mutating calls without a valid token are refused
]


@pytest.fixture(scope="module")
def live_admin(tmp_path_factory, kafka1) -> MirrorGuard:
    """mirrorguard with one mirror `a-to-b` (a Kafka source with a 2-partition topic) and
    `kafka1` as the state cluster, shared by the module: the schemathesis run with the
    token, which stops every partition, comes last."""
    from kafka_broker import KafkaCluster

    work = tmp_path_factory.mktemp("admin-contract")
    src = KafkaCluster(work, nodes=1, name="src").start()
    mg = None
    try:
        topic = harness.topic_name("contract")
        harness.create_topics(src.bootstrap, [topic], partitions=2)
        harness.create_topics(kafka1.bootstrap, [topic], partitions=2)  # the destination topic (kafka1 is the destination here)
        mg = MirrorGuard(work, "mg", kafka1.bootstrap,
                         [MirrorSpec("a-to-b", src.bootstrap, node_ids=src.node_ids)],
                         admin_read_timeout_ms=READ_TIMEOUT_MS).start()
        mg.wait_sources_known()
        mg.topic = topic
        yield mg
    finally:
        harness.close_clients()
        if mg is not None:
            rc = mg.terminate()
            log = mg.log_text()
        src.stop()
    assert rc == 0, f"mirrorguard exit code {rc} after SIGTERM"
    assert "panicked" not in log


def _schemathesis(mg: MirrorGuard, tmp_path, mode: str, token: bool) -> subprocess.CompletedProcess:
    argv = [
        str(SCHEMATHESIS), "-m", "schemathesis.cli", "run", mg.admin_url + "/v1/openapi.json",
        "--checks", ",".join(CHECKS),
        "--mode", mode,
        "--max-examples", "200",
        "--seed", "20261130",
        "--phases", "examples,coverage,fuzzing",
        "--request-timeout", "10",
        "--workers", "1",
        "--no-color",
        "--generation-database", "none",
        "--report", "junit", "--report-dir", str(tmp_path / f"st-{mode}-{token}"),
    ]
    if token:
        argv += ["-H", f"Authorization: Bearer {MirrorGuard.TOKEN}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=150)


def _raw(mg: MirrorGuard, data: bytes, read_for: float = 5.0) -> bytes:
    """Sends `data` on a new connection and returns everything read until the server
    closes the connection or `read_for` seconds pass."""
    s = socket.create_connection((HOST, mg.admin_port), timeout=read_for)
    try:
        s.sendall(data)
        out = b""
        deadline = time.monotonic() + read_for
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            out += chunk
            if b"\r\n\r\n" in out and _complete(out):
                break
        return out
    finally:
        s.close()


def _complete(resp: bytes) -> bool:
    head, _, body = resp.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return False


def _status_and_json(resp: bytes) -> tuple[int, dict, str]:
    head, _, body = resp.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    status = int(lines[0].split()[1])
    ctype = next((ln.split(":", 1)[1].strip() for ln in lines if ln.lower().startswith("content-type:")), "")
    return status, json.loads(body.decode()), ctype


def test_stalled_and_oversized_requests_get_answers(live_admin):
    mg = live_admin
    # A half-sent request line: the connection is closed once the header timeout passes.
    t0 = time.monotonic()
    s = socket.create_connection((HOST, mg.admin_port), timeout=10)
    s.sendall(b"GET /v1/partit")
    s.settimeout(READ_TIMEOUT_MS / 1000 + 5)
    got = s.recv(1024)
    waited = time.monotonic() - t0
    s.close()
    assert waited < READ_TIMEOUT_MS / 1000 + 4, f"half-sent request line held {waited:.1f}s"
    assert got == b"" or got.startswith(b"HTTP/1.1 408"), got

    # A body announced huge and never sent: 413 at once, before the token is even read.
    resp = _raw(mg, b"POST /v1/partitions/stop HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 99999999999\r\n\r\n")
    status, body, ctype = _status_and_json(resp)
    assert (status, body["error"], ctype) == (413, "payload_too_large", "application/json"), resp[:300]

    # A body sent larger than 2 MiB without a Content-Length (chunked), with the token
    # (without it, nothing of the body is read: 401): 413 too.
    chunk = b"x" * (1 << 20)
    data = (b"POST /v1/partitions/stop HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {MirrorGuard.TOKEN}\r\n".encode()
            + b"Transfer-Encoding: chunked\r\n\r\n")
    for _ in range(3):
        data += b"%x\r\n" % len(chunk) + chunk + b"\r\n"
    data += b"0\r\n\r\n"
    status, body, _ = _status_and_json(_raw(mg, data))
    assert (status, body["error"]) == (413, "payload_too_large"), body

    # A body announced small and never finished, with the token: 408 after the read timeout.
    t0 = time.monotonic()
    resp = _raw(mg, b"POST /v1/partitions/stop HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    + f"Authorization: Bearer {MirrorGuard.TOKEN}\r\n".encode()
                    + b"Content-Length: 100\r\n\r\n{\"mirror\":", read_for=READ_TIMEOUT_MS / 1000 + 5)
    status, body, _ = _status_and_json(resp)
    assert (status, body["error"]) == (408, "request_timeout"), body
    assert time.monotonic() - t0 < READ_TIMEOUT_MS / 1000 + 4


@pytest.mark.parametrize("path", [
    "/v1/partitions/t/null,null/producers",
    "/v1/partitions/t/99999999999/producers",
    "/v1/partitions/%FF%FE/0/producers",
])
def test_path_errors_are_json(live_admin, path):
    # With the token: the producers read needs it (401 before the path is looked at).
    status, body = live_admin.request("GET", path)
    assert status == 400 and isinstance(body, dict) and body["error"] == "bad_request", (status, body)


def test_routing_errors_are_json(live_admin):
    status, body = live_admin.request("GET", "/v1/nothing-here", token=None)
    assert status == 404 and body["error"] == "not_found", body
    status, body = live_admin.request("DELETE", "/v1/partitions", token=None)
    assert status == 405 and body["error"] == "method_not_allowed", body


@pytest.mark.parametrize("body,expect", [
    ({"mirror": "a-to-b"}, 400),
    ({"mirror": "a-to-b", "topics": []}, 400),
    ({"mirror": "a-to-b", "all": True, "topics": [{"topic": "x"}]}, 400),
    ({"mirror": "a-to-b", "all": True, "topics": None}, 400),
    ({"mirror": "a-to-b", "topics": [{"topic": "x", "partitions": []}]}, 400),
    ({"mirror": "a-to-b", "topics": [{"topic": "x", "partitions": [2147483648]}]}, 400),
    ({"mirror": "a-to-b", "all": None}, 400),
    ({"mirror": "no-such-mirror", "all": True}, 404),
])
def test_selection_is_as_strict_as_the_schema(live_admin, body, expect):
    status, answer = live_admin.request("POST", "/v1/partitions/pause", body)
    assert status == expect and isinstance(answer, dict), (status, answer)
    assert all(p["state"] == "MIRRORING" for p in live_admin.partitions()), "a refused call changed state"


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer"])
def test_bearer_scheme_is_case_insensitive(live_admin, scheme):
    mg = live_admin
    req_body = {"mirror": "a-to-b", "topics": [{"topic": mg.topic, "partitions": [0]}]}
    status, answer = mg.request("POST", "/v1/partitions/pause", req_body, token=None,
                                headers={"Authorization": f"{scheme} {MirrorGuard.TOKEN}"})
    assert status == 200, answer
    status, answer = mg.request("POST", "/v1/partitions/resume", req_body, token=None,
                                headers={"Authorization": f"{scheme} {MirrorGuard.TOKEN}"})
    assert status == 200, answer
    status, answer = mg.request("POST", "/v1/partitions/pause", req_body, token=None,
                                headers={"Authorization": f"{scheme} wrong-token"})
    assert status == 401 and answer["error"] == "bad_token", answer


@pytest.mark.timeout(300)
@pytest.mark.parametrize("token", [False, True], ids=["without-token", "with-token"])
def test_schemathesis_finds_no_contract_violation(live_admin, tmp_path, token):
    assert SCHEMATHESIS.exists(), f"{SCHEMATHESIS} missing: run scripts/install-test-deps.sh"
    for mode in ("positive", "negative"):
        r = _schemathesis(live_admin, tmp_path, mode, token)
        out = r.stdout + r.stderr
        assert r.returncode == 0, f"schemathesis --mode {mode} (token={token}) failed:\n{out[-20000:]}"
        # It must have really exercised the API (a run that tested nothing passes too).
        assert "No failures" in out or " passed" in out, out[-3000:]
    status, body = live_admin.request("GET", "/v1/partitions", token=None)
    assert status == 200
    states = {(p["topic"], p["partition"]): p["state"] for p in body["partitions"]}
    if token:
        # The documented example ({"mirror": "a-to-b", "all": true}) stopped every partition.
        assert all(s in ("STOPPING", "STOPPED") for s in states.values()), states
    else:
        assert all(s == "MIRRORING" for s in states.values()), states
