//! Fetch sessions: which partitions an incremental session carries, so a
//! controlled partition the session left out is still answered and a
//! stray one (no longer in the session) is dropped.

use super::*;

/// Controlled partitions known to be out of an upstream fetch session, by
/// session id (KIP-227). A partition forgotten in a session is not sent to
/// forget again; a forgotten partition that is MIRRORING again (resumed)
/// makes the fetcher start a new full session, since the fetcher still
/// counts it in its session and would otherwise never ask for it again.
#[derive(Default)]
pub struct SessionMemory {
    pub(super) out:
        std::sync::Mutex<std::collections::HashMap<i32, std::collections::HashSet<PartitionKey>>>,
    /// Number of sessions remembered (the fetch path's fast check).
    pub(super) tracked: std::sync::atomic::AtomicUsize,
}

/// Sessions remembered per mirror; beyond it the memory starts over (the
/// cost is forgotten topics sent again, which a broker ignores).
pub(super) const MAX_SESSIONS: usize = 4096;

impl SessionMemory {
    pub(super) fn lock(
        &self,
    ) -> std::sync::MutexGuard<
        '_,
        std::collections::HashMap<i32, std::collections::HashSet<PartitionKey>>,
    > {
        self.out.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn any(&self) -> bool {
        self.tracked.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    pub(super) fn out_of(&self, session_id: i32) -> std::collections::HashSet<PartitionKey> {
        self.lock().get(&session_id).cloned().unwrap_or_default()
    }

    pub(super) fn note(&self, session_id: i32, keys: &[PartitionKey], fresh: bool) {
        let mut m = self.lock();
        if m.len() >= MAX_SESSIONS && !m.contains_key(&session_id) {
            m.clear();
        }
        let set = m.entry(session_id).or_default();
        if fresh {
            set.clear();
        }
        set.extend(keys.iter().cloned());
        if set.is_empty() {
            m.remove(&session_id);
        }
        self.tracked
            .store(m.len(), std::sync::atomic::Ordering::Relaxed);
    }

    pub(super) fn forget_session(&self, session_id: i32) {
        let mut m = self.lock();
        m.remove(&session_id);
        self.tracked
            .store(m.len(), std::sync::atomic::Ordering::Relaxed);
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
        // full request.
        mirror.sessions.note(id, &plan.out_of_session, true);
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
