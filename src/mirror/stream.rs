//! The streamed fetch path: a mirror listener's Fetch response rewritten as
//! it arrives (cut-through), holding back only what must change first.
//!
//! [`FetchStream`] is a walker over the response frame that needs no I/O: it
//! is given the bytes received so far and moves a cursor over them, parsing
//! each piece only once it is whole, and says what it needs next
//! ([`Step`]): more bytes, a wait for durable work ([`Pending`], the same
//! the store-and-forward path blocks on), or nothing. Everything before its
//! cursor is final and may leave, except from a *hold* point on. [`relay`]
//! drives it between the upstream [`FrameReader`] and the client.
//!
//! What is held until processed: the response header and each topic and
//! partition head (up to its records length); each v2 batch's 61-byte header
//! until its PID is mapped, observed and patched in place (the CRC shifted
//! by the change's delta, O(1)); then the batch's payload is passed as it
//! arrives, never held. Held whole: control batches (their first record is
//! read for the producer state), a batch whose sampled CRC check is due, and
//! a batch that would create durable state (a new producer's claim, a
//! collision's salt), which is verified in full first and leaves only once
//! the claims or salts of every complete batch buffered with it are durable
//! (one write for them all). A partition's first entry waits for its
//! take-over, gap re-check or replay. A partition with aborted transactions
//! (a read_committed fetch in region mode) is held whole from its head: the
//! entries precede the records but are mapped with the salts its batches
//! may create. Legacy (magic 0/1) entries, a truncated trailing batch, a
//! corrupt entry and what follows it, and error partitions pass untouched.
//! The per-batch step, the checks and the salt resolution are the ones the
//! store-and-forward path ([`super::rewrite_fetch_body`]) runs
//! (`batch::BatchStep`, the `planner` functions), so the bytes and the
//! producer state come out the same (the proptests compare them; see
//! below for where the held path looks ahead).
//!
//! Memory: at most one held item at a time, plus one read piece
//! ([`READ_CHUNK`]): a batch held whole is at most the fetcher's partition
//! max bytes, or the source's largest batch when that is larger (KIP-74), a
//! partition with aborted transactions at most its share of the response.
//! The hard cap is the listener's frame limit (`[limits] max_frame_bytes`:
//! a frame above it is refused before a byte of it is read), so a hostile
//! source that sends one huge batch costs at most what the held path
//! would, never more. While a wait runs the walker reads nothing more.
//!
//! One difference from the store-and-forward path, by design: that path
//! scans a whole response against the state from before it, and once its
//! claims and salts are durable runs again from the start; the walker checks
//! each batch against the state the batches before it left. They differ only
//! where the held path looks ahead within one response: a batch after a
//! MIRROR_PID_RESET barrier (checked against the state before the barrier
//! there), a batch of an origin whose collision a later batch of the response
//! reveals (salted there, not here, as it would be had the response ended
//! before the later batch), and a corrupt batch of a producer a later valid
//! batch claims (mapped and observed there; passed untouched, like any
//! corrupt batch that would start a producer, here). The walker's outcome is
//! the one the held path gives for the same bytes cut into responses at
//! those batches, so it does not depend on where the source cut its
//! responses (a barrier also ends what the walk remembers of the producers
//! the response started). The proptests compare the two paths on responses
//! without such look-ahead, and the walk of any response with the held path
//! serving its entries one per response
//! (`streamed_equals_held_one_entry_per_response`). Which one is right is
//! settled for the walk: an outcome that depends on response boundaries
//! (which the source chooses, and a re-fetch changes) cannot be the
//! reference; the held path keeps its look-ahead only for the responses it
//! must hold (the cases are corrupt batches, which the destination
//! refuses anyway, and batches after a barrier inside one response).
//!
//! What is not streamed (decided before the response arrives, by the mirror
//! fetch filter): responses whose length must change. Those are a seal's
//! (partitions answered locally, readers below a cut: the request has a
//! seal plan, or some partition is controlled so a session may carry a
//! stray), Fetch v16+ (KIP-951 NodeEndpoints are rewritten by the address
//! filter; the listener advertises Fetch v15 at most, so only clients that
//! ignore ApiVersions send it), and partitions whose destination topic id is
//! not known yet (answered with no records while it is looked up): the
//! first responses of a mirror are held until one has found every topic id
//! known. A walker that meets such a partition anyway fails with
//! [`StreamError::NotStreamable`]: the connection closes (the fetcher
//! reconnects) and the mirror holds its responses again until a held one
//! needs no such answer. Any failure after bytes went to the client closes
//! the connection: the client never sees a short frame followed by another.

