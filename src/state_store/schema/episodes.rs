//! The mirroring episodes of a partition (SPEC 3: STOPPED ends one episode,
//! `protect` starts the next), carried by its life-cycle record
//! (`MirrorPartitionStateValue`, type 4, v0) in optional tagged fields, so
//! an instance of an earlier release, sharing the topic in a rolling
//! upgrade, still applies every transition (it skips the tags) instead of
//! skipping the whole record as a newer value version.
//!
//! | tag | field | type | meaning |
//! |---|---|---|---|
//! | 0 | `Episode` | int32 | the episode (absent: 0, the first) |
//! | 1 | `EpisodeStart` | int64 | where the episode's fetcher started (-1: not yet) |
//! | 2 | `LeaderEpoch` | int32 | the leader epoch the seal is stamped with |
//! | 3 | `History` | compact array | earlier episodes, oldest first (below) |
//!
//! A `History` entry: `Episode` int32, `Mirror` compact string,
//! `SourceClusterId` compact string, `State` int8, `CutOffset` int64 (-1:
//! none), `SealBatches` int32 (-1), `LeaderEpoch` int32 (-1), `StartOffset`
//! int64 (-1), `EndedMs` int64, tagged fields (none defined).

use super::{MirrorPartitionState, RawTaggedField, SchemaError};
use crate::wire::{Reader, Writer};

/// Tag of the episode number.
pub const EPISODE_TAG: u32 = 0;
/// Tag of the episode's start offset.
pub const EPISODE_START_TAG: u32 = 1;
/// Tag of the seal's leader epoch.
pub const LEADER_EPOCH_TAG: u32 = 2;
/// Tag of the earlier episodes.
pub const HISTORY_TAG: u32 = 3;

/// Smallest encoded history entry: 4+1+1+1+8+4+4+8+8 bytes and an empty
/// tag section.
const MIN_HISTORY_ENTRY: usize = 40;

/// The episode fields of a life-cycle record.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EpisodeFields {
    /// The episode (0: the first).
    pub episode: i32,
    /// Where its fetcher started (`None`: the first episode, or not yet).
    pub start: Option<i64>,
    /// The leader epoch the seal is stamped with.
    pub leader_epoch: Option<i32>,
    /// Earlier episodes, oldest first.
    pub history: Vec<EpisodeRecord>,
}

/// One earlier episode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpisodeRecord {
    /// Its number.
    pub episode: i32,
    /// The mirror that fed it.
    pub mirror: String,
    /// Its source cluster.
    pub source_cluster_id: String,
    /// How it ended.
    pub state: MirrorPartitionState,
    /// Its cut (-1: none).
    pub cut_offset: i64,
    /// Its sealing batches (-1: none).
    pub seal_batches: i32,
    /// Its seal's leader epoch (-1: not known).
    pub leader_epoch: i32,
    /// Where its fetcher started (-1: not known).
    pub start_offset: i64,
    /// Wall-clock ms of its end.
    pub ended_ms: i64,
}

fn opt_i64(v: i64) -> Option<i64> {
    (v >= 0).then_some(v)
}

impl EpisodeFields {
    /// The tagged fields carrying these fields (none for a first episode
    /// with nothing to say, so such records stay byte for byte as before).
    pub fn encode_tags(&self) -> Result<Vec<RawTaggedField>, SchemaError> {
        let mut tags = Vec::new();
        if self.episode != 0 {
            tags.push((EPISODE_TAG, self.episode.to_be_bytes().to_vec()));
        }
        if let Some(s) = self.start {
            tags.push((EPISODE_START_TAG, s.to_be_bytes().to_vec()));
        }
        if let Some(e) = self.leader_epoch {
            tags.push((LEADER_EPOCH_TAG, e.to_be_bytes().to_vec()));
        }
        if !self.history.is_empty() {
            let mut w = Writer::new(Vec::with_capacity(
                1 + self.history.len() * (MIN_HISTORY_ENTRY + 64),
            ));
            w.put_compact_array_len(Some(self.history.len()), "Episodes.History")?;
            for h in &self.history {
                w.put_i32(h.episode);
                w.put_compact_string(&h.mirror, "EpisodeRecord.Mirror")?;
                w.put_compact_string(&h.source_cluster_id, "EpisodeRecord.SourceClusterId")?;
                w.put_i8(h.state.code());
                w.put_i64(h.cut_offset);
                w.put_i32(h.seal_batches);
                w.put_i32(h.leader_epoch);
                w.put_i64(h.start_offset);
                w.put_i64(h.ended_ms);
                w.put_uvarint(0);
            }
            tags.push((HISTORY_TAG, w.into_inner()));
        }
        Ok(tags)
    }

