"""Only the destination fetcher moves a seal (SPEC 3, "Who moves a seal"): with
`fetcher_bootstrap` / `fetcher_node_port_base` in a [[mirror]], fetches on those ports are
the destination fetcher's; readers on the mirror's other ports (a consumer, a dump tool)
are served but never take a cut, never complete a seal and never feed the producer state,
and the open transactions of the seal are those open at the cut.

Apache Kafka is the source and the state cluster (each test has its own state topic).
"""

from __future__ import annotations

import harness
from kafka_dest import dest_hw_bootstrap, kafka_dest_factory  # noqa: F401 - fixture
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    with_state_topic,
    MirrorSpec,
    StandInFetcher,
    high_watermark,
    idempotent_producer,
    mirror_factory,
    read_state_records,
    send,
    transactional_producer,
)

MIRROR = "src-to-dst"


def start_with_fetcher_port(kafka, mirror_factory, topic: str, destination_hw: str | None = None):
    """A mirror with fetcher ports (the harness's default: `spec.bootstrap` is the fetcher's
    listener, `spec.reader_bootstrap` the readers'). `destination_hw`: the stand-in's
    listener when the destination holds a log (the seal completes on its high watermark);
    without it the destination is a Python fetcher that writes no log (the harness's
    `fetcher_offset` opt-out)."""
    spec = MirrorSpec(MIRROR, kafka.bootstrap, node_ids=list(kafka.node_ids), destination_hw=destination_hw)
    mg = mirror_factory(kafka.bootstrap, [spec], start=False)
    text = mg.config_path.read_text()
    text = with_state_topic(text, f"__mirror_state_{topic}")
    assert f'fetcher_bootstrap = "{spec.bootstrap}"' in text
    mg.config_path.write_text(text)
    mg.start()
    mg.wait_sources_known()
    return mg, spec.bootstrap


def test_readers_never_move_a_seal_and_open_transactions_are_taken_at_the_cut(kafka1, mirror_factory):
    topic = harness.topic_name("fid")
    harness.create_topics(kafka1.bootstrap, [topic])
    mg, fetcher_bootstrap = start_with_fetcher_port(kafka1, mirror_factory, topic)

    idem = idempotent_producer(kafka1.bootstrap)
    send(idem, topic, [b"d-%d" % i for i in range(3)])
    tp = transactional_producer(kafka1.bootstrap, f"txn-{topic}")
    tp.begin_transaction()
    tp.produce(topic, value=b"open-0", partition=0)
    assert tp.flush(20) == 0
    hw = high_watermark(kafka1.bootstrap, topic)

    fetcher = StandInFetcher(topic).connect(fetcher_bootstrap)
    assert fetcher.conn.sock.getpeername()[1] != mg.mirrors[MIRROR].reader_node_port_of(mg.mirrors[MIRROR].node_ids[0]), "the fetcher has its own port"
    fetcher.catch_up(hw)
    open_batch = [b for b in fetcher.log if b.is_transactional and not b.is_control][-1]

    # The transaction is committed on the source and more data follows; a reader on the
    # mirror's main listener reads all of it (the fetcher has not yet).
    tp.commit_transaction(20)
    send(idem, topic, [b"later-%d" % i for i in range(2)])
    reader = StandInFetcher(topic).connect(mg.mirrors[MIRROR].reader_bootstrap)
    # The commit marker is written asynchronously: read until it and the later data are in.
    reader.follow(lambda r: any(b.kind == "commit" for b in r.log)
                  and sum(1 for b in r.log for v in b.values if v and v.startswith(b"later")) == 2,
                  what="reader saw the commit and the later data")
    end = reader.leo

    status, body = mg.post("stop", MIRROR, topic, [0])
    assert status == 200, body
    # Readers fetching anywhere take no cut: from 0, from the end, past the end.
    for offset in (0, end, end + 5):
        reader.leo = offset
        res, got = reader.fetch_once()
        assert got == [], [b.kind for b in got]
    e = mg.partition(topic, 0)
    assert e["state"] == "STOPPING" and e["cut"] is None, e

    # The fetcher's next fetch takes the cut at its own position, and the transaction
    # open there is aborted (the reader saw its commit, which lies past the cut).
    cut = fetcher.leo
    assert cut == hw < end
    res, got = fetcher.fetch_once()
    assert [b.kind for b in got] == ["abort", "barrier"], [b.kind for b in got]
    assert got[0].producer_id == open_batch.producer_id and got[0].base_offset == cut
    e = mg.partition(topic, 0)
    assert e["state"] == "STOPPING" and e["cut"] == cut and e["seal_batches"] == 2, e

    # A reader at the cut is served the seal, and past it nothing; neither completes it.
    reader.leo = cut
    reader.log = []
    res, got = reader.fetch_once()
    assert [b.kind for b in got] == ["abort", "barrier"]
    res, got = reader.fetch_once()
    assert got == []
    e = mg.partition(topic, 0)
    assert e["state"] == "STOPPING", e

    # Only the fetcher completes it.
    fetcher.fetch_once()
    e = mg.partition(topic, 0)
    assert e["state"] == "STOPPED" and e["cut"] == cut, e
    fetcher.close()
    reader.close()


