"""Writes the class-data-sharing archives of the test brokers' JVMs (``.tools/cds/*.jsa``).

Run by ``scripts/install-test-deps.sh`` once Apache Kafka is installed, again whenever the
JDK or the Kafka jars change (its stamp). It starts one single-node Kafka 4.4 cluster the way
every test does (``kafka_broker.KafkaCluster``: same command line, same class path), with
``-XX:ArchiveClassesAtExit``: the storage tool that formats the node and the broker each write
the classes they loaded when they exit. Before the broker stops it serves a topic, idempotent
and transactional produce and a read, so those paths' classes are archived too. The archives
are written in a temporary directory and moved into place only when both exist, so a failed
run leaves the previous ones (or none: the brokers then start without).

    .tools/venv/bin/python tests/integration/jvm_archives.py .tools/cds
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

KINDS = ("broker", "storage-tool")


def main(out: Path) -> int:
    with tempfile.TemporaryDirectory(prefix="mg-cds-") as tmp:
        staging = Path(tmp) / "archives"
        staging.mkdir()
        os.environ["MG_CDS_DIR"] = str(staging)
        os.environ["MG_CDS_DUMP"] = "1"
        import harness
        import kafka_broker

        cluster = kafka_broker.KafkaCluster(Path(tmp) / "kafka", nodes=1, name="cds")
        cluster.start()
        try:
            topic = harness.topic_name("cds")
            harness.create_topics(cluster.bootstrap, [topic])
            idempotent = harness.new_producer(cluster.bootstrap, **{"enable.idempotence": True})
            idempotent.produce(topic, value=b"idempotent", partition=0)
            assert idempotent.flush(30) == 0
            txn = harness.new_producer(cluster.bootstrap, **{"transactional.id": f"cds-{topic}"})
            txn.init_transactions(30)
            txn.begin_transaction()
            txn.produce(topic, value=b"transactional", partition=0)
            txn.commit_transaction(30)
            got = harness.consume_assign(cluster.bootstrap, topic, 0, 0, count=2, timeout=30)
            assert len(got) == 2, got
            harness.close_clients()
        finally:
            # A controlled shutdown: the JVM writes its archive as it exits.
            cluster.stop(graceful=True)
        missing = [k for k in KINDS if not (staging / f"{k}.jsa").is_file()]
        if missing:
            print(f"jvm_archives: no archive written for {missing} (see the node's log)", file=sys.stderr)
            return 1
        out.mkdir(parents=True, exist_ok=True)
        for k in KINDS:
            shutil.move(str(staging / f"{k}.jsa"), str(out / f"{k}.jsa"))
    print(f"jvm_archives: {', '.join(f'{k}.jsa' for k in KINDS)} in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else
                  Path(__file__).resolve().parents[2] / ".tools" / "cds"))
