//! Topic entries shared by the FetchResponse and ProduceResponse builders.
//!
//! Both responses hold a `responses` array of topic entries (a name up to
//! v12, a topic id from v13, then an array of partition entries and, when
//! flexible, empty tagged fields), and both builders add the proxy's own
//! partition entries to an upstream response the same way: partitions of a
//! topic the upstream already returned go into that topic's entry, the others
//! into new topic entries at the end. What differs is the partition entry
//! itself ([`PartitionEntry`]) and the field names used in errors
//! ([`TopicFields`]).

use super::fetch::FetchTopic;
use crate::codec::api;
use crate::wire::{WireError, WireResult, Writer};

/// A partition entry a builder encodes for one version of its response.
pub(crate) trait PartitionEntry {
    /// Appends this entry, encoded for `version`, to `w`.
    fn encode(&self, version: i16, w: &mut Writer<&mut Vec<u8>>) -> WireResult<()>;
}

/// Where a response's topic entries sit in the protocol: its API key (for
/// the flexible versions) and the field names its errors report.
pub(crate) struct TopicFields {
    /// API key of the response.
    pub api_key: i16,
    /// The topic name / id field.
    pub topic: &'static str,
    /// The partition array of a topic entry.
    pub partitions: &'static str,
}

/// The first version naming topics by id, in both responses.
const ID_FROM: i16 = 13;

/// Fails unless `topic` is the kind `version` carries (name up to v12, id
/// from v13).
pub(crate) fn check_topic_kind(
    topic: &FetchTopic<'_>,
    version: i16,
    field: &'static str,
) -> WireResult<()> {
    match (topic, version >= ID_FROM) {
        (FetchTopic::Name(_), false) | (FetchTopic::Id(_), true) => Ok(()),
        (FetchTopic::Name(_), true) => Err(WireError::Unencodable {
            field,
            reason: "this version names topics by id, got a name",
        }),
        (FetchTopic::Id(_), false) => Err(WireError::Unencodable {
            field,
            reason: "this version names topics by name, got an id",
        }),
    }
}

/// Appends one topic entry (topic, partitions, empty tags when flexible).
pub(crate) fn put_topic_entry<P: PartitionEntry>(
    w: &mut Writer<&mut Vec<u8>>,
    fields: &TopicFields,
    version: i16,
    topic: &FetchTopic<'_>,
    partitions: &[&P],
) -> WireResult<()> {
    let flexible = api::is_flexible(fields.api_key, version);
    check_topic_kind(topic, version, fields.topic)?;
    match topic {
        FetchTopic::Name(n) => w.put_string_v(flexible, n, fields.topic)?,
        FetchTopic::Id(id) => w.put_uuid(id),
    }
    w.put_array_len_v(flexible, Some(partitions.len()), fields.partitions)?;
    for p in partitions {
        p.encode(version, w)?;
    }
    if flexible {
        w.put_uvarint(0);
    }
    Ok(())
}

/// Partition entries encoded back to back for `version`.
pub(crate) fn encode_entries<P: PartitionEntry>(
    version: i16,
    entries: &[&P],
) -> WireResult<Vec<u8>> {
    let mut out = Vec::new();
    let mut w = Writer::new(&mut out);
    for p in entries {
        p.encode(version, &mut w)?;
    }
    Ok(out)
}

/// An array length prefix of `len` entries, as it is written for `field`.
pub(crate) fn array_len(flexible: bool, len: usize, field: &'static str) -> WireResult<Vec<u8>> {
    let mut out = Vec::with_capacity(5);
    Writer::new(&mut out).put_array_len_v(flexible, Some(len), field)?;
    Ok(out)
}

/// The proxy's partitions to add to an upstream response whose topic
/// entries are `upstream` (in wire order): per upstream topic, the entries
/// to append to it (`merged`), and the topics it does not hold as new
/// entries (`fresh`; one per distinct topic, in the order given).
pub(crate) struct Additions<'t, 'p, P> {
    /// Per upstream topic entry, the partition entries appended to it.
    pub merged: Vec<Vec<&'p P>>,
    /// New topic entries, added at the end of the `responses` array.
    pub fresh: Vec<(FetchTopic<'t>, Vec<&'p P>)>,
}

/// Plans where each of `add`'s partition entries goes (see [`Additions`]).
pub(crate) fn plan_additions<'t, 'p, P>(
    upstream: &[FetchTopic<'_>],
    add: &'p [(FetchTopic<'t>, Vec<P>)],
) -> Additions<'t, 'p, P> {
    let mut merged: Vec<Vec<&P>> = upstream.iter().map(|_| Vec::new()).collect();
    let mut fresh: Vec<(FetchTopic<'t>, Vec<&P>)> = Vec::new();
    for (topic, ps) in add {
        if ps.is_empty() {
            continue;
        }
        if let Some(i) = upstream.iter().position(|t| t == topic) {
            merged[i].extend(ps.iter());
        } else if let Some(f) = fresh.iter_mut().find(|(t, _)| t == topic) {
            f.1.extend(ps.iter());
        } else {
            fresh.push((*topic, ps.iter().collect()));
        }
    }
    Additions { merged, fresh }
}

/// The new topic entries of `fresh`, encoded back to back.
pub(crate) fn encode_fresh<P: PartitionEntry>(
    fields: &TopicFields,
    version: i16,
    fresh: &[(FetchTopic<'_>, Vec<&P>)],
) -> WireResult<Vec<u8>> {
    let mut out = Vec::new();
    let mut w = Writer::new(&mut out);
    for (topic, ps) in fresh {
        put_topic_entry(&mut w, fields, version, topic, ps)?;
    }
    Ok(out)
}
