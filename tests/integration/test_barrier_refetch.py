"""A barrier fetched again must not expire producer state a second time (issue 13, item
2; SPEC 3: "a re-fetch of a range already seen ... is idempotent, barrier included").

The source log must hold a MIRROR_PID_RESET barrier (a failback: the source was itself
a sealed destination). Apache Kafka refuses control batches from clients, so the source
here is Tansu, which stores one written with Produce; the fetch path under test is
mirrorguard's own. A reader starting at 0 (here: a second fetcher on the mirror listener,
which without a fetcher listener counts as the fetcher) re-fetches the barrier after a
transaction was opened past it; the seal must still abort that transaction.
"""

from __future__ import annotations


import harness
import rawkafka
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    StandInFetcher,
    high_watermark,
    idempotent_producer,
    mirror_factory,
    send,
    transactional_producer,
)

from kafka_dest import barrier_batch

MIRROR = "b-to-a"
TOPIC = "failback"


def test_refetched_barrier_keeps_producers_seen_after_it(broker_factory, mirror_factory):
    src = broker_factory()
    state = broker_factory()
    harness.create_topics(src.bootstrap, [TOPIC])
    harness.create_topics(state.bootstrap, [TOPIC])
    send(idempotent_producer(src.bootstrap), TOPIC, [b"before-%d" % i for i in range(2)])
    host, port = src.bootstrap.rsplit(":", 1)
    with rawkafka.Connection(host, int(port)) as c:
        err, base = rawkafka.produce_v3(c, TOPIC, 0, barrier_batch("some-earlier-source"))
    assert err == 0, err
    tp = transactional_producer(src.bootstrap, "after-barrier")
    tp.begin_transaction()
    tp.produce(TOPIC, value=b"open-after-barrier", partition=0)
    assert tp.flush(20) == 0
    hw = high_watermark(src.bootstrap, TOPIC)

    mg = mirror_factory(state.bootstrap, [MirrorSpec(MIRROR, src.bootstrap)])
    mg.wait_sources_known()
    f = StandInFetcher(TOPIC).connect(mg.mirrors[MIRROR].bootstrap)
    f.catch_up(hw)
    assert [b.kind for b in f.log] == ["data", "barrier", "data"], [b.kind for b in f.log]
    assert mg.partition(TOPIC, 0)["producers"] == 1, "only the producer after the barrier"

    # A reader from 0 fetches the same range again, barrier included.
    again = StandInFetcher(TOPIC).connect(mg.mirrors[MIRROR].bootstrap)
    again.catch_up(hw)
    assert mg.partition(TOPIC, 0)["producers"] == 1, "the re-fetched barrier expired producer state again"

    status, body = mg.post("stop", MIRROR, TOPIC, [0])
    assert status == 200, body
    res, got = f.fetch_once()
    assert [b.kind for b in got] == ["abort", "barrier"], \
        f"seal {[b.kind for b in got]}: the open transaction after the barrier must be aborted"
    assert got[0].producer_id == f.log[2].producer_id
    f.close()
    again.close()
