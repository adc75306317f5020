"""Start-up never loses durable decisions (issue 13, item 3), with Apache Kafka as the
state cluster: a `__mirror_state` read that cannot finish within one request timeout goes
on until the end (or fails start-up), never passes as complete; record types this release
does not know are skipped and counted.
"""

from __future__ import annotations

from confluent_kafka import Producer

import harness
from mirror_harness import MirrorSpec, mirror_factory, with_state_topic  # noqa: F401 - mirror_factory is a fixture

MIRROR = "src-to-dst"
FILLER_RECORDS = 400
FILLER_BYTES = 100_000  # 40 MB in all: far more than one request timeout of reading


def test_slow_state_read_is_read_to_the_end(kafka1, mirror_factory):
    topic = harness.topic_name("startup")
    state_topic = f"__mirror_state_{topic}"
    harness.create_topics(kafka1.bootstrap, [topic])
    harness.create_topics(kafka1.bootstrap, [state_topic], config={"cleanup.policy": "compact"})
    # Records of a type from a later release (type 99), ahead of everything else.
    p = Producer({"bootstrap.servers": kafka1.bootstrap, "linger.ms": 20})
    for i in range(FILLER_RECORDS):
        p.produce(state_topic, key=b"\x00\x63" + i.to_bytes(4, "big"), value=b"\x00\x00" + bytes(FILLER_BYTES))
        p.poll(0)
    assert p.flush(30) == 0

    mg = mirror_factory(kafka1.bootstrap, [MirrorSpec(MIRROR, kafka1.bootstrap, node_ids=list(kafka1.node_ids))],
                        start=False)
    text = with_state_topic(mg.config_path.read_text(), f"{state_topic}")
    mg.config_path.write_text(text)
    mg.start(timeout=60)
    mg.wait_sources_known()
    # A decision recorded after them: the partition is PAUSED.
    status, body = mg.post("pause", MIRROR, topic, [0])
    assert status == 200, body
    assert mg.terminate() == 0

    # Restart with a request timeout far shorter than reading the whole topic takes.
    mg.config_path.write_text(text.replace("request_timeout_ms = 10000", "request_timeout_ms = 300"))
    mg.start(timeout=60)
    log = mg.log_text()
    loaded = [line for line in log.splitlines() if "__mirror_state loaded" in line]
    print(loaded[-1] if loaded else "no load line")
    e = mg.partition(topic, 0)
    assert e is not None and e["state"] == "PAUSED", \
        f"the PAUSED decision after {FILLER_RECORDS} records was lost at start-up: {e}"
    skipped = mg.metrics().sum("mirrorguard_state_store_ops_total", kind="unknown_record_type")
    assert skipped == FILLER_RECORDS, skipped


def test_existing_state_topic_that_is_not_compacted_is_reported(kafka1, mirror_factory):
    topic = harness.topic_name("policy")
    state_topic = f"__mirror_state_{topic}"
    harness.create_topics(kafka1.bootstrap, [topic])
    harness.create_topics(kafka1.bootstrap, [state_topic], config={"cleanup.policy": "delete"})
    mg = mirror_factory(kafka1.bootstrap, [MirrorSpec(MIRROR, kafka1.bootstrap, node_ids=list(kafka1.node_ids))],
                        start=False)
    mg.config_path.write_text(
        with_state_topic(mg.config_path.read_text(), f"{state_topic}"))
    mg.start(timeout=60)
    lines = [line for line in mg.log_text().splitlines() if "cleanup.policy is not `compact`" in line]
    assert lines and "ERROR" in lines[0] and "cleanup_policy=delete" in lines[0], mg.log_text()[-2000:]
