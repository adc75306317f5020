"""A new source topic is mirrored without closing connections (issue 18 item 3).

A kafka-clients 4.4 consumer (KIP-227 incremental fetch sessions) reads an existing
topic through a mirror listener of a real Apache Kafka source; a new topic is created on
the source and written to, and the consumer adds it to its session, while the
destination (the state cluster, the session's shared Kafka node) creates that topic only
a few seconds later. Meanwhile the new topic's partition is held (answered with no
records), the old topic keeps flowing, no fetch connection is closed, and once the
destination lists the topic every record arrives, with its PID mapped.
"""

from __future__ import annotations

import subprocess
import time

import harness
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    StandInFetcher,
    direct_batches,
    fold,
    high_watermark,
    idempotent_producer,
    map_pid,
    mirror_factory,
    send,
)

LIBS = harness.ROOT / ".tools" / "kafka" / "libs"
SOURCE = harness.ROOT / "tests" / "integration" / "java" / "NewTopicConsumer.java"
ENDS = "mirrorguard_connection_ends_total"
EVENTS = "mirrorguard_mirror_events_total"


def _records(out_path) -> dict[str, list[str]]:
    got: dict[str, list[str]] = {}
    for line in out_path.read_text(errors="replace").splitlines():
        parts = line.split(" ", 3)
        if len(parts) == 4 and parts[1].isdigit():
            got.setdefault(parts[0], []).append(parts[3])
    return got


def test_new_source_topic_held_until_destination_lists_it(kafka_factory, kafka1, mirror_factory, tmp_path):
    classes = tmp_path / "classes"
    subprocess.run(["javac", "-cp", f"{LIBS}/*", "-d", classes, SOURCE], check=True, timeout=120)
    src = kafka_factory(name="newtopic-src")
    old, new = harness.topic_name("old"), harness.topic_name("new")
    harness.create_topics(src.bootstrap, [old])
    harness.create_topics(kafka1.bootstrap, [old])
    # The listener reads the source's Metadata only once a minute: a topic id the consumer
    # asks for (Fetch v13+) before that is looked up at once, not at the next refresh.
    mg = mirror_factory(kafka1.bootstrap, [MirrorSpec.of("m", src)], metadata_refresh_ms=60_000)
    mg.wait_sources_known()
    prod = idempotent_producer(src.bootstrap)
    send(prod, old, [b"old-%d" % i for i in range(5)])

    out, err, stop = tmp_path / "consumer.out", tmp_path / "consumer.err", tmp_path / "stop"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen(["java", "-cp", f"{classes}:{LIBS}/*", "NewTopicConsumer",
                                 mg.mirrors["m"].bootstrap, str(stop), old, new], stdout=o, stderr=e)
    try:
        harness.wait_until(lambda: len(_records(out).get(old, [])) >= 5, 40, what="old topic read")
        ends_before = mg.metrics().sum(ENDS)

        # The new topic: on the source only, with records the consumer asks for at once.
        harness.create_topics(src.bootstrap, [new])
        send(prod, new, [b"new-%d" % i for i in range(5)])
        harness.wait_until(lambda: mg.metrics().sum(EVENTS, kind="held_unknown_topic") > 0, 20,
                           what="new topic's partition held")
        # The old topic flows meanwhile; the new one's records wait.
        send(prod, old, [b"old-later-%d" % i for i in range(5)])
        harness.wait_until(lambda: len(_records(out).get(old, [])) >= 10, 20,
                           what="old topic flows while the new one is held")
        time.sleep(3)
        assert _records(out).get(new, []) == [], "records of a topic the destination lacks left the proxy"
        held_before_create = mg.metrics().sum(EVENTS, kind="held_unknown_topic")

        harness.create_topics(kafka1.bootstrap, [new])
        harness.wait_until(lambda: len(_records(out).get(new, [])) >= 5, 30,
                           what="new topic's records after the destination created it")
        assert _records(out)[new] == [f"new-{i}" for i in range(5)]
        assert _records(out)[old] == [f"old-{i}" for i in range(5)] + [f"old-later-{i}" for i in range(5)]

        m = mg.metrics()
        assert m.sum(ENDS) == ends_before, f"connections ended: {m.select(ENDS)}"
        assert held_before_create > 1, "held only once: the fetcher did not keep asking"
    finally:
        stop.write_text("")
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    log = mg.log_text()
    assert "cannot rewrite" not in log, [line for line in log.splitlines() if "cannot rewrite" in line]
    held_lines = [line for line in log.splitlines() if "partitions held" in line]
    assert held_lines and all("Fetch v" in line and "Fetch v0 " not in line for line in held_lines), held_lines
    # The real wait is named: the destination topic id (and, for a fetch by topic id ahead
    # of the listener's refresh, the source topic's name).
    assert any("until the destination topic id" in line and new in line for line in held_lines), held_lines

    # Every record arrived mapped: a fetch through the mirror gets the formula's PIDs.
    direct = direct_batches(src.bootstrap, new)
    f = StandInFetcher(new).connect(mg.mirrors["m"].bootstrap)
    try:
        f.catch_up(high_watermark(src.bootstrap, new))
    finally:
        f.close()
    fa = fold(src.cluster_id)
    assert len(f.log) == len(direct) > 0
    for got, d in zip(f.log, direct):
        assert d.producer_id >= 0
        assert got.producer_id == map_pid(d.producer_id, fa, 0, "high"), (got.producer_id, d.producer_id)
