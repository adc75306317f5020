"""Disaster failover (issue 12) and a state cluster apart from the destination (issue 13
item 6), on real Apache Kafka clusters: sources, state cluster and destination.

The destination's mirror fetcher is the stand-in of mirror_harness.py (SPEC 7) unless a
test says otherwise; every cluster, producer and consumer is real.
"""

from __future__ import annotations

import harness
import rawkafka
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    StandInFetcher,
    direct_batches,
    fold,
    high_watermark,
    idempotent_producer,
    map_pid,
    mirror_factory,
    read_state_records,
    send,
)


def _topic_ids(bootstrap: str, topics: list[str]) -> dict[str, bytes]:
    host, port = bootstrap.rsplit(":", 1)
    with rawkafka.Connection(host, int(port), timeout=5) as c:
        ids, _ = rawkafka.topic_ids_v12(c, topics)
    return ids


def _topic_names(bootstrap: str) -> set[str]:
    md = harness.admin(bootstrap).list_topics(timeout=10)
    return set(md.topics)


def test_state_cluster_apart_from_destination(kafka_factory, mirror_factory):
    """State and destination on different Kafka clusters, no dummy topic on the state
    cluster: producer claims are recorded under the destination's topic id."""
    src = kafka_factory(name="src")
    state = kafka_factory(name="state")
    dest = kafka_factory(name="dest")
    topic = harness.topic_name("sep")
    harness.create_topics(src.bootstrap, [topic])
    harness.create_topics(dest.bootstrap, [topic])
    mg = mirror_factory(state.bootstrap, [MirrorSpec("a-to-b", src.bootstrap, node_ids=src.node_ids,
                                                     destination_bootstrap=dest.bootstrap)])
    p = idempotent_producer(src.bootstrap)
    send(p, topic, [b"v%d" % i for i in range(5)])
    hw = high_watermark(src.bootstrap, topic)

    f = StandInFetcher(topic, version=13).connect(mg.mirrors["a-to-b"].bootstrap)
    f.catch_up(hw)
    f.close()

    pids = {b.producer_id for b in f.log}
    src_pids = {b.producer_id for b in direct_batches(src.bootstrap, topic)}
    assert len(pids) == 1 and len(src_pids) == 1
    mapped = pids.pop()
    assert mapped == map_pid(src_pids.pop(), fold(src.cluster_id)), "region mapping"
    assert topic not in _topic_names(state.bootstrap), "the test must not create the topic on the state cluster"
    dest_id = _topic_ids(dest.bootstrap, [topic])[topic]
    snaps = [r for r in read_state_records(state.bootstrap) if r.type == 5]
    assert snaps, "no producer claim recorded"
    assert all(r.key["topic_id"] == dest_id for r in snaps), "claims must be keyed by the destination topic id"
    assert any(pr["producer_id"] == mapped for r in snaps for pr in r.value["producers"])
    assert "does not exist on the" not in mg.log_text()
