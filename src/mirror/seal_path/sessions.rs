//! Fetch sessions: which partitions an incremental session carries, so a
//! controlled partition the session left out is still answered and a
//! stray one (no longer in the session) is dropped.

use super::*;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// Controlled partitions known to be out of an upstream fetch session, by
/// session id (KIP-227). A partition forgotten in a session is not sent to
/// forget again; a forgotten partition that is MIRRORING again (resumed)
/// makes the fetcher start a new full session, since the fetcher still
/// counts it in its session and would otherwise never ask for it again.
///
/// The memory is bounded: at most [`MAX_SESSIONS`] sessions, the least
/// recently used one forgotten first, and a session unused for
/// [`SESSION_IDLE_FORGET`] is forgotten on the next note. A forgotten
/// session may still be alive upstream (a fetcher that paused), holding
/// partitions it was told to forget: its id is kept in `evicted` (for
/// [`EVICTED_KEEP`]), and its next incremental request is answered with a
/// session error once, so the fetcher starts a new full session and lists
/// every partition it holds again.
#[derive(Default)]
pub struct SessionMemory {
    pub(super) sessions: std::sync::Mutex<Sessions>,
    /// Sessions remembered plus sessions evicted (the fetch path's fast
    /// check: zero means no request needs the memory).
    pub(super) tracked: std::sync::atomic::AtomicUsize,
    /// Sessions whose held partitions are known.
    pub(super) held: std::sync::atomic::AtomicUsize,
}

/// What [`SessionMemory`] holds under its lock.
#[derive(Default)]
pub(super) struct Sessions {
    out: HashMap<i32, Remembered>,
    /// Sessions forgotten while they had partitions out, and when.
    evicted: HashMap<i32, Instant>,
    /// What the fetcher holds in each of its sessions that mirrorguard saw
    /// start while it tracked sessions (see [`SessionMemory::may_hold`]).
    holds: HashMap<i32, Holds>,
    /// When idle sessions were last looked for.
    swept: Option<Instant>,
}

struct Remembered {
    out: HashSet<PartitionKey>,
    used: Instant,
}

/// The partitions a fetcher's session holds: listed in the full request that
/// created it, or added since by listing them. Forgotten ones are not
/// removed (the request's forgotten topics are not decoded): a session that
/// forgot a partition may still be reset for it, once.
struct Holds {
    keys: HashSet<PartitionKey>,
    used: Instant,
}

/// Sessions remembered per mirror; beyond it the least recently used one
/// is forgotten (and its id kept in `evicted`).
pub(super) const MAX_SESSIONS: usize = 4096;

/// A session with no request for this long is forgotten: a broker's
/// fetcher sends one every replica.fetch.wait.max.ms (500 ms by default),
/// and Kafka may evict a session idle for 120 s
/// (min.incremental.fetch.session.eviction.ms).
pub(super) const SESSION_IDLE_FORGET: Duration = Duration::from_secs(600);

/// How long the id of a forgotten session is kept, so that its next
/// incremental request (if it ever comes) starts a full session.
pub(super) const EVICTED_KEEP: Duration = Duration::from_secs(3600);

/// Evicted ids kept at most (oldest dropped first).
pub(super) const MAX_EVICTED: usize = 4 * MAX_SESSIONS;

impl Sessions {
    fn evict(&mut self, session_id: i32, now: Instant) {
        if self.out.remove(&session_id).is_some() {
            if self.evicted.len() >= MAX_EVICTED {
                if let Some(oldest) = self
                    .evicted
                    .iter()
                    .min_by_key(|(_, t)| **t)
                    .map(|(id, _)| *id)
                {
                    self.evicted.remove(&oldest);
                }
            }
            self.evicted.insert(session_id, now);
        }
    }