use std::sync::atomic::Ordering;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::batch::{rewrite_aborted, BatchEffect, BatchStep, PartitionWalk};
use super::planner::{
    batch_need, ownership, replay_job, salt_for, scan_partition_from, BatchNeed, Ownership,
    SaltNeed, Scan,
};
use super::*;
use crate::codec::frame::READ_CHUNK;
use crate::codec::{FrameError, FrameReader};
use crate::records::{BatchError, BatchHeader, RECORD_BATCH_OVERHEAD};
use crate::wire::Reader;

/// The most waits a streamed response may go through at one place of its
/// walk (each a durable write or a read of the state): a bound against a
/// wait that changes nothing. A place needs a few (a take-over, a replay,
/// a claim); a wait after which the walk moves on is progress and is not
/// bounded, so a response of thousands of partitions that each wait once
/// (a take-over after a leadership move, a new producer's claim) streams
/// whole instead of closing the fetcher's connection every so many.
pub const MAX_STREAM_WAITS: usize = 256;

/// Waits of one streamed response that add up to this much are told to the
/// operator (a WARN line and `response_held_long`): a third of a broker
/// fetcher's default request timeout.
pub const SLOW_WAITS: std::time::Duration = std::time::Duration::from_secs(10);

/// What the walker needs next.
pub enum Step {
    /// At least this many bytes past the cursor.
    Need(usize),
    /// This work done (the held bytes stay held meanwhile).
    Wait(Pending),
    /// The whole frame is processed.
    Done,
}

/// Why a streamed response failed.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// Reading the upstream failed.
    #[error("reading upstream: {0}")]
    Read(FrameError),
    /// Writing to the client failed.
    #[error("writing a response: {0}")]
    Write(std::io::Error),
    /// The response could not be rewritten (unparseable, a state limit, a
    /// wait that failed).
    #[error(transparent)]
    Rewrite(RewriteError),
    /// The response needs a length change (see the module doc).
    #[error("Fetch response cannot be streamed: {0}")]
    NotStreamable(&'static str),
}

/// A failed streamed response and how much of it reached the client.
#[derive(Debug)]
pub struct StreamFailure {
    /// What failed.
    pub error: StreamError,
    /// Bytes written to the client before it failed.
    pub written: usize,
}

/// Where the walker is in the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Header,
    Topic,
    Partition,
    Entry,
    /// Bytes passed untouched (a payload, a legacy entry, a truncated or
    /// corrupt tail, an error partition's records, trailing bytes).
    Pass(usize),
    PartitionTail,
    TopicTail,
    Tail,
    Done,
}

/// The partition being walked.
struct Part {
    /// `None`: passed untouched (an error partition, no records).
    handle: Option<PartitionHandle>,
    rec_len: usize,
    rec_left: usize,
    /// Its first entry is still to come (phase 0 looks at it).
    first: bool,
    /// The entry walk stopped (truncated or corrupt entry): the rest passes.
    ended: bool,
    walk: PartitionWalk,
    /// Held from its head for its aborted transactions.
    holds_aborted: bool,
}

/// The streaming walker of one Fetch response of a mirror listener.
pub struct FetchStream {
    mirror: Arc<MirrorContext>,
    source: SourceIdentity,
    version: i16,
    flexible: bool,
    header_flexible: bool,
    fetcher: bool,
    holding: bool,
    now: i64,
    total: usize,
    /// Frame bytes already drained from the buffer (written).
    drained: usize,
    /// Buffer index of the first unprocessed byte.
    cur: usize,
    /// Buffer index from which bytes are held back.
    hold: Option<usize>,
    stage: Stage,
    topics_left: usize,
    parts_left: usize,
    topic: TopicRef,
    part: Option<Part>,
    /// ProducerId offsets of the held partition's aborted transactions,
    /// relative to the hold point (reused across partitions).
    aborted: Vec<usize>,
    sink: Vec<Anomaly>,
    /// Waits so far at the current place of the walk.
    waits: usize,
    /// The frame position of the last wait.
    waited_at: usize,
    /// [`SLOW_WAITS`], lower in tests.
    slow_waits: std::time::Duration,
    /// Claims the current partition's batches made in this response (what
    /// the held path's scan remembers; cleared per partition).
    claimed: std::collections::HashMap<i64, Origin>,
    /// The partition whose tagged fields come next, when a DivergingEpoch
    /// there would matter (the fetcher's answer, no error, v12+).
    tail_of: Option<i32>,
}

