"""Seal details under a fetcher without LastFetchedEpoch (issue 13, item 8), with Apache
Kafka as source and state cluster:

- Fetch < v12 carries no LastFetchedEpoch: the sealing batches are stamped with the
  partition leader epoch of the last batch mirrorguard forwarded (here > 0: the source's
  leader changed before the data was written), not 0;
- once the seal is complete (STOPPED) the partition's shadow producer state is expired,
  open transactions included (idle expiry never drops open transactions);
- a seal served again after a restart of mirrorguard, the source gone (a destination leader
  that lost the sealing batches fetches at the cut again), is the same bytes as the seal
  first served: the leader epoch is persisted with the cut and the batches are stamped with
  the time of the stop, not of the plan (issue 29 item 6). Before, the rebuilt seal was
  stamped epoch 0 (no LastFetchedEpoch below v12, no source to ask) and the time it was
  rebuilt: two destination replicas could hold different bytes at one offset and epoch, and
  the epoch going back truncated the destination's leader-epoch cache.
"""

from __future__ import annotations

import time

import pytest

import harness
import rawkafka
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    HOST,
    with_state_topic,
    MirrorSpec,
    StandInFetcher,
    high_watermark,
    idempotent_producer,
    mirror_factory,
    send,
    transactional_producer,
)

MIRROR = "src-to-dst"


def test_seal_without_last_fetched_epoch_and_state_after_stop(kafka_factory, mirror_factory):
    k = kafka_factory(nodes=1)
    topic = harness.topic_name("epoch")
    harness.create_topics(k.bootstrap, [topic])
    # A leader change on the source: the next batches carry a higher leader epoch.
    _write_across_a_leader_change(k, topic)
    tp = transactional_producer(k.bootstrap, f"txn-{topic}")
    tp.begin_transaction()
    tp.produce(topic, value=b"open", partition=0)
    assert tp.flush(20) == 0
    hw = high_watermark(k.bootstrap, topic)

    mg = mirror_factory(k.bootstrap, [MirrorSpec(MIRROR, k.bootstrap, node_ids=list(k.node_ids))], start=False)
    mg.config_path.write_text(
        with_state_topic(mg.config_path.read_text(), f"__mirror_state_{topic}"))
    mg.start(timeout=60)
    mg.wait_sources_known()

    f = StandInFetcher(topic, version=4).connect(mg.mirrors[MIRROR].bootstrap)
    f.catch_up(hw)
    last_epoch = f.log[-1].leader_epoch
    print("leader epochs of the mirrored batches:", [b.leader_epoch for b in f.log])
    assert last_epoch > 0, "the source's leader epoch did not move; the test needs it to"
    assert mg.partition(topic, 0)["producers"] >= 2

    status, body = mg.post("stop", MIRROR, topic, [0])
    assert status == 200, body
    res, got = f.fetch_once()
    assert [b.kind for b in got] == ["abort", "barrier"], [b.kind for b in got]
    assert [b.leader_epoch for b in got] == [last_epoch, last_epoch], \
        f"seal stamped {[b.leader_epoch for b in got]}, last mirrored batch {last_epoch}"

    f.fetch_once()
    e = mg.partition(topic, 0)
    assert e["state"] == "STOPPED", e
    assert e["producers"] == 0, f"producer state kept after the seal: {e}"
    f.close()


def _write_across_a_leader_change(source, topic: str) -> None:
    """Two records, a restart of the source's only node (its leader epoch moves), two more."""
    send(idempotent_producer(source.bootstrap), topic, [b"e0-%d" % i for i in range(2)])
    source.nodes[0].restart()
    harness.retry(lambda: send(idempotent_producer(source.bootstrap), topic, [b"e1-%d" % i for i in range(2)]))


@pytest.mark.parametrize("restart", ["graceful", "kill9"])
def test_seal_served_again_after_a_restart_without_the_source_is_the_same_bytes(
        restart, kafka1, kafka_factory, mirror_factory):
    topic = harness.topic_name(f"reseal-{restart}")
    a = kafka_factory(name="A")
    harness.create_topics(a.bootstrap, [topic])
    harness.create_topics(kafka1.bootstrap, [topic])
    _write_across_a_leader_change(a, topic)
    tp = transactional_producer(a.bootstrap, f"txn-{topic}", **{"transaction.timeout.ms": 600000})
    tp.begin_transaction()
    tp.produce(topic, value=b"open", partition=0)
    assert tp.flush(20) == 0
    hw = high_watermark(a.bootstrap, topic)

    spec = MirrorSpec.of(MIRROR, a)
    mg = mirror_factory(kafka1.bootstrap, [spec])
    mg.wait_sources_known()
    f = StandInFetcher(topic, version=4).connect(spec.bootstrap)
    f.catch_up(hw)
    last_epoch = f.log[-1].leader_epoch
    assert last_epoch > 0, "the source's leader epoch did not move; the test needs it to"

    status, body = mg.post("stop", MIRROR, topic, [0])
    assert status == 200, body
    _, first = f.fetch_once()
    assert [b.kind for b in first] == ["abort", "barrier"], [b.kind for b in first]
    f.close()
    # The seal is persisted before it is served; the fetcher never fetched at its end.
    assert mg.partition(topic, 0)["state"] == "STOPPING"

    harness.abandon_client(tp)
    a.stop(graceful=False)
    time.sleep(1.1)  # a rebuilt plan stamped with its own time would differ in milliseconds
    if restart == "graceful":
        mg.restart()
    else:
        mg.kill9()
        mg.start()

    # The destination leader lost the sealing batches: its fetcher asks at the cut again.
    again = StandInFetcher(topic, version=4)
    again.leo = hw
    again.conn = rawkafka.Connection(HOST, spec.node_port, timeout=10)
    _, second = again.fetch_once()
    print(f"{restart}: first served {[(b.kind, b.base_offset, b.leader_epoch) for b in first]}, "
          f"served again {[(b.kind, b.base_offset, b.leader_epoch) for b in second]}, "
          f"same bytes {[a.raw == b.raw for a, b in zip(first, second)]}")
    assert [b.kind for b in second] == ["abort", "barrier"], [b.kind for b in second]
    assert [b.leader_epoch for b in second] == [last_epoch, last_epoch]
    assert [b.raw for b in second] == [b.raw for b in first]
    again.fetch_once()
    assert mg.partition(topic, 0)["state"] == "STOPPED"
    again.close()