def test_a_reader_below_the_cut_gets_the_sources_records_up_to_the_cut(kafka1, mirror_factory):
    """What the destination holds below the cut is the source's log up to the cut: a reader
    there (a consumer, a dump tool) is forwarded to the source and the answer is cut at the
    cut, mapped like the fetcher's; from the cut on it gets the seal (STOPPING) or nothing
    (STOPPED), never the source's records past the cut."""
    topic = harness.topic_name("rbc")
    harness.create_topics(kafka1.bootstrap, [topic])
    mg, fetcher_bootstrap = start_with_fetcher_port(kafka1, mirror_factory, topic)

    idem = idempotent_producer(kafka1.bootstrap)
    send(idem, topic, [b"d-%d" % i for i in range(3)])
    tp = transactional_producer(kafka1.bootstrap, f"txn-{topic}")
    tp.begin_transaction()
    tp.produce(topic, value=b"open-0", partition=0)
    assert tp.flush(20) == 0
    send(idem, topic, [b"e-%d" % i for i in range(2)])
    cut = high_watermark(kafka1.bootstrap, topic)

    fetcher = StandInFetcher(topic).connect(fetcher_bootstrap)
    fetcher.catch_up(cut)
    assert fetcher.leo == cut
    # The source moves on past the cut: committed, then more data.
    tp.commit_transaction(20)
    send(idem, topic, [b"later-%d" % i for i in range(2)])

    def below_cut(log):
        return [(b.base_offset, b.kind, b.producer_id, b.values) for b in log if b.base_offset < cut]

    status, body = mg.post("stop", MIRROR, topic, [0])
    assert status == 200, body
    res, seal = fetcher.fetch_once()
    assert [b.kind for b in seal] == ["abort", "barrier"]
    expected = below_cut(fetcher.log)
    assert len(expected) >= 3, expected
    open_batch = next(b for b in fetcher.log if b.is_transactional and not b.is_control and b.base_offset < cut)

    for state in ("STOPPING", "STOPPED"):
        assert mg.partition(topic, 0)["state"] == state
        reader = StandInFetcher(topic).connect(mg.mirrors[MIRROR].reader_bootstrap)
        reader.catch_up(cut)
        assert below_cut(reader.log) == expected, state
        assert reader.leo == cut, (state, [b.kind for b in reader.log])
        assert reader.responses[-1].high_watermark <= cut + 2, state
        # Below the cut by one batch: that batch and nothing after it.
        reader.leo = expected[-1][0]
        reader.log = []
        res, got = reader.fetch_once()
        assert [(b.base_offset, b.kind) for b in got] == [(expected[-1][0], expected[-1][1])], state
        res, got = reader.fetch_once()
        if state == "STOPPING":
            assert [b.kind for b in got] == ["abort", "barrier"]
        else:
            assert got == []
        assert not any(v and v.startswith(b"later") for b in reader.log for v in b.values)
        reader.close()
        # read_committed: the transaction open at the cut is aborted there by the seal (the
        # source committed it past the cut), and the reader is told so.
        rc = StandInFetcher(topic).connect(mg.mirrors[MIRROR].reader_bootstrap)
        res, got = rc.fetch_once(isolation_level=1)
        assert (open_batch.producer_id, open_batch.base_offset) in (res.aborted_transactions or []), \
            (state, res.aborted_transactions)
        assert res.last_stable_offset <= cut + 2 and all(b.base_offset < cut for b in got), state
        rc.close()
        e = mg.partition(topic, 0)
        assert e["state"] == state and e["cut"] == cut, e
        if state == "STOPPING":
            fetcher.fetch_once()  # only the fetcher completes the seal
    fetcher.close()

    # A producer new to the partition writes past the cut only: a reader below the cut
    # never gets its batches, so they claim nothing (no type-6 record, no producer tracked).
    newcomer = idempotent_producer(kafka1.bootstrap)
    send(newcomer, topic, [b"past-%d" % i for i in range(2)])
    producers = mg.metrics().sum("mirrorguard_producer_state_producers")
    claims = len([r for r in read_state_records(kafka1.bootstrap, f"__mirror_state_{topic}") if r.type == 6])
    reader = StandInFetcher(topic).connect(mg.mirrors[MIRROR].reader_bootstrap)
    reader.catch_up(cut)
    assert below_cut(reader.log) == expected
    assert not any(v and v.startswith(b"past") for b in reader.log for v in b.values)
    reader.close()
    assert mg.metrics().sum("mirrorguard_producer_state_producers") == producers
    assert len([r for r in read_state_records(kafka1.bootstrap, f"__mirror_state_{topic}") if r.type == 6]) == claims

    # A restart in STOPPED (or a standby tailing the state) restores the seal's open
    # transactions from its snapshot: a read_committed reader below the cut is still told
    # that the transaction is aborted there.
    mg.restart()
    mg.wait_sources_known()
    harness.wait_until(lambda: mg.partition(topic, 0)["state"] == "STOPPED", 20, interval=0.05,
                       what="partition STOPPED restored")
    rc = StandInFetcher(topic).connect(mg.mirrors[MIRROR].reader_bootstrap)
    res, got = rc.fetch_once(isolation_level=1)
    assert (open_batch.producer_id, open_batch.base_offset) in (res.aborted_transactions or []), \
        ("after restart", res.aborted_transactions)
    assert all(b.base_offset < cut for b in got) and got
    rc.close()