impl FetchStream {
    /// A walker for the response to `h` (a Fetch of `mirror`'s listener;
    /// its length is given by [`start`](Self::start)); `fetcher` as for
    /// [`rewrite_fetch_body_as`]. `None` when the mirror cannot stream it
    /// (no source identity yet, an unknown version).
    pub fn new(mirror: Arc<MirrorContext>, h: &RequestHeader, fetcher: bool) -> Option<Self> {
        let source = mirror.source()?.clone();
        let header_version = handlers::response_header_version(h.api_key, h.api_version)?;
        if !(4..=18).contains(&h.api_version) {
            return None;
        }
        let holding = mirror.salts.durable();
        Some(Self {
            source,
            version: h.api_version,
            flexible: crate::codec::api::is_flexible(crate::codec::api::FETCH, h.api_version),
            header_flexible: header_version >= 1,
            fetcher,
            holding,
            now: now_ms(),
            total: 0,
            drained: 0,
            cur: 0,
            hold: None,
            stage: Stage::Header,
            topics_left: 0,
            parts_left: 0,
            topic: TopicRef::Name(String::new()),
            part: None,
            aborted: Vec::new(),
            sink: Vec::new(),
            waits: 0,
            waited_at: 0,
            slow_waits: SLOW_WAITS,
            claimed: std::collections::HashMap::new(),
            tail_of: None,
            mirror,
        })
    }

    /// Sets the response's length (size prefix included) once its head
    /// has been read.
    pub fn start(&mut self, total: usize) {
        self.total = total;
    }

    /// Bytes at the front of the buffer that are final (may be written).
    pub fn releasable(&self) -> usize {
        self.hold.unwrap_or(self.cur)
    }

    /// Reports a response whose waits add up to `d` as held long (tests).
    #[cfg(test)]
    pub(crate) fn set_slow_waits(&mut self, d: std::time::Duration) {
        self.slow_waits = d;
    }

    /// The caller wrote (and removed) the first `n` bytes of the buffer.
    pub fn drain(&mut self, n: usize) {
        self.cur -= n;
        if let Some(h) = self.hold.as_mut() {
            *h -= n;
        }
        self.drained += n;
    }

    /// Frame bytes not received yet, given the buffer holds `buffered`.
    pub fn missing(&self, buffered: usize) -> usize {
        self.total.saturating_sub(self.drained + buffered)
    }

    fn consume_pass(&mut self, n: usize) {
        if let Stage::Pass(left) = self.stage {
            let left = left - n;
            if let Some(p) = self.part.as_mut() {
                p.rec_left -= n;
            }
            self.stage = if left > 0 {
                Stage::Pass(left)
            } else if self.part.is_some() {
                Stage::Entry
            } else {
                Stage::Done
            };
        }
    }

    fn err(&self, message: String) -> StreamError {
        StreamError::Rewrite(RewriteError {
            api: "Fetch",
            version: self.version,
            message,
        })
    }

