"""Two releases sharing one ``__mirror_state`` during a rolling upgrade (issue 17, item 6).

The previous release's binary is built from this repository's history by
scripts/build-compat.sh (run by scripts/install-test-deps.sh) into
``$MG_COMPAT_DIR/<rev>/mirrorguard`` (default .tools/compat). An old and a new instance
each sit in front of one simulated destination broker's fetcher (the stand-in of
kafka_dest.py) with Apache Kafka (kafka1) as the source and state cluster. Partition 0
moves old -> new -> old; a transaction opens while the old instance serves it and stays
open; the mirror is stopped through the new instance and the old one seals it. The
destination's log and producer state must equal a single current instance's run of the
same input, and the compatibility table of docs/mirror_state.md (record types and value
versions each release writes and reads) must match what each binary did: the records it
wrote (told apart by the idempotent producer id of their batches) and the records it read
without skipping any (its unknown-record counters stay zero).

Skipped only when the release's commit is not in the clone's history (a shallow clone):
then nothing can build it. A missing binary with the commit present is a failure (run
scripts/install-test-deps.sh).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatch

import harness
import rawkafka
from kafka_dest import dest_hw_bootstrap, kafka_dest_factory  # noqa: F401 - fixture
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    idempotent_producer,
    mirror_factory,
    send,
    transactional_producer,
)
from test_multi_instance import MIRROR, TAIL, Brokers, _catch_up, _hw, _log, _sealed, _single_instance

ROOT = harness.ROOT
_script = (ROOT / "scripts" / "build-compat.sh").read_text()
COMPAT_REV = re.search(r'^COMPAT_REV="([0-9a-f]{40})"', _script, re.M).group(1)
COMPAT_BIN = Path(os.environ.get("MG_COMPAT_DIR", ROOT / ".tools" / "compat")) / COMPAT_REV / "mirrorguard"
DOC = ROOT / "docs" / "mirror_state.md"


def _old_binary() -> Path:
    known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{COMPAT_REV}^{{commit}}"],
                           capture_output=True).returncode == 0
    if not known:
        pytest.skip(f"the previous release {COMPAT_REV[:12]} is not in this clone's git history "
                    "(a shallow clone): its binary cannot be built")
    assert COMPAT_BIN.is_file(), f"{COMPAT_BIN} missing: run scripts/install-test-deps.sh (scripts/build-compat.sh)"
    return COMPAT_BIN


def _doc_row(release: str) -> tuple[set, set]:
    """The (writes, reads) sets of `release` in docs/mirror_state.md's compatibility table."""
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] == release:
            parse = lambda cell: {tuple(int(x) for x in tv.split(".")) for tv in cell.split()}  # noqa: E731
            return parse(cells[1]), parse(cells[2])
    raise AssertionError(f"no row {release!r} in the compatibility table of {DOC}")


def _state_records(bootstrap: str, topic: str) -> list[tuple[int, int, int | None, bytes | None]]:
    """Every record of the state topic as (producer id of its batch, type, value version or
    None for a tombstone, value)."""
    host, port = bootstrap.rsplit(":", 1)
    batches, _ = rawkafka.fetch_all_batches(host, int(port), topic, 0)
    out = []
    for b in batches:
        rb = DefaultRecordBatch(b.raw)
        for r in rb:
            rtype = int.from_bytes(r.key[:2], "big", signed=True)
            version = None if r.value is None else int.from_bytes(r.value[:2], "big", signed=True)
            out.append((rb.producer_id, rtype, version, r.value))
    return out


def _serving_instance(value: bytes) -> str:
    """The InstanceId of a type-9 value (int16 version, compact string InstanceId, ...)."""
    n, shift, i = 0, 0, 2
    while True:
        byte = value[i]
        i += 1
        n |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return value[i:i + n - 1].decode()


def _unknown_counts(mg) -> dict:
    m = mg.metrics()
    return {kind: sum(v for _, v in m.select("mirrorguard_state_store_ops_total", kind=kind))
            for kind in ("unknown_record_type", "unknown_record_version")}


