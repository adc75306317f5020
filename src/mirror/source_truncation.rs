//! A source log truncated below what the shadow producer state observed.
//!
//! An unclean leader election on the source, or a source broker that lost
//! its unflushed tail, leaves the source's log shorter than what the
//! destination fetcher already appended; new records then take the lost
//! offsets. The fetcher learns it from a DivergingEpoch answer (Fetch v12+)
//! and fetches from the source's end offset again. Without this, the shadow
//! state would take those offsets for re-deliveries of what it saw: their
//! producers never claimed, a transaction begun there unknown to a seal.
//! Like Kafka after a truncation, the partition's state starts over and the
//! source is replayed before its next batch is mapped.
//!
//! Only the configured fetcher's answers count: a reader chooses its own
//! LastFetchedEpoch and fetch offset, so its DivergingEpoch says nothing
//! about the source's log.

use super::*;

impl MirrorContext {
    /// The source answered the fetcher's fetch of `topic`/`partition` with a
    /// DivergingEpoch at `end_offset`. If the partition's state observed
    /// past it, the state starts over and the partition is no longer warm
    /// (its next batches wait for a replay of the source). Returns whether
    /// it started over.
    pub(super) fn source_truncated(
        &self,
        topic: &FetchTopic<'_>,
        partition: i32,
        epoch: i32,
        end_offset: i64,
    ) -> bool {
        if end_offset < 0 {
            return false;
        }
        let Ok(handle) = self.partition_handle(topic, partition) else {
            return false;
        };
        // A controlled partition's state is its seal's: the fetch path
        // answers it locally and never asks the source for it.
        let controlled = self
            .lifecycle
            .get(handle.key())
            .is_some_and(|e| e.state != crate::lifecycle::State::Mirroring);
        if controlled {
            return false;
        }
        let now = now_ms();
        let observed_to = handle.with(|s| {
            let next = s.next_offset();
            if end_offset < next {
                s.start_over_after_truncation(end_offset, now);
            }
            next
        });
        if end_offset >= observed_to {
            return false;
        }
        let key = handle.key().clone();
        self.warm
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
        self.metrics.source_truncations.inc();
        tracing::warn!(mirror = %self.name, partition = %key, epoch, end_offset, observed_to,
            "source log truncated below what the producer state observed (an unclean leader \
             election or a lost tail on the source): the partition's state starts over and the \
             source is replayed before its next batch is mapped");
        true
    }
}
