"""The reference destination (tests/kafka-dest): Kafka's storage engine on the replication
path, and a fetcher that behaves like a broker's, against a real Apache Kafka 4.4 source.

The engine facts the scenario suite relies on (kafka-wire.md sections 3 and 5) are asserted
here on Kafka's own ProducerStateManager, not on a model; the fetcher's session, re-fetch and
restart behaviour on Kafka's own FetchSessionHandler and a real broker's sessions.
"""

from __future__ import annotations

import pytest

import harness
import mirror_harness
from kafka_dest import KafkaDestError, control_batch, data_batch, kafka_dest_factory  # noqa: F401

T = "t"


@pytest.fixture
def dest(kafka_dest_factory):  # noqa: F811
    return kafka_dest_factory("engine")


# ----------------------------------------------------------------------------- engine facts


def test_append_as_follower_takes_the_batches_epochs_and_moves_the_log_end(dest):
    dest.open(T)
    # Source epochs above anything the destination knows: appended, not skipped.
    st = dest.append(T, data_batch([b"x"], pid=3, epoch=0, seq=0, leader_epoch=7))["state"]
    assert st["log_end_offset"] == 1 and st["leader_epochs"] == [[7, 0]]
    st = dest.append(T, data_batch([b"y", b"z"], pid=3, epoch=0, seq=1, base_offset=1, leader_epoch=9))["state"]
    assert st["log_end_offset"] == 3 and st["leader_epochs"] == [[7, 0], [9, 1]]
    assert st["high_watermark"] == 3 == st["last_stable_offset"]


def test_lower_producer_epoch_on_replication_is_a_warning_and_regresses(dest):
    dest.open(T)
    dest.append(T, data_batch([b"a"], pid=7, epoch=5, seq=0, base_offset=0))
    st = dest.append(T, data_batch([b"b"], pid=7, epoch=3, seq=0, base_offset=1))["state"]
    assert st["producers"][7]["epoch"] == 3 and st["log_end_offset"] == 2
    # Kafka 4.4's wording (ProducerAppendInfo; TV-1 = transaction version 1).
    assert [w for w in dest.warnings() if "last seen epoch" in w] == [
        "Epoch of producer 7 at offset 1 in t-0 is 3, which is < the last seen epoch 5 (TV-1)"]
    # The entry now holds only the new epoch's batch: the old epoch's metadata is gone.
    assert st["producers"][7]["batches"] == [[0, 0, 1, 1]]


def test_sequences_unchecked_on_replication(dest):
    dest.open(T)
    dest.append(T, data_batch([b"a"], pid=1, epoch=0, seq=0, base_offset=0))
    st = dest.append(T, data_batch([b"b"], pid=1, epoch=0, seq=10, base_offset=1))["state"]
    assert st["producers"][1]["last_sequence"] == 10  # gap 0 -> 10 accepted without a word
    st = dest.append(T, data_batch([b"c"], pid=1, epoch=0, seq=0, base_offset=2))["state"]
    assert st["producers"][1]["last_sequence"] == 0  # and a restart at 0 too
    assert [b[:2] for b in st["producers"][1]["batches"]] == [[0, 0], [10, 10], [0, 0]]
    assert not [w for w in dest.warnings() if "producer 1 " in w]


def test_marker_closes_whatever_transaction_its_pid_has_open_and_lso_waits_for_it(dest):
    dest.open(T)
    dest.append(T, data_batch([b"t0"], pid=5, epoch=0, seq=0, transactional=True, base_offset=0))
    st = dest.state(T)
    assert st["first_unstable_offset"] == 0 and st["last_stable_offset"] == 0 and st["high_watermark"] == 1
    assert st["producers"][5]["open_txn_first_offset"] == 0
    st = dest.append(T, control_batch(5, 0, 1, base_offset=1))["state"]  # COMMIT by "anyone" with PID 5
    assert st["markers"] == [{"offset": 1, "producer_id": 5, "producer_epoch": 0, "type": "COMMIT",
                              "closed_txn_first_offset": 0}]
    assert st["last_stable_offset"] == 2 and st["first_unstable_offset"] is None
    st = dest.append(T, control_batch(9, 0, 0, base_offset=2))["state"]  # ABORT with nothing open
    assert st["markers"][-1]["closed_txn_first_offset"] is None and st["log_end_offset"] == 3
    assert st["aborted_txns"] == []


