"""ReferenceDestination: the reference destination (stand-in for a stock destination
broker; tests and demo only) - partition logs, producer state, mirror links, promotion
after failover (local Produce with the CLIENT-path rules, a local PID counter starting low,
a minimal transaction coordinator) and a Fetch server (``server.KafkaServer``).
"""

from __future__ import annotations

import base64
import os
import threading
import time
import uuid
from pathlib import Path

from .log import PartitionLog
from .psm import PartitionFailed


def kafka_cluster_id() -> str:
    return base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


class NotPromoted(Exception):
    code = 6  # NOT_LEADER_OR_FOLLOWER: a mirror destination partition is read-only


class ReferenceDestination:
    """Reference destination (stand-in for a stock destination broker; tests and demo only).

    ``understands_mirror_pid_reset``: False = stock broker (a PID -1 control batch never
    reaches the producer state: the MIRROR_PID_RESET barrier is ignored); True = KIP-1279
    broker (the barrier expires every producer entry of the partition).
    """

    def __init__(self, directory: Path, name: str = "dest", *, understands_mirror_pid_reset: bool = False,
                 cluster_id: str | None = None, broker_id: int = 111, first_local_pid: int = 1):
        self.name = name
        self.dir = Path(directory) / f"refdest-{name}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.understands_mirror_pid_reset = understands_mirror_pid_reset
        self.cluster_id = cluster_id or kafka_cluster_id()
        self.broker_id = broker_id
        self.cond = threading.Condition(threading.RLock())
        self.partitions: dict[tuple[str, int], PartitionLog] = {}
        self.topic_ids: dict[str, bytes] = {}
        self.links = []
        self.promoted = False
        self.leader_epoch = 0
        # Local PID allocation after promotion: Kafka hands out blocks from 0, Tansu 1, 2, 3...
        self.next_pid = first_local_pid
        self.txn_ids: dict[str, tuple[int, int]] = {}  # transactional.id -> (pid, epoch)
        self.txn_partitions: dict[str, set[tuple[str, int]]] = {}
        self.produce_log: list[dict] = []  # every local Produce batch and what happened to it
        self.server = None

    # ------------------------------------------------------------------ partitions

    def partition(self, topic: str, partition: int = 0) -> PartitionLog:
        with self.cond:
            key = (topic, partition)
            if key not in self.partitions:
                self.partitions[key] = PartitionLog(self.dir, topic, partition,
                                                    self.understands_mirror_pid_reset, self.cond)
                self.topic_ids.setdefault(topic, uuid.uuid4().bytes)
            return self.partitions[key]

    def segment(self, topic: str, partition: int = 0) -> Path:
        return self.partition(topic, partition).path

    def psm(self, topic: str, partition: int = 0):
        return self.partition(topic, partition).psm

    # ------------------------------------------------------------------ mirroring

    def mirror_from(self, bootstrap: str, topic: str, partition: int = 0, **kw):
        from .fetcher import MirrorLink

        self.partition(topic, partition)
        link = MirrorLink(self, bootstrap, topic, partition, **kw)
        self.links.append(link)
        return link

    def promote(self) -> None:
        """Failover: mirroring stops (fetchers removed) and the partitions become writable
        by local producers with a new leader epoch."""
        for link in self.links:
            link.stopped = True
            link.close()
        with self.cond:
            self.promoted = True
            self.leader_epoch += 1

    # ------------------------------------------------------------------ local writes

    def init_producer_id(self, transactional_id: str | None) -> tuple[int, int]:
        with self.cond:
            if not self.promoted:
                raise NotPromoted("not promoted")
            if transactional_id is not None and transactional_id in self.txn_ids:
                pid, epoch = self.txn_ids[transactional_id]
                # Fence the previous instance: same PID, epoch + 1; abort what it left open.
                self._end_txn(transactional_id, pid, epoch, commit=False)
                self.txn_ids[transactional_id] = (pid, epoch + 1)
                return pid, epoch + 1
            pid = self.next_pid
            self.next_pid += 1
            if transactional_id is not None:
                self.txn_ids[transactional_id] = (pid, 0)
                self.txn_partitions[transactional_id] = set()
            return pid, 0

    def produce(self, topic: str, partition: int, raw: bytes) -> tuple[int, int]:
        """Local Produce of one batch (CLIENT path). Returns (error code, base offset)."""
        with self.cond:
            if not self.promoted:
                return NotPromoted.code, -1
            log = self.partitions.get((topic, partition))
            if log is None:
                return 3, -1  # UNKNOWN_TOPIC_OR_PARTITION
            entry = {"topic": topic, "partition": partition}
            try:
                base, res = log.append_client(raw, self.leader_epoch)
            except Exception as e:  # noqa: BLE001 - mapped to its Kafka error code
                code = getattr(e, "code", 2)
                entry.update(error=code, message=str(e))
                self.produce_log.append(entry)
                return code, -1
            entry.update(error=0, base_offset=base, duplicate_of=res.duplicate_of)
            self.produce_log.append(entry)
            return 0, base

    def add_partitions_to_txn(self, transactional_id: str, pid: int, epoch: int,
                              parts: list[tuple[str, int]]) -> int:
        with self.cond:
            cur = self.txn_ids.get(transactional_id)
            if cur is None or cur[0] != pid:
                return 49  # INVALID_PRODUCER_ID_MAPPING
            if cur[1] != epoch:
                return 47
            self.txn_partitions.setdefault(transactional_id, set()).update(parts)
            return 0

    def end_txn(self, transactional_id: str, pid: int, epoch: int, commit: bool) -> int:
        with self.cond:
            cur = self.txn_ids.get(transactional_id)
            if cur is None or cur[0] != pid:
                return 49
            if cur[1] != epoch:
                return 47
            return self._end_txn(transactional_id, pid, epoch, commit)

    def _end_txn(self, transactional_id: str, pid: int, epoch: int, commit: bool) -> int:
        parts = sorted(self.txn_partitions.get(transactional_id, set()))
        for tp in parts:
            log = self.partitions.get(tp)
            if log is not None:
                log.append_marker(pid, epoch, commit, 0, self.leader_epoch, int(time.time() * 1000))
        self.txn_partitions[transactional_id] = set()
        return 0

    # ------------------------------------------------------------------ serving

    def serve(self):
        """Starts the Fetch server (a tiny Kafka broker on 127.0.0.1); returns it."""
        from .server import KafkaServer

        if self.server is None:
            self.server = KafkaServer(self).start()
        return self.server

    @property
    def bootstrap(self) -> str:
        assert self.server is not None, "serve() first"
        return self.server.bootstrap

    def close(self) -> None:
        for link in self.links:
            link.close()
        if self.server is not None:
            self.server.stop()
            self.server = None


__all__ = ["ReferenceDestination", "PartitionFailed", "NotPromoted", "kafka_cluster_id"]
