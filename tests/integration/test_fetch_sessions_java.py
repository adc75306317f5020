"""The mirror fetch path under Kafka's own fetch-session client: a kafka-clients 4.4
consumer (incremental KIP-227 sessions, FetchSessionHandler) reads two partitions through
a mirror listener in front of Apache Kafka while partition 0 is stopped and sealed. No
source record past the cut may reach partition 0, partition 1 keeps flowing, and the
session is reset at most once for the seal.
"""

from __future__ import annotations

import subprocess
import time

import harness
from mirror_harness import MirrorSpec, high_watermark, idempotent_producer, mirror_factory, send  # noqa: F401
from test_fetch_sessions import MIRROR, start_mirror

LIBS = harness.ROOT / ".tools" / "kafka" / "libs"
SOURCE = harness.ROOT / "tests" / "integration" / "java" / "SessionConsumer.java"


def records(out_path) -> list[tuple[int, int, str]]:
    out = []
    for line in out_path.read_text(errors="replace").splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0].isdigit():
            out.append((int(parts[0]), int(parts[1]), parts[2]))
    return out


def wait_for(cond, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def test_java_consumer_sessions_never_see_source_data_past_the_cut(kafka1, mirror_factory, tmp_path):
    classes = tmp_path / "classes"
    subprocess.run(["javac", "-cp", f"{LIBS}/*", "-d", classes, SOURCE], check=True, timeout=120)
    topic = harness.topic_name("jsess")
    harness.create_topics(kafka1.bootstrap, [topic], partitions=2)
    mg = start_mirror(kafka1, mirror_factory, topic)
    prod = idempotent_producer(kafka1.bootstrap)
    for p in (0, 1):
        send(prod, topic, [b"before-%d-%d" % (p, i) for i in range(5)], partition=p)

    out, err, stop = tmp_path / "consumer.out", tmp_path / "consumer.err", tmp_path / "stop"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen(["java", "-cp", f"{classes}:{LIBS}/*", "SessionConsumer",
                                 mg.mirrors[MIRROR].bootstrap, topic, str(stop)], stdout=o, stderr=e)
    try:
        wait_for(lambda: len(records(out)) >= 10, "consumer read the first records")
        # Both partitions keep flowing while p0 is stopped: the consumer lists both in its
        # incremental requests when the cut is taken.
        sent = {0: 0, 1: 0}

        def stream(n: int) -> None:
            for i in range(n):
                for p in (0, 1):
                    prod.produce(topic, value=b"stream-%d-%d" % (p, sent[p]), partition=p)
                    sent[p] += 1
                prod.flush(10)
                time.sleep(0.05)

        stream(20)
        status, body = mg.post("stop", MIRROR, topic, [0])
        assert status == 200, body
        stream(40)
        wait_for(lambda: (mg.partition(topic, 0) or {}).get("state") == "STOPPED", "p0 STOPPED")
        hw1 = high_watermark(kafka1.bootstrap, topic, 1)
        wait_for(lambda: max((o for p, o, _ in records(out) if p == 1), default=-1) == hw1 - 1,
                 "p1 fully consumed")
        time.sleep(1.0)  # more incremental rounds with p0 left out
    finally:
        stop.touch()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    got = records(out)
    p0 = [(o, v) for p, o, v in got if p == 0]
    p1 = [v for p, o, v in got if p == 1]
    cut = mg.partition(topic, 0)["cut"]
    resets = mg.metrics().sum("mirrorguard_seal_events_total", mirror=MIRROR, kind="fetch_session_reset")
    past = [x for x in p0 if x[0] >= cut]
    print(f"p0 records {len(p0)}, cut {cut}, p0 records at or past the cut {len(past)} {past[:3]}, "
          f"session resets {resets}")
    assert past == [], "source records past the cut reached the sealed partition"
    # p0: exactly the source's records below the cut, in order; p1: everything.
    assert [v for _, v in p0] == [f"before-0-{i}" for i in range(5)] + \
        [f"stream-0-{i}" for i in range(cut - 5)], p0
    assert p1 == [f"before-1-{i}" for i in range(5)] + [f"stream-1-{i}" for i in range(sent[1])]
    assert resets <= 1
