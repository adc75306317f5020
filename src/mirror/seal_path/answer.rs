//! The answers: a Fetch answered whole by the proxy, and the controlled
//! partitions' entries spliced into a forwarded response.

use super::*;

pub(super) fn partition_response(
    c: &Controlled,
    a: &LocalPartition,
    read_committed: bool,
    log_start: i64,
) -> FetchPartitionResponse<'static> {
    let mut r = FetchPartitionResponse::new(c.partition);
    r.error_code = a.error_code;
    r.high_watermark = a.high_watermark;
    r.last_stable_offset = a.last_stable_offset;
    r.log_start_offset = log_start;
    r.aborted_transactions = read_committed.then(Vec::new);
    r.records = Some(Cow::Owned(a.records.clone()));
    r
}

/// Builds the local answer of a Fetch request whose partitions are all controlled.
pub fn answer_fetch(
    mirror: &Arc<MirrorContext>,
    h: &RequestHeader,
    plan: &mut FetchPlan,
) -> Result<Rewritten, RewriteError> {
    if plan.force_full_fetch {
        let body = build_fetch_response(h.api_version, 0, FETCH_SESSION_ID_NOT_FOUND, 0, &[])
            .map_err(|e| err(h.api_version, e.to_string()))?;
        return Ok(Rewritten::Ready(crate::filter::answer_frame(h, &body)?));
    }
    let answers = match decide_all(mirror, plan, h.api_version) {
        Ok(a) => a,
        Err(wait) => return Ok(wait),
    };
    // Nothing to return: hold the answer for MaxWaitMs, as a broker does, then
    // decide again (a seal may have become servable meanwhile).
    if !plan.waited && plan.max_wait_ms > 0 && answers.iter().all(|a| a.records.is_empty()) {
        plan.waited = true;
        let wait = std::time::Duration::from_millis(plan.max_wait_ms.min(MAX_LOCAL_WAIT_MS) as u64);
        return Ok(Rewritten::Blocked {
            frame: None,
            wait: Box::pin(async move {
                tokio::time::sleep(wait).await;
                Ok(())
            }),
        });
    }
    let mut topics: Vec<(FetchTopic<'_>, Vec<FetchPartitionResponse<'_>>)> = Vec::new();
    for (c, a) in plan.controlled.iter().zip(&answers) {
        let entry = partition_response(c, a, plan.read_committed, 0);
        match topics
            .iter_mut()
            .find(|(t, _)| *t == c.topic.as_fetch_topic())
        {
            Some((_, v)) => v.push(entry),
            None => topics.push((c.topic.as_fetch_topic(), vec![entry])),
        }
    }
    // Session id 0: the proxy keeps no session for answers it makes itself.
    let _ = plan.session_id;
    let body = build_fetch_response(h.api_version, 0, 0, 0, &topics)
        .map_err(|e| err(h.api_version, e.to_string()))?;
    Ok(Rewritten::Ready(crate::filter::answer_frame(h, &body)?))
}

/// Replaces (or adds) the controlled partitions in an upstream Fetch
/// response, after the usual PID rewriting of the others.
pub fn splice_controlled(
    mirror: &Arc<MirrorContext>,
    h: &RequestHeader,
    plan: &FetchPlan,
    frame: BytesMut,
) -> Result<Rewritten, RewriteError> {
    let hv = handlers::response_header_version(h.api_key, h.api_version)
        .ok_or_else(|| err(h.api_version, "unknown response header version".into()))?;
    let body_at = response_body_offset(&frame, hv)
        .ok_or_else(|| err(h.api_version, "response header truncated".into()))?;
    // A top-level error (a session error from the source) applies to the
    // whole request: the fetcher ignores every partition of it, so nothing
    // is decided or added; it starts over and fetches again.
    if h.api_version >= 7 {
        if let Some(code) = frame.get(body_at + 4..body_at + 6) {
            if code != [0, 0] {
                return Ok(Rewritten::Ready(frame));
            }
        }
    }
    let answers = match decide_all(mirror, plan, h.api_version) {
        Ok(a) => a,
        Err(Rewritten::Blocked { wait, .. }) => {
            return Ok(Rewritten::Blocked {
                frame: Some(frame),
                wait,
            })
        }
        Err(ready) => return Ok(ready),
    };
    let body = &frame[body_at..];
    // Which controlled partitions the upstream returned (the others are added).
    let mut seen = vec![false; plan.controlled.len()];
    // Whether the upstream answer carries records or a partition error.
    let mut carries = false;
    handlers::walk_fetch_response(h.api_version, body, &mut |p| {
        carries |= p.error_code != 0 || p.records.as_ref().is_some_and(|r| !r.is_empty());
        if let Some(i) = plan
            .controlled
            .iter()
            .position(|c| c.topic.as_fetch_topic() == p.topic && c.partition == p.partition_index)
        {
            seen[i] = true;
        }
    })
    .map_err(|e| err(h.api_version, e.to_string()))?;
    // Nothing to return before MaxWaitMs ran out: the upstream answered at
    // once because it was asked for nothing (the controlled partitions were
    // dropped from the request); hold the answer as a broker would, then
    // decide again. An error is answered at once, as a broker does.
    if let Some(until) = plan.hold_until {
        let empty = !carries && answers.iter().all(|a| a.records.is_empty());
        if empty && std::time::Instant::now() < until {
            return Ok(Rewritten::Blocked {
                frame: Some(frame),
                wait: Box::pin(async move {
                    tokio::time::sleep_until(until.into()).await;
                    Ok(())
                }),
            });
        }
    }
    let mut add: Vec<(FetchTopic<'_>, Vec<FetchPartitionResponse<'_>>)> = Vec::new();
    for (i, c) in plan.controlled.iter().enumerate() {
        if seen[i] {
            continue;
        }
        let entry = partition_response(c, &answers[i], plan.read_committed, 0);
        match add.iter_mut().find(|(t, _)| *t == c.topic.as_fetch_topic()) {
            Some((_, v)) => v.push(entry),
            None => add.push((c.topic.as_fetch_topic(), vec![entry])),
        }
    }
    let new_body =
        splice_fetch_response_dropping(
            h.api_version,
            body,
            &mut |p| {
                let stray = is_stray(mirror, Some(plan), &p.topic, p.partition_index);
                if stray {
                    mirror.seal_metrics.strays.inc();
                }
                stray
            },
            &mut |p| {
                if let Some(b) = plan.below_cut.iter().find(|b| {
                    b.topic.as_fetch_topic() == p.topic && b.partition == p.partition_index
                }) {
                    if below_cut_straddles(body, p, b.cut) {
                        note_straddle(mirror, b);
                    }
                    return Some(below_cut_response(body, p, b, plan.read_committed));
                }
                let i = plan.controlled.iter().position(|c| {
                    c.topic.as_fetch_topic() == p.topic && c.partition == p.partition_index
                })?;
                Some(partition_response(
                    &plan.controlled[i],
                    &answers[i],
                    plan.read_committed,
                    p.log_start_offset.max(0),
                ))
            },
            &add,
        )
        .map_err(|e| err(h.api_version, e.to_string()))?;
    note_session(mirror, h, plan, body);
    let out = crate::filter::with_body(&frame, body_at, &new_body);
    Ok(Rewritten::Ready(out))
}
