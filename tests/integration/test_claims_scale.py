"""Producer claims scale (issue 13 item 5): 20,000 producers in one partition of an
Apache Kafka source are mirrored (past the ~15,000 at which one whole-partition
snapshot record exceeded Kafka's default message.max.bytes: the base of this change
closed the fetcher's connection with MESSAGE_TOO_LARGE on every retry). Each claim is
one small __mirror_state record; kill -9 right after restores every claim; a snapshot
round then writes the partition as chunks (no record near message.max.bytes) and
tombstones the claims it supersedes; kill -9 again restores every producer from the
chunks, and a later collision (another source, same fold, one of the same PIDs) still
gets a salt. The 100,000-producer run is bench/claims_scale.py."""

from __future__ import annotations

import re
import time

import harness
from claims_scale import PID_BASE, mirror_all, produce_synthetic, producers_tracked, read_state_records
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    StandInFetcher,
    fold,
    high_watermark,
    map_pid,
    mirror_factory,
    same_fold_pair,
)

N = 20_000


def _loaded(mg) -> str:
    lines = re.findall(r"__mirror_state loaded.*", mg.log_text())
    assert lines, "no start-up line"
    return lines[-1].replace('"', "")


def test_twenty_thousand_producers_in_one_partition_then_kill9(kafka_factory, kafka1, mirror_factory):
    cid_a, cid_b = same_fold_pair()
    src = kafka_factory(cluster_id=cid_a)
    topic = harness.topic_name("claims")
    harness.create_topics(src.bootstrap, [topic])
    harness.create_topics(kafka1.bootstrap, [topic])  # the destination topic (kafka1 is the destination here)
    produce_synthetic(src.bootstrap, topic, N)
    assert high_watermark(src.bootstrap, topic) == N

    # A long snapshot interval: the first restart finds claims only.
    mg = mirror_factory(kafka1.bootstrap, [MirrorSpec.of("m", src)], snapshot_interval_ms=600_000)
    f, _secs = mirror_all(mg, topic, src.bootstrap, timeout=120)
    assert len({b.producer_id for b in f.log}) == N
    f.close()

    records = read_state_records(kafka1.bootstrap, mg.state_topic, timeout=60)
    claims = [r for r in records if r.type == 6]
    assert len({r.key["producer_id"] for r in claims if r.value}) == N, "one claim record per producer"
    assert not [r for r in records if r.type == 5 and r.value and len(r.value["producers"]) > 3900]
    m = mg.metrics()
    assert m.counter("mirrorguard_state_store_ops_total", kind="claim") >= N
    assert m.counter("mirrorguard_state_store_ops_total", kind="append_error") == 0
    assert "MESSAGE_TOO_LARGE" not in mg.log_text()

    # kill -9: every claim is read back before the listeners serve.
    mg.kill9()
    mg.start()
    assert producers_tracked(mg) == N
    assert f"claims={N}" in _loaded(mg)

    # Another instance on the same state topic, with a snapshot round every 500 ms:
    # chunks (type 7), then the superseded claims are tombstoned.
    mg.kill9()
    mg2 = mirror_factory(kafka1.bootstrap, [MirrorSpec.of("m", src)], snapshot_interval_ms=500)
    assert f"claims={N}" in _loaded(mg2)

    def chunked_and_tombstoned():
        rs = read_state_records(kafka1.bootstrap, mg2.state_topic, timeout=60)
        chunks = [r for r in rs if r.type == 7 and r.value]
        dead = {r.key["producer_id"] for r in rs if r.type == 6 and r.value is None}
        return sum(len(c.value["producers"]) for c in chunks) >= N and len(dead) >= N

    harness.wait_until(chunked_and_tombstoned, 120, interval=1, what="chunked snapshot and claim tombstones")
    rs = read_state_records(kafka1.bootstrap, mg2.state_topic, timeout=60)
    assert max(len(r.value["producers"]) for r in rs if r.type == 7 and r.value) <= 3000
    mg2.kill9()
    mg2.start()
    assert producers_tracked(mg2) == N
    line = _loaded(mg2)
    assert "chunked_snapshots=1" in line and "claims=0" in line, line
    mg2.kill9()

    # A later collision is still seen: source B (same fold) writes one of A's PIDs.
    b = kafka_factory(cluster_id=cid_b)
    harness.create_topics(b.bootstrap, [topic])
    produce_synthetic(b.bootstrap, topic, 1, pid_base=PID_BASE + 7)
    mg3 = mirror_factory(kafka1.bootstrap, [MirrorSpec.of("m", src), MirrorSpec.of("b", b)])
    assert producers_tracked(mg3) == N
    g = StandInFetcher(topic)
    g.connect(mg3.mirrors["b"].bootstrap, rebase=True)
    g.catch_up(high_watermark(b.bootstrap, topic))
    g.close()
    got = {x.producer_id for x in g.log}
    assert len(got) == 1 and got != {map_pid(PID_BASE + 7, fold(cid_a))}, got


def test_state_topic_refusing_large_batches(kafka1, mirror_factory):
    """A state topic whose max.message.bytes (4,000) is below the 256 KiB claim batches:
    the batches Kafka refuses (MESSAGE_TOO_LARGE) are split and sent again, every claim
    is written and the fetcher is served; a single record above the limit (the type-5
    snapshot of 300 producers, ~20 KB) is reported in Kafka's terms (ERROR line, metric)
    once per snapshot round, never in a loop of closed connections."""
    topic = harness.topic_name("small")
    state_topic = f"__mirror_state_{topic}"
    harness.create_topics(kafka1.bootstrap, [topic])
    harness.create_topics(kafka1.bootstrap, [state_topic],
                          config={"cleanup.policy": "compact", "max.message.bytes": "4000"})
    produce_synthetic(kafka1.bootstrap, topic, 300)
    mg = mirror_factory(kafka1.bootstrap, [MirrorSpec.of("m", kafka1)], state_topic=state_topic,
                        snapshot_interval_ms=500)
    f, _ = mirror_all(mg, topic, kafka1.bootstrap, timeout=60)
    f.close()
    assert len({b.producer_id for b in f.log}) == 300
    claims = {r.key["producer_id"] for r in read_state_records(kafka1.bootstrap, state_topic) if r.type == 6 and r.value}
    assert len(claims) == 300
    assert "refused as too large" in mg.log_text()

    def reported():
        return mg.metrics().counter("mirrorguard_state_store_ops_total", kind="message_too_large") >= 1

    harness.wait_until(reported, 20, interval=0.2, what="MESSAGE_TOO_LARGE reported")
    errors = [line for line in mg.log_text().splitlines() if "refuses a single __mirror_state record" in line]
    assert errors and "ERROR" in errors[0] and "MESSAGE_TOO_LARGE" in errors[0], errors[:1]
    n0 = mg.metrics().counter("mirrorguard_state_store_ops_total", kind="message_too_large")
    time.sleep(3)
    n1 = mg.metrics().counter("mirrorguard_state_store_ops_total", kind="message_too_large")
    assert n1 - n0 <= 8, f"{n1 - n0} refusals in 3 s: a retry loop"