def test_control_type_7_is_not_a_marker_kafka_knows(dest):
    """MIRROR_PID_RESET (type 7) with PID -1 is stored and ignored by a stock engine; with a
    real PID Kafka's engine rejects the batch (a broker's fetcher would fail the partition)."""
    dest.open(T)
    dest.append(T, data_batch([b"a"], pid=1, epoch=0, seq=0, base_offset=0))
    st = dest.append(T, control_batch(-1, -1, 7, base_offset=1, value=b"\x00\x00\x01\x00"))["state"]
    assert st["log_end_offset"] == 2 and sorted(st["producers"]) == [1]  # no state expired
    assert st["markers"][-1]["type"] == "TYPE_7"
    with pytest.raises(KafkaDestError) as e:
        dest.append(T, control_batch(3, 0, 7, base_offset=2, value=b"\x00\x00\x01\x00"))
    st = dest.state(T)
    assert "Invalid control record type for end transaction marker UNKNOWN" in str(e.value)
    assert st["log_end_offset"] == 2 and st["failed"], (str(e.value), st)


def test_negative_pids_get_no_producer_state(dest):
    dest.open(T)
    st = dest.append(T, data_batch([b"a"], pid=-7, epoch=0, seq=0, transactional=True))["state"]
    assert st["producers"] == {} and st["first_unstable_offset"] is None and st["last_stable_offset"] == 1


def test_crash_then_log_recovery_rebuilds_producer_state(kafka_dest_factory):  # noqa: F811
    d = kafka_dest_factory("crash")
    d.open(T)
    d.append(T, data_batch([b"a"], pid=4, epoch=2, seq=0, transactional=True, base_offset=0))
    d.append(T, data_batch([b"b"], pid=4, epoch=2, seq=1, transactional=True, base_offset=1))
    d.kill()
    d.start()
    assert d.clean_start is False
    st = d.open(T)
    assert st["log_end_offset"] == 2
    st = d.state(T)
    assert st["producers"][4]["open_txn_first_offset"] == 0 and st["producers"][4]["last_sequence"] == 1
    assert any("Recovering unflushed segment" in x["message"] or "recover" in x["message"].lower() for x in d.logs())


# ----------------------------------------------------------------------------- the fetcher


def _source_batches(bootstrap: str, topic: str, partition: int = 0) -> list[tuple[int, int, int, list]]:
    return [(b.base_offset, b.producer_id, b.base_sequence, b.values)
            for b in mirror_harness.direct_batches(bootstrap, topic, partition)]


def _dest_batches(d, topic: str, partition: int = 0) -> list[tuple[int, int, int, list]]:
    return [(b["base_offset"], b["producer_id"], b["base_sequence"], b["values"]) for b in d.batches(topic, partition)]


def test_fetcher_multi_partition_incremental_session(kafka1, kafka_dest_factory):  # noqa: F811
    topic = harness.topic_name("fs")
    harness.create_topics(kafka1.bootstrap, [topic], partitions=3)
    p = mirror_harness.idempotent_producer(kafka1.bootstrap)
    for part in range(3):
        mirror_harness.send(p, topic, [b"p%d-%d" % (part, i) for i in range(3)], partition=part)
    d = kafka_dest_factory("fs")
    f = d.mirror("src", kafka1.bootstrap, [(topic, 0), (topic, 1), (topic, 2)])
    for part in range(3):
        f.catch_up(topic, 3, part)
    mirror_harness.send(p, topic, [b"late"], partition=1)
    f.catch_up(topic, 4, 1)
    r = f.report()
    # One full request opened a session; everything after was incremental in that session.
    assert r["full_requests"] == 1 and r["incremental_requests"] >= 2, r
    assert r["session_id"] > 0 and r["session_epoch"] >= 2 and r["errors"] == {} and r["session_errors"] == 0
    assert r["fetch_version"] >= 13  # by topic id
    for part in range(3):
        assert _dest_batches(d, topic, part) == _source_batches(kafka1.bootstrap, topic, part)


@pytest.mark.parametrize("mode", ["drop", "timeout"])
def test_fetcher_refetches_after_a_lost_response(kafka1, kafka_dest_factory, mode):  # noqa: F811
    topic = harness.topic_name("drop")
    harness.create_topics(kafka1.bootstrap, [topic])
    p = mirror_harness.idempotent_producer(kafka1.bootstrap)
    mirror_harness.send(p, topic, [b"a-%d" % i for i in range(3)])
    d = kafka_dest_factory("drop")
    f = d.mirror("src", kafka1.bootstrap, [(topic, 0)], request_timeout_ms=1000)
    f.catch_up(topic, 3)
    f.drop_next(1, mode)
    # 'drop' loses the response in flight (it may carry b-*); 'timeout' the next request's.
    mirror_harness.send(p, topic, [b"b-%d" % i for i in range(3)])
    f.follow(lambda: f.report()["dropped"] + f.report()["timeouts"] == 1, 10, "the response lost")
    f.catch_up(topic, 6, timeout=20)
    # The lost response is followed by a new connection and a new session (full request).
    f.follow(lambda: f.report()["full_requests"] == 2, 10, "a second full request")
    r = f.report()
    assert (r["dropped"], r["timeouts"]) == ((1, 0) if mode == "drop" else (0, 1)), str(r)
    assert r["full_requests"] == 2 and r["connects"] == 2, r
    assert _dest_batches(d, topic) == _source_batches(kafka1.bootstrap, topic)  # no gap, no duplicate