    /// Forgets idle sessions and expired evicted ids, at most once a minute.
    fn sweep(&mut self, now: Instant) {
        if self
            .swept
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(60))
        {
            return;
        }
        self.swept = Some(now);
        let idle: Vec<i32> = self
            .out
            .iter()
            .filter(|(_, r)| now.duration_since(r.used) >= SESSION_IDLE_FORGET)
            .map(|(id, _)| *id)
            .collect();
        for id in idle {
            self.evict(id, now);
        }
        self.holds
            .retain(|_, h| now.duration_since(h.used) < SESSION_IDLE_FORGET);
        self.evicted
            .retain(|_, t| now.duration_since(*t) < EVICTED_KEEP);
    }
}

impl SessionMemory {
    fn lock(&self) -> std::sync::MutexGuard<'_, Sessions> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn recount(&self, m: &Sessions) {
        self.tracked.store(
            m.out.len() + m.evicted.len(),
            std::sync::atomic::Ordering::Relaxed,
        );
        self.held
            .store(m.holds.len(), std::sync::atomic::Ordering::Relaxed);
    }

    pub(super) fn any(&self) -> bool {
        self.tracked.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    /// The controlled partitions out of `session_id`, and whether that
    /// session was forgotten while it had some (it must start over: the
    /// caller answers it with a session error, once).
    pub(super) fn out_of(&self, session_id: i32) -> (HashSet<PartitionKey>, bool) {
        let now = Instant::now();
        let mut m = self.lock();
        if m.evicted.remove(&session_id).is_some() {
            self.recount(&m);
            return (HashSet::new(), true);
        }
        match m.out.get_mut(&session_id) {
            Some(r) => {
                r.used = now;
                (r.out.clone(), false)
            }
            None => (HashSet::new(), false),
        }
    }

    pub(super) fn note(&self, session_id: i32, keys: &[PartitionKey], fresh: bool) {
        self.note_at(session_id, keys, fresh, Instant::now());
    }

    fn note_at(&self, session_id: i32, keys: &[PartitionKey], fresh: bool, now: Instant) {
        let mut m = self.lock();
        m.sweep(now);
        m.evicted.remove(&session_id);
        if m.out.len() >= MAX_SESSIONS && !m.out.contains_key(&session_id) {
            if let Some(lru) = m.out.iter().min_by_key(|(_, r)| r.used).map(|(id, _)| *id) {
                m.evict(lru, now);
            }
        }
        let r = m.out.entry(session_id).or_insert_with(|| Remembered {
            out: HashSet::new(),
            used: now,
        });
        r.used = now;
        if fresh {
            r.out.clear();
        }
        r.out.extend(keys.iter().cloned());
        if r.out.is_empty() {
            m.out.remove(&session_id);
        }
        self.recount(&m);
    }

    /// A session the fetcher created with a full request listing `listed`:
    /// what it holds is known from now on.
    pub(super) fn note_holds(&self, session_id: i32, listed: &[PartitionKey]) {
        let now = Instant::now();
        let mut m = self.lock();
        if m.holds.len() >= MAX_SESSIONS && !m.holds.contains_key(&session_id) {
            // The least recently used one becomes unknown (it may be reset
            // once, as any session mirrorguard did not see start).
            if let Some(lru) = m
                .holds
                .iter()
                .min_by_key(|(_, h)| h.used)
                .map(|(id, _)| *id)
            {
                m.holds.remove(&lru);
            }
        }
        m.holds.insert(
            session_id,
            Holds {
                keys: listed.iter().cloned().collect(),
                used: now,
            },
        );
        self.recount(&m);
    }

    /// Partitions an incremental request of `session_id` listed: they are in
    /// the session now (a fetcher adds a partition by listing it).
    pub(super) fn add_held(&self, session_id: i32, listed: &[PartitionKey]) {
        if self.held.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            return;
        }
        let mut m = self.lock();
        if let Some(h) = m.holds.get_mut(&session_id) {
            h.used = Instant::now();
            for k in listed {
                if !h.keys.contains(k) {
                    h.keys.insert(k.clone());
                }
            }
        }
    }

    /// Whether the fetcher may hold `key` in `session_id` without listing
    /// it: known for a session mirrorguard saw start while it tracked
    /// sessions (some partition controlled), any other may.
    pub(super) fn may_hold(&self, session_id: i32, key: &PartitionKey) -> bool {
        self.lock()
            .holds
            .get(&session_id)
            .is_none_or(|h| h.keys.contains(key))
    }

    /// `session_id` was answered with a session error: the fetcher starts a
    /// new session (whose full request says what it holds), and this one,
    /// should a request still name it, holds nothing to be reset for again.
    pub(super) fn reset_session(&self, session_id: i32) {
        let mut m = self.lock();
        m.out.remove(&session_id);
        m.evicted.remove(&session_id);
        m.holds.insert(
            session_id,
            Holds {
                keys: HashSet::new(),
                used: Instant::now(),
            },
        );
        self.recount(&m);
    }

    /// Forgets what sessions hold, once nothing is controlled: requests then
    /// go unplanned, so additions would be missed.
    pub(super) fn forget_holds(&self) {
        if self.held.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            return;
        }
        let mut m = self.lock();
        m.holds.clear();
        self.recount(&m);
    }

    /// Sessions remembered and evicted ids kept (for tests).
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        let m = self.lock();
        (m.out.len(), m.evicted.len())
    }
}