    /// Parses one head item at the cursor with `f`: `Ok(None)` when more
    /// bytes are needed (the item is not whole yet).
    fn parse<T>(
        &self,
        buf: &[u8],
        f: impl FnOnce(&mut Reader<'_>) -> crate::wire::WireResult<T>,
    ) -> Result<Option<(T, usize)>, StreamError> {
        let avail = buf.get(self.cur..).unwrap_or_default();
        let mut r = Reader::new(avail);
        match f(&mut r) {
            Ok(v) => Ok(Some((v, r.position()))),
            Err(_) if self.missing(buf.len()) > 0 => Ok(None),
            Err(e) => Err(self.err(e.to_string())),
        }
    }

    /// Advances over the buffered bytes (patching them in place) as far as
    /// it can.
    pub fn advance(&mut self, buf: &mut [u8]) -> Result<Step, StreamError> {
        loop {
            let avail = buf.len() - self.cur;
            let more = |got: usize| Step::Need(got + 1);
            match self.stage {
                Stage::Done => return Ok(Step::Done),
                Stage::Pass(n) => {
                    let m = n.min(avail);
                    if m == 0 {
                        return Ok(Step::Need(1));
                    }
                    self.cur += m;
                    self.consume_pass(m);
                }
                Stage::Header => {
                    let (version, hflex, flex) =
                        (self.version, self.header_flexible, self.flexible);
                    let Some((topics, used)) = self.parse(buf, |r| {
                        r.read_i32("frame size")?;
                        r.read_i32("FetchResponse.correlation_id")?;
                        if hflex {
                            r.skip_tagged_fields_v(true, "FetchResponse header _tagged_fields")?;
                        }
                        r.read_i32("FetchResponse.throttle_time_ms")?;
                        if version >= 7 {
                            r.read_i16("FetchResponse.error_code")?;
                            r.read_i32("FetchResponse.session_id")?;
                        }
                        r.read_array_len_v(flex, 2, "FetchResponse.responses")
                    })?
                    else {
                        return Ok(more(avail));
                    };
                    self.cur += used;
                    self.topics_left = topics;
                    self.stage = Stage::Topic;
                }
                Stage::Topic => {
                    if self.topics_left == 0 {
                        self.stage = Stage::Tail;
                        continue;
                    }
                    let (version, flex) = (self.version, self.flexible);
                    let mut name_at = 0..0;
                    let Some(((id, parts), used)) = self.parse(buf, |r| {
                        let id = if version >= 13 {
                            Some(r.read_uuid("FetchResponse.responses.topic_id")?)
                        } else {
                            let name = r.read_string_v(flex, "FetchResponse.responses.topic")?;
                            let end = r.position();
                            name_at = end - name.len()..end;
                            None
                        };
                        let parts =
                            r.read_array_len_v(flex, 24, "FetchResponse.responses.partitions")?;
                        Ok((id, parts))
                    })?
                    else {
                        return Ok(more(avail));
                    };
                    match id {
                        Some(id) => self.topic = TopicRef::Id(id),
                        None => {
                            let at = self.cur + name_at.start..self.cur + name_at.end;
                            let name = std::str::from_utf8(&buf[at]).unwrap_or_default();
                            match &mut self.topic {
                                TopicRef::Name(n) => {
                                    n.clear();
                                    n.push_str(name);
                                }
                                other => *other = TopicRef::Name(name.to_string()),
                            }
                        }
                    }
                    self.cur += used;
                    self.parts_left = parts;
                    self.stage = if parts == 0 {
                        Stage::TopicTail
                    } else {
                        Stage::Partition
                    };
                }
                Stage::Partition => {
                    if let Some(step) = self.partition_head(buf)? {
                        return Ok(step);
                    }
                }
                Stage::Entry => {
                    if let Some(step) = self.entry(buf)? {
                        return Ok(step);
                    }
                }
                Stage::PartitionTail => {
                    let flex = self.flexible;
                    let Some((diverging, used)) = self.parse(buf, |r| {
                        if !flex {
                            return Ok(None);
                        }
                        let tags =
                            r.read_tagged_fields("FetchResponse.partitions._tagged_fields")?;
                        Ok(handlers::diverging_epoch(&tags))
                    })?
                    else {
                        return Ok(more(avail));
                    };
                    if let (Some(index), Some((epoch, end_offset))) =
                        (self.tail_of.take(), diverging)
                    {
                        let topic = self.topic.as_fetch_topic();
                        self.mirror
                            .source_truncated(&topic, index, epoch, end_offset);
                    }
                    self.cur += used;
                    self.parts_left -= 1;
                    self.stage = if self.parts_left == 0 {
                        Stage::TopicTail
                    } else {
                        Stage::Partition
                    };
                }
                Stage::TopicTail => {
                    let flex = self.flexible;
                    let Some(((), used)) = self.parse(buf, |r| {
                        r.skip_tagged_fields_v(flex, "FetchResponse.responses._tagged_fields")
                    })?
                    else {
                        return Ok(more(avail));
                    };
                    self.cur += used;
                    self.topics_left -= 1;
                    self.stage = Stage::Topic;
                }
                Stage::Tail => {
                    let flex = self.flexible;
                    let Some(((), used)) = self.parse(buf, |r| {
                        r.skip_tagged_fields_v(flex, "FetchResponse._tagged_fields")
                    })?
                    else {
                        return Ok(more(avail));
                    };
                    self.cur += used;
                    // Anything after the body passes as it came (the
                    // store-and-forward path ignores it too).
                    let rest = self.total - (self.drained + self.cur);
                    self.stage = if rest > 0 {
                        Stage::Pass(rest)
                    } else {
                        Stage::Done
                    };
                }
            }
        }
    }

    /// Parses a partition's head up to its records and decides how it is
    /// walked. `Some(step)`: more bytes needed.
    fn partition_head(&mut self, buf: &mut [u8]) -> Result<Option<Step>, StreamError> {
        let (version, flex) = (self.version, self.flexible);
        let start = self.cur;
        self.aborted.clear();
        let aborted = &mut self.aborted;
        let avail = buf.len() - start;
        let parsed = {
            let avail_buf = buf.get(start..).unwrap_or_default();
            let mut r = Reader::new(avail_buf);
            let res = (|| {
                let index = r.read_i32("FetchResponse.partitions.partition_index")?;
                let error = r.read_i16("FetchResponse.partitions.error_code")?;
                r.read_i64("FetchResponse.partitions.high_watermark")?;
                r.read_i64("FetchResponse.partitions.last_stable_offset")?;
                if version >= 5 {
                    r.read_i64("FetchResponse.partitions.log_start_offset")?;
                }
                let count = r.read_nullable_array_len_v(
                    flex,
                    16,
                    "FetchResponse.partitions.aborted_transactions",
                )?;
                for _ in 0..count.unwrap_or(0) {
                    aborted.push(r.position());
                    r.read_i64("FetchResponse.aborted_transactions.producer_id")?;
                    r.read_i64("FetchResponse.aborted_transactions.first_offset")?;
                    r.skip_tagged_fields_v(
                        flex,
                        "FetchResponse.aborted_transactions._tagged_fields",
                    )?;
                }
                if version >= 11 {
                    r.read_i32("FetchResponse.partitions.preferred_read_replica")?;
                }
                // The records length only: the records themselves stream.
                let len = if flex {
                    (r.read_uvarint("FetchResponse.partitions.records")? as usize).saturating_sub(1)
                } else {
                    // -1 is null (no records); any other negative length is
                    // malformed, as the held path's decoder says.
                    let at = r.position();
                    match r.read_i32("FetchResponse.partitions.records")? {
                        -1 => 0,
                        n => usize::try_from(n).map_err(|_| {
                            crate::wire::WireError::InvalidLength {
                                field: "FetchResponse.partitions.records",
                                offset: at,
                                len: i64::from(n),
                                available: avail_buf.len().saturating_sub(at + 4),
                            }
                        })?,
                    }
                };
                Ok((index, error, len))
            })();
            match res {
                Ok(v) => Ok(Some((v, r.position()))),
                Err(_) if self.missing(buf.len()) > 0 => Ok(None),
                Err(e) => Err(e),
            }
        };
        let Some(((index, error, rec_len), used)) =
            parsed.map_err(|e: crate::wire::WireError| self.err(e.to_string()))?
        else {
            return Ok(Some(Step::Need(avail + 1)));
        };
        let rest_of_frame = self.total - (self.drained + start + used);
        if rec_len > rest_of_frame {
            return Err(self.err(format!(
                "partition {index} records of {rec_len} bytes past the end of the frame"
            )));
        }
        let mirror = self.mirror.clone();
        let topic = self.topic.as_fetch_topic();
        let mut handle = None;
        if error == 0 && (rec_len > 0 || !self.aborted.is_empty()) {
            // Stray controlled partitions of a session are dropped, and
            // partitions whose destination topic id is not known are answered
            // with no records: length changes, which only a held response
            // can make.
            if crate::mirror::seal_path::is_stray(&mirror, None, &topic, index) {
                return Err(self.not_streamable("a stray controlled partition"));
            }
            if let (true, FetchTopic::Id(id)) = (self.holding, &topic) {
                if !mirror.names_source_id(id) {
                    return Err(self.not_streamable("a topic id the source has not named yet"));
                }
            }
            let h = mirror
                .partition_handle(&topic, index)
                .map_err(|e| self.err(mirror.state_limit(e).to_string()))?;
            if self.holding && mirror.salts.topic_id(&h.key().topic).is_none() {
                return Err(self.not_streamable("a destination topic id not known yet"));
            }
            handle = Some(h);
        }
        let holds_aborted =
            handle.is_some() && !self.aborted.is_empty() && mirror.mode == PidMode::Region;
        if holds_aborted && self.hold.is_none() {
            self.hold = Some(start);
        }
        self.cur = start + used;
        self.claimed.clear();
        self.tail_of = (self.fetcher && error == 0 && flex).then_some(index);
        self.part = Some(Part {
            ended: handle.is_none(),
            handle,
            rec_len,
            rec_left: rec_len,
            first: true,
            walk: PartitionWalk::default(),
            holds_aborted,
        });
        self.stage = Stage::Entry;
        Ok(None)
    }

    fn not_streamable(&self, why: &'static str) -> StreamError {
        self.mirror.stream_hold.store(true, Ordering::Relaxed);
        StreamError::NotStreamable(why)
    }

    /// At an entry of the current partition's records (or their end).
    fn entry(&mut self, buf: &mut [u8]) -> Result<Option<Step>, StreamError> {
        let avail = buf.len() - self.cur;
        let Some(part) = self.part.as_mut() else {
            return Err(self.err("records outside a partition".into()));
        };
        if part.rec_left == 0 {
            self.end_partition(buf);
            return Ok(None);
        }
        if part.ended {
            self.stage = Stage::Pass(part.rec_left);
            return Ok(None);
        }
        let need = part.rec_left.min(RECORD_BATCH_OVERHEAD);
        if avail < need {
            return Ok(Some(Step::Need(need)));
        }
        let position = part.rec_len - part.rec_left;
        let head = &buf[self.cur..self.cur + need];
        let entry = classify(head, part.rec_left);
        let Some(handle) = part.handle.clone() else {
            return Err(self.err("records walked without a partition".into()));
        };
        let (total, header) = match entry {
            Head::Truncated => {
                part.ended = true;
                part.first = false;
                return Ok(None);
            }
            Head::Corrupt(e) => {
                part.ended = true;
                part.first = false;
                self.step(&handle).corrupt_entry(position, &e);
                return Ok(None);
            }
            Head::Legacy(total) => {
                if part.first {
                    let first = crate::records::read_i64(head, 0).unwrap_or(0);
                    if let Some(p) = self.phase0(&handle, first)? {
                        return Ok(Some(Step::Wait(p)));
                    }
                }
                self.part_mut().first = false;
                self.stage = Stage::Pass(total);
                return Ok(None);
            }
            Head::V2(header) => (header.size(), header),
        };
        if part.first {
            if let Some(p) = self.phase0(&handle, header.base_offset)? {
                return Ok(Some(Step::Wait(p)));
            }
            self.part_mut().first = false;
        }
        let mut need = handle.with(|s| batch_need(&self.mirror, &self.source, s, &header));
        if let BatchNeed::Claim(mapped, origin) = need {
            // A producer this partition of the response started already
            // (its claim not in the state: a reader without durable claims)
            // starts nothing again; another origin on its PID collides, as
            // in the held path's scan.
            match self.claimed.get(&mapped) {
                Some(first) if *first == origin => need = BatchNeed::Nothing,
                Some(_) => need = BatchNeed::Salt(origin),
                None => {}
            }
        }
        let whole =
            header.is_control() || self.step(&handle).sample_due() || need != BatchNeed::Nothing;
        if whole && avail < total {
            return Ok(Some(Step::Need(total)));
        }
        let mut corrupt = false;
        if need != BatchNeed::Nothing {
            // The claims and salts of every complete batch buffered from
            // here on, found as the store-and-forward path finds them.
            let window_end = self.cur + avail.min(self.part_ref().rec_left);
            let window = &buf[self.cur..window_end];
            let seed = Scan {
                claimed: self.claimed.clone(),
                ..Scan::default()
            };
            let scan = handle
                .with(|s| scan_partition_from(&self.mirror, &self.source, s, window, seed, true));
            corrupt = scan.corrupt.contains(&0);
            if !corrupt {
                if let Some(p) = self.durable_first(&handle, scan)? {
                    return Ok(Some(Step::Wait(p)));
                }
            }
        }
        let len = if whole { total } else { RECORD_BATCH_OVERHEAD };
        let batch = &mut buf[self.cur..self.cur + len];
        let mut walk = std::mem::take(&mut self.part_mut().walk);
        let mut sink = std::mem::take(&mut self.sink);
        let res = self
            .step(&handle)
            .batch(&mut walk, &header, batch, &mut sink, corrupt);
        self.sink = sink;
        self.part_mut().walk = walk;
        if res.map_err(|e| self.err(e.to_string()))? == BatchEffect::StateReset {
            // Producers this response started before the barrier are new
            // again after it, as they are to a response that starts there.
            self.claimed.clear();
        }
        if let (BatchNeed::Claim(mapped, origin), false) = (need, corrupt) {
            self.claimed.insert(mapped, origin);
        }
        self.cur += len;
        self.part_mut().rec_left -= len;
        if total > len {
            self.stage = Stage::Pass(total - len);
        }
        Ok(None)
    }

    /// What the scanned window needs durable before its first batch leaves
    /// (salts before claims, as phase 1 of the store-and-forward path).
    fn durable_first(
        &self,
        handle: &PartitionHandle,
        scan: super::planner::Scan,
    ) -> Result<Option<Pending>, StreamError> {
        let mirror = &self.mirror;
        let mut salts = Vec::new();
        for origin in &scan.colliding {
            // Claims of this partition of the response not in the state yet
            // (the held path resolves against the same).
            let earlier: Vec<(i64, Origin)> = self
                .claimed
                .iter()
                .map(|(m, o)| (*m, *o))
                .chain(scan.claims.iter().copied())
                .filter(|(_, o)| o != origin)
                .collect();
            match salt_for(mirror, &self.source, handle, *origin, &earlier, self.now)
                .map_err(|e| self.err(e.to_string()))?
            {
                SaltNeed::None => {}
                SaltNeed::TopicIds => return Ok(Some(Pending::TopicIds)),
                SaltNeed::Salt(s) => salts.push(s),
            }
        }
        if !salts.is_empty() {
            return Ok(Some(Pending::Salts(salts)));
        }
        let new = scan.claims.len() as u64;
        let max = mirror.registry.config().max_producers;
        if new > 0 && mirror.registry.total_producers() + new > max {
            let e = mirror.state_limit(MirrorError::ProducerLimit {
                tracked: mirror.registry.total_producers(),
                new,
                max,
            });
            return Err(self.err(e.to_string()));
        }
        if new > 0 && mirror.salts.durable() {
            return Ok(Some(Pending::Claims(vec![(handle.clone(), scan.claims)])));
        }
        Ok(None)
    }

    /// Phase 0 for the fetcher's partition whose first entry is at `first`.
    ///
    /// A take-over or re-check reads `__mirror_state`, which may say that
    /// the partition is sealing (or sealed) since this response began: a
    /// stop taken through another instance during a leadership move within
    /// the tail lag. Its source batches must then never reach the fetcher,
    /// and the partition's head already left: the response cannot be
    /// streamed on ([`StreamError::NotStreamable`]: the connection closes,
    /// and the fetcher's next fetch is held and answered by the seal path).
    fn phase0(&self, handle: &PartitionHandle, first: i64) -> Result<Option<Pending>, StreamError> {
        if !self.fetcher {
            return Ok(None);
        }
        let key = handle.key();
        match ownership(&self.mirror, key, handle, first) {
            Ownership::Ready => {}
            Ownership::TakeOver(t) => return Ok(Some(Pending::TakeOver(vec![t]))),
            Ownership::Recheck(t) => return Ok(Some(Pending::Recheck(vec![t]))),
        }
        if self.mirror.lifecycle.controls()
            && self
                .mirror
                .lifecycle
                .get(key)
                .is_some_and(|e| e.state != crate::lifecycle::State::Mirroring)
        {
            self.mirror.seal_metrics.stream_controlled_midway.inc();
            tracing::warn!(mirror = %self.mirror.name, partition = %key,
                "a partition streamed to the destination fetcher is controlled (sealing or sealed \
                 through another instance) since its response began: the response is cut off and \
                 the connection closed, so no source batch past the cut reaches the fetcher");
            return Err(self.not_streamable("a partition controlled since the response began"));
        }
        if self.mirror.is_warm(key) {
            return Ok(None);
        }
        Ok(replay_job(&self.mirror, key, handle, first).map(|j| Pending::Replay(vec![j])))
    }

    fn step<'a>(&'a self, handle: &'a PartitionHandle) -> BatchStep<'a> {
        BatchStep {
            mirror: &self.mirror,
            source: &self.source,
            handle,
            now: self.now,
            forwarding: true,
            observe: self.fetcher,
        }
    }

    fn part_mut(&mut self) -> &mut Part {
        self.part.as_mut().expect("walking a partition")
    }

    fn part_ref(&self) -> &Part {
        self.part.as_ref().expect("walking a partition")
    }

    /// The partition's records are walked: its leader epoch noted, its
    /// aborted transactions mapped and released.
    fn end_partition(&mut self, buf: &mut [u8]) {
        if let Some(part) = self.part.take() {
            if let Some(handle) = &part.handle {
                self.step(handle).finish(&part.walk);
                if part.holds_aborted {
                    if let Some(at) = self.hold {
                        if let Some(held) = buf.get_mut(at..) {
                            rewrite_aborted(
                                &self.mirror,
                                &self.source,
                                handle,
                                held,
                                &self.aborted,
                            );
                        }
                    }
                }
            }
            if part.holds_aborted {
                self.hold = None;
            }
        }
        self.stage = Stage::PartitionTail;
    }
}

/// An entry of a partition's records, classified from its first bytes.
enum Head {
    V2(BatchHeader),
    Legacy(usize),
    Truncated,
    Corrupt(BatchError),
}

/// Classifies the entry whose first bytes are `head` (the first 61 of them,
/// or all the records left if fewer) with `rec_left` bytes of records left
/// from it, exactly as [`crate::records::walk`] would over the whole records.
fn classify(head: &[u8], rec_left: usize) -> Head {
    match crate::records::batch::next_entry_sized(head, rec_left) {
        None | Some(Ok(crate::records::Entry::Truncated { .. })) => Head::Truncated,
        Some(Ok(crate::records::Entry::Legacy { range, .. })) => Head::Legacy(range.len()),
        Some(Ok(crate::records::Entry::V2(h))) => Head::V2(h),
        Some(Err(e)) => Head::Corrupt(e),
    }
}

/// Relays the Fetch response of `total` bytes at the head of `reader` to
/// `out` through `walker`: bytes leave as soon as they are final, reading
/// stops while a wait runs. Returns the bytes written.
pub async fn relay<R, W>(
    walker: FetchStream,
    reader: &mut FrameReader<R>,
    out: &mut W,
) -> Result<usize, StreamFailure>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    relay_measured(walker, reader, out, &mut 0).await
}

