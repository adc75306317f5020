"""A source that truncates its log below what mirrorguard observed (issue 29 item 6).

An unclean leader election, or a broker that lost its unflushed tail in a power failure,
leaves the source's log shorter than what the destination fetcher (and mirrorguard's shadow
producer state) already saw; new records then take the lost offsets. The destination fetcher
learns it from a DivergingEpoch answer (Fetch v12+), truncates its own log and fetches from
the source's end offset again. Kafka reloads its producer state after a truncation
(ProducerStateManager.truncateAndReload); mirrorguard must do the same, or the re-fetched
offsets look like re-deliveries of what it saw before: their producers are never claimed and
a transaction begun there is unknown to the seal, which then leaves it open on the destination
for good (its last stable offset pinned below its log end).

The source here is a one-node Apache Kafka 4.4 cluster whose partition log is cut at a batch
boundary while the node is down (the tail a power failure loses: Kafka does not fsync by
default); the restart moves the leader epoch, so the fetcher's next fetch gets DivergingEpoch.
The fetcher is the stand-in at Fetch v12 (LastFetchedEpoch), through the mirror's fetcher port;
the state cluster is the session's `kafka1`.
"""

from __future__ import annotations

import struct

import harness
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    StandInFetcher,
    high_watermark,
    idempotent_producer,
    mirror_factory,
    send,
    transactional_producer,
)

MIRROR = "a-to-b"


def _cut_log_at(node, topic: str, offset: int) -> int:
    """Cuts the partition's log file at the batch that starts at `offset` (the node is down);
    drops its indexes and producer snapshots so the broker recovers the log from the file.
    Returns the bytes cut."""
    part = node.data_dir / f"{topic}-0"
    [seg] = sorted(part.glob("*.log"))
    data = seg.read_bytes()
    pos = 0
    while pos + 12 <= len(data):
        base, length = struct.unpack(">qi", data[pos:pos + 12])
        if base >= offset:
            break
        pos += 12 + length
    assert pos < len(data), f"no batch at {offset} in {seg}"
    with open(seg, "r+b") as f:
        f.truncate(pos)
    for p in [*part.glob("*.index"), *part.glob("*.timeindex"), *part.glob("*.snapshot")]:
        p.unlink()
    return len(data) - pos


def test_a_transaction_begun_in_offsets_the_source_truncated_is_sealed(kafka1, kafka_factory, mirror_factory):
    topic = harness.topic_name("trunc")
    a = kafka_factory(name="A")
    harness.create_topics(a.bootstrap, [topic])
    harness.create_topics(kafka1.bootstrap, [topic])
    ip = idempotent_producer(a.bootstrap)
    for i in range(10):  # one batch each: the log is cut at a batch boundary
        send(ip, topic, [b"old-%d" % i])
    old_end = high_watermark(a.bootstrap, topic)

    spec = MirrorSpec.of(MIRROR, a)
    mg = mirror_factory(kafka1.bootstrap, [spec])
    mg.wait_sources_known()
    f = StandInFetcher(topic, version=12).connect(spec.bootstrap)
    f.catch_up(old_end)
    assert mg.partition(topic, 0)["producers"] >= 1

    # The source loses its last 4 batches; new producers write at those offsets.
    lost_from = old_end - 4
    a.nodes[0].kill()
    cut_bytes = _cut_log_at(a.nodes[0], topic, lost_from)
    a.nodes[0].restart()
    harness.wait_until(lambda: high_watermark(a.bootstrap, topic) == lost_from, 60, interval=0.5,
                       what=f"the restarted source's log ending at {lost_from}")
    tp = harness.retry(lambda: transactional_producer(a.bootstrap, f"t-{topic}", **{"transaction.timeout.ms": 600000}))
    tp.begin_transaction()
    tp.produce(topic, value=b"new-open", partition=0)
    assert tp.flush(20) == 0
    send(idempotent_producer(a.bootstrap), topic, [b"new-idem"])
    new_end = high_watermark(a.bootstrap, topic)
    assert new_end < old_end, (new_end, old_end)

    # The fetcher is told its log diverges, truncates, and fetches the new records (its
    # connection ended with the source's restart: it connects again, as a broker's does).
    def truncated_and_caught_up(s):
        if s.conn is None:
            s.connect(spec.bootstrap)
        return s.truncations and s.leo >= new_end

    f.close()
    harness.wait_until(lambda: f.follow(truncated_and_caught_up, timeout=5) or True, 60, interval=0.5,
                       what="the fetcher truncated and caught up")
    new = [b for b in f.log if b.base_offset >= lost_from]
    open_pid = [b.producer_id for b in new if b.is_transactional and not b.is_control]
    assert open_pid, [(b.kind, b.base_offset) for b in new]

    status, body = mg.post("stop", MIRROR, topic, [0])
    assert status == 200, body
    f.follow(lambda s: s.log[-1].kind == "barrier", what="the seal")
    seal = [b for b in f.log if b.base_offset >= new_end]
    aborted = [b.producer_id for b in seal if b.kind == "abort"]
    truncations = mg.metrics().sum("mirrorguard_mirror_events_total", mirror=MIRROR, kind="source_truncated")
    print(f"source cut {cut_bytes} bytes at {lost_from} (old end {old_end}, new end {new_end}); "
          f"fetcher truncations {f.truncations}; seal {[(b.kind, b.base_offset) for b in seal]}; "
          f"open transaction's producer {open_pid}; aborted {aborted}; truncations counted {truncations}")
    assert f.truncations[0][1] == lost_from, f.truncations
    assert open_pid[0] in aborted, (seal, open_pid)
    assert truncations == 1
    assert "source log truncated" in mg.log_text()
    f.fetch_once()
    assert mg.partition(topic, 0)["state"] == "STOPPED"
    harness.abandon_client(tp)
    f.close()