/// Once the upstream accepted a session request, remembers which controlled
/// partitions are out of that session now.
pub(super) fn note_session(
    mirror: &MirrorContext,
    h: &RequestHeader,
    plan: &FetchPlan,
    body: &[u8],
) {
    if h.api_version < 7 || plan.session_epoch < 0 {
        return;
    }
    let (Some(code), Some(id)) = (body.get(4..6), body.get(6..10)) else {
        return;
    };
    let code = i16::from_be_bytes([code[0], code[1]]);
    let id = i32::from_be_bytes([id[0], id[1], id[2], id[3]]);
    if code != 0 || id == 0 {
        return;
    }
    if plan.session_epoch == 0 {
        // A new session: it holds none of the partitions dropped from the
        // full request; the fetcher's holds what it listed.
        mirror.sessions.note(id, &plan.out_of_session, true);
        if let Some(listed) = &plan.listed {
            mirror.sessions.note_holds(id, listed);
        }
    } else if id == plan.session_id {
        mirror.sessions.note(id, &plan.out_of_session, false);
    }
}

/// Whether an upstream response partition belongs to a controlled partition
/// the request did not list (an incremental session kept it): it must not
/// reach the fetcher (no source records, no source errors).
pub fn is_stray(
    mirror: &MirrorContext,
    plan: Option<&FetchPlan>,
    topic: &FetchTopic<'_>,
    partition: i32,
) -> bool {
    if !mirror.lifecycle.controls()
        || is_controlled(plan, topic, partition)
        || is_below_cut(plan, topic, partition)
    {
        return false;
    }
    let key = mirror.partition_key(topic, partition);
    mirror
        .lifecycle
        .get(&key)
        .is_some_and(|e| e.state != State::Mirroring)
}

