"""Seal details under a fetcher without LastFetchedEpoch (issue 13, item 8), with Apache
Kafka as source and state cluster:

- Fetch < v12 carries no LastFetchedEpoch: the sealing batches are stamped with the
  partition leader epoch of the last batch mirrorguard forwarded (here > 0: the source's
  leader changed before the data was written), not 0;
- once the seal is complete (STOPPED) the partition's shadow producer state is expired,
  open transactions included (idle expiry never drops open transactions).
"""

from __future__ import annotations

import time

import harness
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
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
    send(idempotent_producer(k.bootstrap), topic, [b"e0-%d" % i for i in range(2)])
    # A leader change on the source: the next batches carry a higher leader epoch.
    k.nodes[0].restart()
    deadline = time.monotonic() + 60
    while True:
        try:
            idem = idempotent_producer(k.bootstrap)
            send(idem, topic, [b"e1-%d" % i for i in range(2)])
            break
        except Exception:  # noqa: BLE001 - the broker is still electing leaders
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
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
