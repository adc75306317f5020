"""Producer claims scale (issue 13 item 5): 20,000 producers in one partition of an
Apache Kafka source are mirrored (past the ~15,000 at which one whole-partition
snapshot record exceeded Kafka's default message.max.bytes), each claim is one small
__mirror_state record, no record approaches message.max.bytes, and after kill -9 the
restart restores every claim. The 100,000-producer run is bench/claims_scale.py."""

from __future__ import annotations

import re

import harness
from claims_scale import mirror_all, produce_synthetic, producers_tracked, read_state_records
from mirror_harness import MirrorSpec, high_watermark, mirror_factory  # noqa: F401 - fixture

N = 20_000


def test_twenty_thousand_producers_in_one_partition_then_kill9(kafka_factory, kafka1, mirror_factory):
    src = kafka_factory()
    topic = harness.topic_name("claims")
    harness.create_topics(src.bootstrap, [topic])
    harness.create_topics(kafka1.bootstrap, [topic])  # issue 13 item 6: destination topic id lookup
    produce_synthetic(src.bootstrap, topic, N)
    assert high_watermark(src.bootstrap, topic) == N

    mg = mirror_factory(kafka1.bootstrap, [MirrorSpec.of("m", src)])
    f, _secs = mirror_all(mg, topic, src.bootstrap, timeout=120)
    assert len({b.producer_id for b in f.log}) == N
    f.close()

    records = read_state_records(kafka1.bootstrap, mg.state_topic, timeout=60)
    claims = [r for r in records if r.type == 6]
    assert len({r.key["producer_id"] for r in claims if r.value}) == N, "one claim record per producer"
    # No snapshot of the whole partition was written (it would be ~1.3 MB).
    assert all(r.type != 5 or r.value is None or len(r.value["producers"]) < 4000 for r in records)
    m = mg.metrics()
    assert m.counter("mirrorguard_state_store_ops_total", kind="claim") >= N
    assert m.counter("mirrorguard_state_store_ops_total", kind="append_error") == 0
    assert "MESSAGE_TOO_LARGE" not in mg.log_text()

    # kill -9 and restart: every claim is read back before listeners serve.
    mg.kill9()
    mg.start()
    assert producers_tracked(mg) == N
    loaded = re.findall(r"__mirror_state loaded.*", mg.log_text())
    assert loaded and f"claims={N}" in loaded[-1].replace('"', ""), loaded[-1:]