/// Drops stray controlled partitions (see [`is_stray`]) from a response
/// whose request had no plan; the frame is returned untouched when there
/// are none (the common case).
pub fn drop_strays(
    mirror: &MirrorContext,
    h: &RequestHeader,
    frame: BytesMut,
) -> Result<BytesMut, RewriteError> {
    if !mirror.lifecycle.controls() {
        return Ok(frame);
    }
    let hv = handlers::response_header_version(h.api_key, h.api_version)
        .ok_or_else(|| err(h.api_version, "unknown response header version".into()))?;
    let body_at = response_body_offset(&frame, hv)
        .ok_or_else(|| err(h.api_version, "response header truncated".into()))?;
    let body = &frame[body_at..];
    let mut any = false;
    handlers::walk_fetch_response(h.api_version, body, &mut |p| {
        any |= is_stray(mirror, None, &p.topic, p.partition_index);
    })
    .map_err(|e| err(h.api_version, e.to_string()))?;
    if !any {
        return Ok(frame);
    }
    let new_body = splice_fetch_response_dropping(
        h.api_version,
        body,
        &mut |p| {
            let stray = is_stray(mirror, None, &p.topic, p.partition_index);
            if stray {
                mirror.seal_metrics.strays.inc();
            }
            stray
        },
        &mut |_| None,
        &[],
    )
    .map_err(|e| err(h.api_version, e.to_string()))?;
    let out = crate::filter::with_body(&frame, body_at, &new_body);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(p: i32) -> PartitionKey {
        PartitionKey::new([0; 16], "t", p)
    }

    #[test]
    fn a_full_memory_forgets_the_least_recently_used_session_only() {
        let mem = SessionMemory::default();
        let t0 = Instant::now();
        for id in 1..=MAX_SESSIONS as i32 {
            mem.note_at(id, &[key(0)], true, t0 + Duration::from_millis(id as u64));
        }
        // Session 1 is used again: session 2 is now the least recently used.
        assert_eq!(mem.out_of(1), (HashSet::from([key(0)]), false));
        mem.note_at(100_000, &[key(1)], true, t0 + Duration::from_secs(5));
        assert_eq!(mem.counts(), (MAX_SESSIONS, 1));
        // Every other session is still remembered (before: all forgotten at once).
        assert_eq!(mem.out_of(1).0, HashSet::from([key(0)]));
        assert_eq!(mem.out_of(3).0, HashSet::from([key(0)]));
        assert_eq!(mem.out_of(100_000).0, HashSet::from([key(1)]));
        // The evicted session is told to start over, once.
        assert_eq!(mem.out_of(2), (HashSet::new(), true));
        assert_eq!(mem.out_of(2), (HashSet::new(), false));
        assert_eq!(mem.counts(), (MAX_SESSIONS, 0));
    }

    #[test]
    fn an_idle_session_is_forgotten_and_its_id_kept_for_a_while() {
        let mem = SessionMemory::default();
        let t0 = Instant::now();
        mem.note_at(7, &[key(0)], true, t0);
        mem.note_at(8, &[key(0)], true, t0);
        // Session 8 keeps fetching; 7 falls silent.
        let later = t0 + SESSION_IDLE_FORGET + Duration::from_secs(61);
        mem.note_at(8, &[key(1)], false, later);
        assert_eq!(mem.counts(), (1, 1));
        assert!(mem.any());
        // Its ids expire too: then nothing is tracked for it.
        let much_later = later + EVICTED_KEEP + Duration::from_secs(61);
        mem.note_at(8, &[], true, much_later);
        assert_eq!(mem.counts(), (0, 0));
        assert!(!mem.any());
    }

    #[test]
    fn a_forgotten_session_is_not_told_to_start_over() {
        let mem = SessionMemory::default();
        mem.note(9, &[key(0)], true);
        mem.reset_session(9);
        assert_eq!(mem.out_of(9), (HashSet::new(), false));
        assert!(!mem.any());
    }

    #[test]
    fn a_session_seen_from_its_start_may_hold_only_what_it_listed_or_added() {
        let mem = SessionMemory::default();
        // Unknown sessions may hold anything.
        assert!(mem.may_hold(5, &key(0)));
        mem.note_holds(5, &[key(1)]);
        assert!(!mem.may_hold(5, &key(0)));
        assert!(mem.may_hold(5, &key(1)));
        // An incremental request that lists p0 adds it.
        mem.add_held(5, &[key(0)]);
        assert!(mem.may_hold(5, &key(0)));
        // Nothing controlled any more: what sessions hold is forgotten.
        mem.note_holds(6, &[]);
        mem.forget_holds();
        assert!(mem.may_hold(6, &key(0)));
        mem.add_held(6, &[key(1)]);
        assert!(mem.may_hold(6, &key(2)), "an unknown session stays unknown");
    }

    #[test]
    fn a_reset_session_is_not_reset_again() {
        let mem = SessionMemory::default();
        mem.note(9, &[key(0)], true);
        assert!(mem.may_hold(9, &key(3)));
        mem.reset_session(9);
        assert!(!mem.may_hold(9, &key(3)));
        assert_eq!(mem.out_of(9), (HashSet::new(), false));
    }
}
