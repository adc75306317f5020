"""Reference destination (stand-in for a stock destination broker; tests and demo only).

No broker that mirrors across clusters can be installed on the project's machines
(SPEC section 7), so the scenarios of SPEC section 4 run against this stand-in for a stock
destination broker's mirror fetcher and log. It follows Kafka's documented replication-path
producer-state rules (``psm.py``, citing the Kafka classes), writes a Kafka-format segment
file that ``mirrorguard dump`` reads (``log.py``), fetches like a follower (``fetcher.py``),
can be promoted after failover (local Produce with the CLIENT-path rules, local PIDs from a
counter starting low) and serves its log over the Kafka protocol (``server.py``) so the next
hop and real librdkafka clients can read it. It is not a product component.
"""

from .destination import NotPromoted, ReferenceDestination, kafka_cluster_id
from .fetcher import MirrorLink, source_end_offset
from .log import PartitionLog
from .psm import (
    CLIENT,
    COORDINATOR,
    REPLICATION,
    PartitionFailed,
    ProducerStateEntry,
    ProducerStateManager,
)
from .wire import build_batch, build_end_txn_marker, parse_batch, split_batches

__all__ = [
    "CLIENT", "COORDINATOR", "REPLICATION", "MirrorLink", "NotPromoted", "PartitionFailed", "PartitionLog",
    "ProducerStateEntry", "ProducerStateManager", "ReferenceDestination", "build_batch", "build_end_txn_marker",
    "kafka_cluster_id", "parse_batch", "source_end_offset", "split_batches",
]