def test_a_session_reader_copies_a_sealed_partition_up_to_the_cut(kafka1, mirror_factory,
                                                                    kafka_dest_factory):  # noqa: F811
    """The same with broker-like fetchers (Kafka's FetchSessionHandler, incremental
    sessions): the destination fetcher seals the partition; afterwards a second fetcher on
    the mirror's reader port copies it from offset 0 and ends with exactly the source's
    batches below the cut, never a record of the source past it. The destination holds a
    log: the seal completes on its high watermark (mirrorguard's default rule), so the
    partition is STOPPED only with the barrier in the destination's log."""
    topic = harness.topic_name("rsess")
    harness.create_topics(kafka1.bootstrap, [topic])
    dest = kafka_dest_factory("rsess")
    mg, fetcher_bootstrap = start_with_fetcher_port(kafka1, mirror_factory, topic,
                                                    destination_hw=dest_hw_bootstrap(dest))
    idem = idempotent_producer(kafka1.bootstrap)
    send(idem, topic, [b"d-%d" % i for i in range(4)])
    cut = high_watermark(kafka1.bootstrap, topic)

    f = dest.mirror("fetcher", fetcher_bootstrap, [(topic, 0)])
    f.catch_up(topic, cut)
    status, body = mg.post("stop", MIRROR, topic, [0])
    assert status == 200, body
    harness.wait_until(lambda: mg.partition(topic, 0)["state"] == "STOPPED", 20, interval=0.05,
                       what="partition STOPPED")
    # STOPPED only once the destination's high watermark passed the barrier (no
    # transaction was open: the seal is the barrier alone).
    assert dest.state(topic)["high_watermark"] == cut + 1, dest.state(topic)
    view = mg.partition(topic, 0)
    assert (view["cut"], view["seal_batches"]) == (cut, 1), view
    send(idem, topic, [b"later-%d" % i for i in range(3)])

    copy = harness.topic_name("copy")
    r = dest.mirror("reader", mg.mirrors[MIRROR].reader_bootstrap, [{"topic": copy, "partition": 0, "source_topic": topic}])
    r.catch_up(copy, cut)
    r.follow(lambda: r.report()["incremental_requests"] >= 3, 10, "incremental requests")
    assert r.position(copy) == cut, r.report()
    mine = [(b["base_offset"], b["producer_id"], b["values"]) for b in dest.batches(copy)]
    theirs = [(b["base_offset"], b["producer_id"], b["values"]) for b in dest.batches(topic) if b["base_offset"] < cut]
    assert mine == theirs and mine, (mine, theirs)
    assert r.report()["errors"] == {}, r.report()
    assert mg.partition(topic, 0)["state"] == "STOPPED"
    r.stop()
    f.stop()