def test_fetcher_restarts_from_the_log_end_after_a_crash(kafka1, kafka_dest_factory):  # noqa: F811
    topic = harness.topic_name("crash")
    harness.create_topics(kafka1.bootstrap, [topic])
    p = mirror_harness.idempotent_producer(kafka1.bootstrap)
    mirror_harness.send(p, topic, [b"a-%d" % i for i in range(4)])
    d = kafka_dest_factory("crash")
    f = d.mirror("src", kafka1.bootstrap, [(topic, 0)])
    f.catch_up(topic, 4)
    d.kill()
    mirror_harness.send(p, topic, [b"b-%d" % i for i in range(2)])
    d.start()
    assert d.clean_start is False
    f = d.mirror("src", kafka1.bootstrap, [(topic, 0)])
    assert f.position(topic) >= 4
    f.catch_up(topic, 6)
    assert _dest_batches(d, topic) == _source_batches(kafka1.bootstrap, topic)
    assert d.state(topic)["producers"][next(iter(d.state(topic)["producers"]))]["last_sequence"] == 5


def test_follower_fetch_from_a_non_replica_is_refused_by_kafka(kafka1, kafka_dest_factory):  # noqa: F811
    """Why the fetcher fetches as a consumer (replica id -1) by default."""
    topic = harness.topic_name("rid")
    harness.create_topics(kafka1.bootstrap, [topic])
    mirror_harness.send(mirror_harness.idempotent_producer(kafka1.bootstrap), topic, [b"x"])
    d = kafka_dest_factory("rid")
    f = d.mirror("src", kafka1.bootstrap, [(topic, 0)], replica_id=111)
    f.follow(lambda: f.report()["errors"], 10, "an error")
    r = f.report()
    assert d.state(topic)["log_end_offset"] == 0
    assert set(r["errors"]) & {"NOT_LEADER_OR_FOLLOWER", "UNKNOWN_LEADER_EPOCH", "INCONSISTENT_CLUSTER_ID",
                               "UNKNOWN_SERVER_ERROR"}, r["errors"]


# ----------------------------------------------------------------------------- promotion


def test_promotion_hands_the_log_to_a_broker_and_kafka_truncates_higher_source_epochs(kafka_factory,
                                                                                       kafka_dest_factory):  # noqa: F811
    """The stand-in's log, built with the broker's topic id, opened by a real Kafka 4.4
    broker; source epochs above the broker's own are dropped from the epoch cache with a
    WARN (the batches keep them), and kafka-dump-log agrees with `mirrorguard dump`."""
    from harness import MIRRORGUARD_BIN
    from kafka_dest import prepare_promotion, promote
    from scenario_support import dumps_agree

    b = kafka_factory(cluster_id=harness.cluster_id(), name="B")
    topic_id = prepare_promotion(b, T)
    d = kafka_dest_factory("promo")
    assert d.open(T, topic_id=topic_id)["topic_id"] == topic_id
    d.append(T, data_batch([b"x"], pid=3, epoch=0, seq=0, leader_epoch=7))
    d.append(T, data_batch([b"y"], pid=3, epoch=0, seq=1, base_offset=1, leader_epoch=9))
    assert d.state(T)["leader_epochs"] == [[7, 0], [9, 1]]
    promote(d, b, T)
    mirror_harness.send(mirror_harness.idempotent_producer(b.bootstrap), T, [b"z"])
    got = [(x.base_offset, x.leader_epoch, x.producer_id, x.values) for x in mirror_harness.direct_batches(b.bootstrap, T)]
    assert got[:2] == [(0, 7, 3, [b"x"]), (1, 9, 3, [b"y"])] and got[2][0] == 2 and got[2][1] < 7, got
    own = got[2][1]
    warn = [x for x in b.nodes[0].log_path.read_text().splitlines()
            if "WARN [LeaderEpochCache " + T + "-0] New epoch entry" in x]
    assert warn and (f"EpochEntry[epoch={own}, startOffset=2] caused truncation of conflicting entries "
                     "[EpochEntry[epoch=9, startOffset=1], EpochEntry[epoch=7, startOffset=0]]") in warn[0], warn
    assert dumps_agree(MIRRORGUARD_BIN, b.nodes[0].data_dir / f"{T}-0") == 3
