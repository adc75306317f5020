"""Open transactions are taken as they are AT THE CUT (issue 13, item 4), even when the
shadow producer state is ahead of it: mirrorguard walked a response that the destination
fetcher then lost, and that response carried the COMMIT marker of a transaction the
destination holds open. The cut is the fetcher's position, below the marker, so the seal
must abort that transaction; before the fix the shadow state saw it closed and the seal
held only the barrier, leaving a transaction on the destination that never ends.

Apache Kafka is the source and the state cluster; the destination is the reference
destination of kafka_dest.py (Kafka's UnifiedLog on the replication path, a broker-like
fetcher that loses one response on purpose with ``drop_next``).
"""

from __future__ import annotations

import os
import signal

import harness
from kafka_dest import dest_hw_bootstrap, kafka_dest_factory  # noqa: F401 - fixture
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    high_watermark,
    idempotent_producer,
    mirror_factory,
    send,
    transactional_producer,
)

MIRROR = "src-to-dst"


def test_transaction_closed_in_a_lost_response_is_aborted_at_the_cut(kafka1, kafka_dest_factory,  # noqa: F811
                                                                      mirror_factory):
    topic = harness.topic_name("lostm")
    harness.create_topics(kafka1.bootstrap, [topic])
    dest = kafka_dest_factory("lost")
    mg = mirror_factory(kafka1.bootstrap, [MirrorSpec.of(MIRROR, kafka1, destination_hw=dest_hw_bootstrap(dest))])
    mg.wait_sources_known()

    send(idempotent_producer(kafka1.bootstrap), topic, [b"d-0", b"d-1"])
    tp = transactional_producer(kafka1.bootstrap, f"txn-{topic}")
    tp.begin_transaction()
    tp.produce(topic, value=b"open-0", partition=0)
    assert tp.flush(20) == 0
    hw = high_watermark(kafka1.bootstrap, topic)
    assert hw == 3

    # MaxWaitMs 20 s: once caught up, the fetcher's next request waits at the source until
    # the COMMIT marker arrives, so the marker travels in that very response.
    f = dest.mirror(MIRROR, mg.mirrors[MIRROR].bootstrap, [(topic, 0)], max_wait_ms=20000,
                    request_timeout_ms=30000)
    f.catch_up(topic, hw)
    st = dest.state(topic)
    open_pid = next(p for p, v in st["producers"].items() if v["open_txn_first_offset"] == 2)
    open_epoch = st["producers"][open_pid]["epoch"]
    assert st["last_stable_offset"] == 2, st

    def txn_closed_in_shadow_state() -> bool:
        ps = mg.get(f"/v1/partitions/{topic}/0/producers")["producers"]
        return any(p["producer_id"] == open_pid and p["open_transaction_first_offset"] is None for p in ps)

    def fetch_waiting_at_source() -> bool:
        # A Fetch received by mirrorguard and not yet answered: the long poll that the COMMIT
        # marker will end. Freezing the fetcher before it has sent that request (it is still
        # appending the last response) would leave nobody to carry the marker through.
        m = mg.metrics()
        labels = {"listener": f"{MIRROR}-fetcher", "api": "Fetch"}
        received = m.counter("mirrorguard_requests_total", **labels)
        answered = m.sum("mirrorguard_request_duration_seconds_count", **labels)
        return received > answered

    harness.wait_until(fetch_waiting_at_source, 15, interval=0.02,
                       what="the fetcher's next Fetch waiting at the source")

    # The next response is lost. The fetcher is frozen meanwhile, so the commit's response
    # is walked by mirrorguard and the partition is stopped before the fetcher (dropping that
    # response, reconnecting, fetching again from offset 3) can append the marker.
    f.drop_next(1)
    dest.proc.send_signal(signal.SIGSTOP)
    try:
        tp.commit_transaction(20)
        harness.wait_until(txn_closed_in_shadow_state, 15, interval=0.05,
                           what="the COMMIT marker walked by mirrorguard")
        status, body = mg.post("stop", MIRROR, topic, [0])
        assert status == 200, body
    finally:
        os.kill(dest.proc.pid, signal.SIGCONT)
    assert high_watermark(kafka1.bootstrap, topic) == 4, "the COMMIT marker is at 3 on the source"

    harness.wait_until(lambda: mg.partition(topic, 0)["state"] == "STOPPED", 20, interval=0.05,
                       what="partition STOPPED")
    view = mg.partition(topic, 0)
    assert view["cut"] == hw and view["seal_batches"] == 2, view
    f.catch_up(topic, hw + 2)
    r = f.report()
    assert r["dropped"] == 1, r

    # The destination log: the transaction's data, then the seal's ABORT for it at the cut,
    # then the barrier; never the source's COMMIT.
    kinds = [(b["base_offset"], b["kind"], b["producer_id"]) for b in dest.batches(topic, values=False)]
    idem_pid = kinds[0][2]
    assert kinds == [(0, "DATA", idem_pid), (2, "DATA", open_pid), (3, "ABORT", open_pid), (4, "TYPE_7", -1)], kinds
    st = dest.state(topic)
    assert [(m["offset"], m["producer_id"], m["type"], m["closed_txn_first_offset"]) for m in st["markers"]] == [
        (3, open_pid, "ABORT", 2), (4, -1, "TYPE_7", None)], st["markers"]
    assert st["producers"][open_pid]["open_txn_first_offset"] is None
    assert st["producers"][open_pid]["epoch"] == open_epoch
    assert st["last_stable_offset"] == 5 and st["first_unstable_offset"] is None, st
    assert st["aborted_txns"] == [{"producer_id": open_pid, "first_offset": 2}], st["aborted_txns"]
    ws = [w for w in dest.warnings() if "marker" in w.lower() or "epoch" in w.lower()]
    assert ws == [], ws
    seal = mg.metrics().sum("mirrorguard_seal_events_total", mirror=MIRROR, kind="txn_closed_past_cut_aborted")
    assert seal == 1, seal
    f.stop()
    dest.close_log(topic)