    /// The episode fields among a record's tagged fields (defaults where
    /// absent: a record of an earlier release is the first episode).
    pub fn from_tags(tags: &[RawTaggedField]) -> Result<Self, SchemaError> {
        let mut out = Self::default();
        for (tag, data) in tags {
            let mut r = Reader::new(data);
            match *tag {
                EPISODE_TAG => out.episode = r.read_i32("Episodes.Episode")?,
                EPISODE_START_TAG => out.start = opt_i64(r.read_i64("Episodes.EpisodeStart")?),
                LEADER_EPOCH_TAG => {
                    out.leader_epoch = Some(r.read_i32("Episodes.LeaderEpoch")?).filter(|e| *e >= 0)
                }
                HISTORY_TAG => {
                    let n = r.read_array_len_v(true, MIN_HISTORY_ENTRY, "Episodes.History")?;
                    // Bounded: `n` was checked against the bytes present.
                    let mut history = Vec::with_capacity(n);
                    for _ in 0..n {
                        history.push(EpisodeRecord {
                            episode: r.read_i32("EpisodeRecord.Episode")?,
                            mirror: r.read_compact_string("EpisodeRecord.Mirror")?.to_owned(),
                            source_cluster_id: r
                                .read_compact_string("EpisodeRecord.SourceClusterId")?
                                .to_owned(),
                            state: MirrorPartitionState::from_code(
                                r.read_i8("EpisodeRecord.State")?,
                            ),
                            cut_offset: r.read_i64("EpisodeRecord.CutOffset")?,
                            seal_batches: r.read_i32("EpisodeRecord.SealBatches")?,
                            leader_epoch: r.read_i32("EpisodeRecord.LeaderEpoch")?,
                            start_offset: r.read_i64("EpisodeRecord.StartOffset")?,
                            ended_ms: r.read_i64("EpisodeRecord.EndedMs")?,
                        });
                        r.read_tagged_fields("EpisodeRecord._tagged_fields")?;
                    }
                    out.history = history;
                }
                _ => continue,
            }
            if !r.is_empty() {
                return Err(SchemaError::TrailingBytes {
                    record_type: super::PARTITION_STATE_TYPE,
                    what: "episode tag",
                    remaining: r.remaining(),
                });
            }
        }
        Ok(out)
    }

    /// Whether `tag` is one of these fields (the rest of a record's tags
    /// are kept verbatim).
    pub fn owns(tag: u32) -> bool {
        matches!(
            tag,
            EPISODE_TAG | EPISODE_START_TAG | LEADER_EPOCH_TAG | HISTORY_TAG
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn episode_fields_round_trip_and_a_first_episode_adds_no_tag() {
        assert!(EpisodeFields::default().encode_tags().unwrap().is_empty());
        let f = EpisodeFields {
            episode: 2,
            start: Some(17),
            leader_epoch: Some(4),
            history: vec![EpisodeRecord {
                episode: 1,
                mirror: "a-to-b".into(),
                source_cluster_id: "AAAAAAAAAAAAAAAAAAAAAQ".into(),
                state: MirrorPartitionState::Stopped,
                cut_offset: 10,
                seal_batches: 2,
                leader_epoch: 3,
                start_offset: 5,
                ended_ms: 1_700_000_000_000,
            }],
        };
        let tags = f.encode_tags().unwrap();
        assert_eq!(EpisodeFields::from_tags(&tags).unwrap(), f);
        // Unknown tags are not read here.
        let mut more = tags.clone();
        more.push((9, vec![1, 2, 3]));
        assert_eq!(EpisodeFields::from_tags(&more).unwrap(), f);
        // A truncated history is an error, never a panic.
        let mut bad = tags;
        let last = bad.last_mut().unwrap();
        last.1.truncate(last.1.len() - 3);
        assert!(EpisodeFields::from_tags(&bad).is_err());
    }
}
