"""Only the destination fetcher moves a seal (SPEC 3, "Who moves a seal"): with
`fetcher_bootstrap` / `fetcher_node_port_base` in a [[mirror]], fetches on those ports are
the destination fetcher's; readers on the mirror's other ports (a consumer, a dump tool)
are served but never take a cut, never complete a seal and never feed the producer state,
and the open transactions of the seal are those open at the cut.

Apache Kafka is the source and the state cluster (each test has its own state topic).
"""

from __future__ import annotations

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


def start_with_fetcher_port(kafka, mirror_factory, topic: str):
    spec = MirrorSpec(MIRROR, kafka.bootstrap, node_ids=list(kafka.node_ids))
    mg = mirror_factory(kafka.bootstrap, [spec], start=False)
    taken = {mg.admin_port, spec.bootstrap_port, *(spec.node_port_of(n) for n in spec.node_ids)}
    fetcher_port = harness.free_port(taken)
    taken.add(fetcher_port)
    fetcher_base = harness.free_node_port_base(taken, nodes=spec.node_ids)
    text = mg.config_path.read_text()
    text = with_state_topic(text, f"__mirror_state_{topic}")
    text = text.replace(f'name = "{MIRROR}"\n',
                        f'name = "{MIRROR}"\nfetcher_bootstrap = "{harness.HOST}:{fetcher_port}"\n'
                        f"fetcher_node_port_base = {fetcher_base}\n", 1)
    mg.config_path.write_text(text)
    mg.start()
    mg.wait_sources_known()
    return mg, f"{harness.HOST}:{fetcher_port}"


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
    assert fetcher.conn.sock.getpeername()[1] != mg.mirrors[MIRROR].node_port, "the fetcher has its own port"
    fetcher.catch_up(hw)
    open_batch = [b for b in fetcher.log if b.is_transactional and not b.is_control][-1]

    # The transaction is committed on the source and more data follows; a reader on the
    # mirror's main listener reads all of it (the fetcher has not yet).
    tp.commit_transaction(20)
    send(idem, topic, [b"later-%d" % i for i in range(2)])
    reader = StandInFetcher(topic).connect(mg.mirrors[MIRROR].bootstrap)
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