/// [`relay`] that records in `peak` the most bytes its buffer held at once.
pub(crate) async fn relay_measured<R, W>(
    mut walker: FetchStream,
    reader: &mut FrameReader<R>,
    out: &mut W,
    peak: &mut usize,
) -> Result<usize, StreamFailure>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = BytesMut::new();
    let mut written = 0usize;
    // Time spent in waits (take-overs, replays, claims), told to the operator
    // when it nears what a fetcher waits for a response.
    let mut waited = std::time::Duration::ZERO;
    let mut waits = 0usize;
    let fail = |error: StreamError, written: usize| StreamFailure { error, written };
    loop {
        let step = walker.advance(&mut buf[..]).map_err(|e| fail(e, written))?;
        let n = walker.releasable();
        if n > 0 {
            let piece = buf.split_to(n);
            out.write_all(&piece)
                .await
                .map_err(|e| fail(StreamError::Write(e), written))?;
            walker.drain(n);
            written += n;
        }
        match step {
            Step::Done => {
                if walker.missing(buf.len()) > 0 || !buf.is_empty() {
                    return Err(fail(
                        walker.err("walk ended before the frame did".into()),
                        written,
                    ));
                }
                walker.mirror.metrics.streamed.inc();
                if waits > 0 && waited >= walker.slow_waits {
                    walker.mirror.metrics.held_long.inc();
                    tracing::warn!(mirror = %walker.mirror.name, waits,
                        waited_ms = waited.as_millis() as u64,
                        "a streamed Fetch response was held this long by its waits (taking \
                         partitions over, replaying, persisting claims, one after another): a \
                         destination fetcher gives up on a response after its request timeout \
                         (30 s by default) and fetches again");
                }
                return Ok(written);
            }
            Step::Wait(pending) => {
                let at = walker.drained + walker.cur;
                if at != walker.waited_at {
                    walker.waited_at = at;
                    walker.waits = 0;
                }
                walker.waits += 1;
                if walker.waits > MAX_STREAM_WAITS {
                    let e = walker.err(format!(
                        "response still blocked after {MAX_STREAM_WAITS} waits at frame byte {at}"
                    ));
                    return Err(fail(e, written));
                }
                let wait = walker.mirror.pending_wait(pending, walker.version);
                let started = std::time::Instant::now();
                let done = wait.await;
                waited += started.elapsed();
                waits += 1;
                done.map_err(|e| fail(StreamError::Rewrite(e), written))?;
            }
            Step::Need(_) => {
                let missing = walker.missing(buf.len());
                if missing == 0 {
                    return Err(fail(
                        walker.err("response ends inside an item".into()),
                        written,
                    ));
                }
                // As much of the frame as one read brings, even when the
                // walker needs only the rest of a payload: the next batch
                // heads are walked in the same pass and everything final
                // leaves in one write (a write per read, not per batch).
                let piece = reader
                    .read_piece(missing.min(READ_CHUNK))
                    .await
                    .map_err(|e| fail(StreamError::Read(e), written))?;
                if buf.is_empty() {
                    buf = piece;
                } else {
                    buf.extend_from_slice(&piece);
                }
                *peak = (*peak).max(buf.len());
            }
        }
    }
}