def test_old_and_new_release_share_mirror_state(kafka1, kafka_dest_factory, mirror_factory):  # noqa: F811
    old_bin = _old_binary()
    topic = harness.topic_name("mixed")
    harness.create_topics(kafka1.bootstrap, [topic], partitions=2)
    dest = kafka_dest_factory("mixed")
    # The new release completes seals on the destination's high watermark (its default
    # rule, read on the stand-in); the old one knows only the fetcher's offset.
    spec = lambda: [MirrorSpec.of(MIRROR, kafka1, destination_hw=dest_hw_bootstrap(dest))]  # noqa: E731
    mg_old = mirror_factory(kafka1.bootstrap, spec(), snapshot_interval_ms=300, binary=old_bin)
    mg_new = mirror_factory(kafka1.bootstrap, spec(), snapshot_interval_ms=300)
    for mg in (mg_old, mg_new):
        mg.wait_sources_known()
    ip = idempotent_producer(kafka1.bootstrap)
    tp = transactional_producer(kafka1.bootstrap, f"txn-{topic}", **{"transaction.timeout.ms": 600000})
    via = {"old": mg_old.mirrors[MIRROR].bootstrap, "new": mg_new.mirrors[MIRROR].bootstrap}
    brokers = Brokers(dest, topic, via)

    # The old instance serves partition 0, the new one partition 1; a transaction opens
    # on partition 0 while the old one serves it.
    send(ip, topic, [b"p0-%d" % i for i in range(3)], partition=0)
    send(ip, topic, [b"p1-%d" % i for i in range(3)], partition=1)
    tp.begin_transaction()
    tp.produce(topic, value=b"open-0", partition=0)
    assert tp.flush(20) == 0
    fs = brokers.lead({"old": [0], "new": [1]})
    _catch_up(fs, topic, _hw(kafka1.bootstrap, topic))

    # Partition 0 moves to the new instance (a take-over from the old one's records).
    fs = brokers.lead({"new": [0, 1]})
    send(ip, topic, [b"p0-new-%d" % i for i in range(2)], partition=0)
    tp.produce(topic, value=b"open-1", partition=0)
    assert tp.flush(20) == 0
    _catch_up(fs, topic, _hw(kafka1.bootstrap, topic))
    time.sleep(TAIL)

    # And back to the old instance, which must not serve it from the state it had.
    fs = brokers.lead({"old": [0], "new": [1]})
    send(ip, topic, [b"p0-old-%d" % i for i in range(2)], partition=0)
    send(ip, topic, [b"p1-new-%d" % i for i in range(2)], partition=1)
    _catch_up(fs, topic, _hw(kafka1.bootstrap, topic))
    time.sleep(TAIL)

    # Stopped through the new instance; the old one seals partition 0 (the transaction is
    # still open: one ABORT, then the barrier), the new one partition 1.
    hws = _hw(kafka1.bootstrap, topic)
    status, body = mg_new.post("stop", MIRROR, topic, [0, 1])
    assert status == 200, body
    seal = {0: 2, 1: 1}
    _catch_up(fs, topic, hws, extra=seal)
    harness.wait_until(lambda: _sealed(mg_old, topic, [0]) and _sealed(mg_new, topic, [1]), 30,
                       interval=0.1, what="both partitions sealed")
    brokers.lead({})
    mixed = {p: _log(dest, topic, p) for p in (0, 1)}
    st = mixed[0][1]
    assert [m["type"] for m in st["markers"]][-2:] == ["ABORT", "TYPE_7"], st["markers"]

    # The compatibility table against what each binary did.
    records = _state_records(kafka1.bootstrap, mg_new.state_topic)
    serving = {}
    for pid, rtype, version, value in records:
        if rtype == 9 and value is not None:
            serving.setdefault(_serving_instance(value), set()).add(pid)
    suffix = {mg.name: f"/{harness.HOST}:{mg.admin_port}" for mg in (mg_old, mg_new)}
    pids = {name: set().union(*[p for inst, p in serving.items() if inst.endswith(sfx)] or [set()])
            for name, sfx in suffix.items()}
    assert pids[mg_old.name] and pids[mg_new.name], serving
    for mg, release in ((mg_old, COMPAT_REV[:7]), (mg_new, "current")):
        writes, reads = _doc_row(release)
        wrote = {(t, v) for pid, t, v, _ in records if pid in pids[mg.name] and v is not None}
        assert wrote <= writes, (release, sorted(wrote - writes))
        # The run makes both write life cycle, snapshots, claims and serving records.
        assert {4, 5, 6, 9} <= {t for t, _ in wrote}, (release, sorted(wrote))
        # Everything in the topic is something this release reads, and it skipped nothing.
        everything = {(t, v) for _, t, v, _ in records if v is not None}
        assert everything <= reads, (release, sorted(everything - reads))
        assert _unknown_counts(mg) == {"unknown_record_type": 0, "unknown_record_version": 0}, release

    single = _single_instance(kafka1, mirror_factory, kafka_dest_factory, topic, hws, seal)
    for p in (0, 1):
        assert mixed[p][0] == single[p][0], (p, mixed[p][0], single[p][0])
        assert mixed[p][1] == single[p][1], (p, mixed[p][1], single[p][1])
    tp.abort_transaction(20)
