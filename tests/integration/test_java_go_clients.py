"""Kafka's own Java clients (kafka-clients 4.4.0) and franz-go (kgo) through mirrorguard's
plain listener and its produce guard, on Apache Kafka (issue 10).

The programs live in tests/clients/java (a transactional producer and a read_committed
consumer, which fetches with KIP-227 incremental fetch sessions across its polls) and
tests/clients/go (kgo: idempotent round trip, aborted + committed transactions read
read_committed, single produce for the guard); scripts/install-test-deps.sh builds them
into .tools. Each prints one JSON line that the tests check.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

import harness
from harness import create_topics, topic_name
from mirror_harness import MirrorSpec, high_watermark, mirror_factory  # noqa: F401 - fixture
from kafka_broker import JAVA

JAVA_HOME_DIR = harness.ROOT / ".tools" / "clients" / "java"
KGO_CLIENT = harness.ROOT / ".tools" / "bin" / "kgo-client"
POLICY_VIOLATION = 44


def _run(argv: list, timeout: float = 90) -> dict:
    r = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout)
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    assert lines, f"no JSON from {argv[0]} (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    out = json.loads(lines[-1])
    out["_rc"] = r.returncode
    out["_stderr"] = r.stderr[-3000:]
    return out


def java_client(bootstrap: str, topic: str, mode: str, **kw) -> dict:
    if not (JAVA_HOME_DIR / "classes" / "mgtest" / "KafkaClientCheck.class").exists() or not shutil.which(JAVA):
        pytest.fail("Java test client missing: run scripts/install-test-deps.sh", pytrace=False)
    argv = [JAVA, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp", f"{JAVA_HOME_DIR / 'classes'}{os.pathsep}{JAVA_HOME_DIR / 'libs'}/*",
            "mgtest.KafkaClientCheck", "--bootstrap", bootstrap, "--topic", topic, "--mode", mode]
    for k, v in kw.items():
        argv += [f"--{k}", v]
    return _run(argv)


def kgo_client(bootstrap: str, topic: str, mode: str, **kw) -> dict:
    if not KGO_CLIENT.exists():
        pytest.fail("franz-go test client missing: run scripts/install-test-deps.sh", pytrace=False)
    argv = [KGO_CLIENT, "-bootstrap", bootstrap, "-topic", topic, "-mode", mode]
    for k, v in kw.items():
        argv += [f"-{k}", v]
    return _run(argv)


@pytest.fixture
def plain(kafka1, proxy_factory):
    """mirrorguard's plain listener in front of the session's Kafka node."""
    return proxy_factory([kafka1.bootstrap], node_ids=kafka1.node_ids)


def test_java_transactions_and_read_committed_session_consumer(plain):
    topic = topic_name("java-txn")
    create_topics(plain.bootstrap, [topic])
    n = 10
    out = java_client(plain.bootstrap, topic, "txn", n=n)
    assert out["_rc"] == 0, out
    # Aborted transaction, its marker, committed one, its marker, late committed one.
    assert out["produced_offsets"] == list(range(n)) + list(range(n + 1, 2 * n + 1)) \
        + list(range(2 * n + 2, 3 * n + 2)), out["produced_offsets"]
    assert out["consumed"] == [f"java-committed-{i}" for i in range(n)] + [f"java-late-{i}" for i in range(n)]
    assert out["position"] == 3 * n + 3  # past the last COMMIT marker
    assert out["polls"] >= 2
    m = plain.metrics()
    # (No AddPartitionsToTxn: with Kafka 4's transactions v2 (KIP-890) the producer adds
    # partitions implicitly through Produce.)
    for api in ("InitProducerId", "EndTxn", "FindCoordinator", "Fetch", "ListOffsets"):
        assert m.sum("mirrorguard_requests_total", api=api) > 0, f"no {api} through the proxy"


def test_kgo_roundtrip_and_transactions(plain, kafka1):
    topic = topic_name("kgo")
    create_topics(plain.bootstrap, [topic])
    out = kgo_client(plain.bootstrap, topic, "roundtrip", n="25")
    assert out["_rc"] == 0 and not out.get("error"), out
    assert out["offsets"] == list(range(25))
    assert out["consumed"] == [f"kgo-{i}" for i in range(25)]
    expected = {f"{n}@{harness.HOST}:{plain.ports.node_port_of(n)}" for n in kafka1.node_ids}
    assert set(out["brokers"]) == expected, out["brokers"]

    ttopic = topic_name("kgo-txn")
    create_topics(plain.bootstrap, [ttopic])
    out = kgo_client(plain.bootstrap, ttopic, "txn", n="8")
    assert out["_rc"] == 0 and not out.get("error"), out
    assert out["consumed"] == [f"kgo-committed-{i}" for i in range(8)], out["consumed"]
    assert high_watermark(kafka1.bootstrap, ttopic) == 8 + 1 + 8 + 1  # data and both markers


def _guard(mg, kafka1) -> str:
    from test_produce_guard import _with_guard

    return _with_guard(mg, kafka1.bootstrap, kafka1.node_ids)


def test_java_and_kgo_through_the_guard(kafka_factory, kafka1, mirror_factory):
    """Kafka destination behind the guard: both clients are refused on a mirrored
    partition with POLICY_VIOLATION (not retriable) and write a local topic; the Java
    transactional producer and read_committed consumer work through the guard."""
    src = kafka_factory()
    mirrored, local = topic_name("guarded"), topic_name("local")
    create_topics(src.bootstrap, [mirrored])
    create_topics(kafka1.bootstrap, [mirrored, local])
    mg = mirror_factory(kafka1.bootstrap, [MirrorSpec.of("a-to-d", src)], start=False)
    guard = _guard(mg, kafka1)
    mg.start()
    mg.wait_sources_known()

    j = java_client(guard, mirrored, "produce-one")
    assert j.get("error") == "PolicyViolationException", j
    assert "a-to-d" in j.get("message", ""), j
    g = kgo_client(guard, mirrored, "produce-one")
    assert g.get("error_code") == POLICY_VIOLATION and not g.get("retriable"), g
    assert high_watermark(kafka1.bootstrap, mirrored) == 0

    j = java_client(guard, local, "produce-one")
    assert j.get("offset") == 0 and "error" not in j, j
    g = kgo_client(guard, local, "produce-one")
    assert "error" not in g and g["offsets"] == [1], g
    txn_topic = topic_name("guard-txn")
    create_topics(kafka1.bootstrap, [txn_topic])
    out = java_client(guard, txn_topic, "txn", n="5")
    assert out["_rc"] == 0, out
    assert out["consumed"] == [f"java-committed-{i}" for i in range(5)] + [f"java-late-{i}" for i in range(5)]
    assert mg.metrics().sum("mirrorguard_produce_refused_total", listener="dest-guard") >= 2
