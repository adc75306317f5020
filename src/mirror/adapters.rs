//! The mirror's I/O around the pure core: what the planner's [`Pending`]
//! turns into (claims and salts persisted through the [`SaltStore`],
//! source ranges replayed), the blocked-response glue of the filter chain,
//! and what the source's Metadata refreshes teach (identity, topic names,
//! the persisted source topology).

use super::*;

impl crate::proxy::refresh::RefreshHook for MirrorContext {
    fn on_refresh(
        &self,
        view: &crate::proxy::refresh::ClusterView,
    ) -> Result<(), crate::proxy::refresh::RefreshError> {
        self.learn_source(view)
            .map_err(crate::proxy::refresh::RefreshError::new)?;
        {
            let mut t = self.topics.write().unwrap_or_else(|p| p.into_inner());
            if !view.brokers.is_empty() {
                // A full view of the source (Metadata v12 for every topic):
                // a topic it no longer names was deleted, and `stop --all`
                // must not try to seal it.
                let named: std::collections::HashSet<&str> =
                    view.topics.iter().map(|(n, _, _)| n.as_str()).collect();
                t.partitions.retain(|name, _| named.contains(name.as_str()));
            }
            for (name, id, partitions) in &view.topics {
                if *id != [0; 16] {
                    t.by_id.insert(*id, Arc::from(name.as_str()));
                }
                t.partitions.insert(name.clone(), *partitions);
            }
        }
        self.note_topology(view);
        Ok(())
    }
}

impl MirrorContext {
    /// Keeps the topology of a refresh and persists it when it changed (a
    /// restart with the source down serves and seals from it).
    pub(super) fn note_topology(&self, view: &crate::proxy::refresh::ClusterView) {
        let (Some(source), false) = (self.source(), view.brokers.is_empty()) else {
            return;
        };
        let mut topology = offline::Topology {
            source_cluster_id: source.text.clone(),
            brokers: view.brokers.clone(),
            topics: view.topic_details.clone(),
        };
        topology.normalise();
        self.topology_live
            .store(true, std::sync::atomic::Ordering::SeqCst);
        *self.topology.write().unwrap_or_else(|p| p.into_inner()) = Some(topology.clone());
        if !self.salts.durable() || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        {
            let mut last = self
                .persisted_topology
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if last.as_ref() == Some(&topology) {
                return;
            }
            // Claimed before the write: a failed write clears it (retried
            // at the next refresh).
            *last = Some(topology.clone());
        }
        let fut = self.salts.persist_topology(&self.name, topology);
        let name = self.name.clone();
        let me = self.persisted_topology.clone();
        tokio::spawn(async move {
            match fut.await {
                Ok(()) => tracing::debug!(mirror = %name, "source topology persisted"),
                Err(e) => {
                    tracing::warn!(mirror = %name, error = %e, "source topology not persisted; will retry");
                    *me.lock().unwrap_or_else(|p| p.into_inner()) = None;
                }
            }
        });
    }

    /// Applies a topology read back from `__mirror_state` (start-up or
    /// another instance): topics, ids, the source id when not known yet.
    /// A live refresh overrides it.
    pub fn restore_topology(&self, topology: offline::Topology) {
        if self.source().is_none() {
            match SourceIdentity::parse(&topology.source_cluster_id) {
                Ok(id) => {
                    let _ = self.set_source(id);
                }
                Err(e) => tracing::warn!(mirror = %self.name, error = %e,
                    "persisted source topology has an unparseable cluster id"),
            }
        } else if self.source().map(|s| s.text.as_str()) != Some(&topology.source_cluster_id) {
            tracing::warn!(mirror = %self.name, persisted = %topology.source_cluster_id,
                "persisted source topology is of another source cluster; ignored");
            return;
        }
        {
            let mut t = self.topics.write().unwrap_or_else(|p| p.into_inner());
            for topic in &topology.topics {
                if topic.id != [0; 16] {
                    t.by_id
                        .entry(topic.id)
                        .or_insert_with(|| Arc::from(topic.name.as_str()));
                }
                if !self.topology_live.load(std::sync::atomic::Ordering::SeqCst) {
                    t.partitions
                        .insert(topic.name.clone(), topic.partitions.len() as i32);
                }
            }
        }
        tracing::info!(mirror = %self.name, topics = topology.topics.len(),
            brokers = topology.brokers.len(), "source topology restored from __mirror_state");
        // The latest record wins, unless the source itself was read since.
        if !self.topology_live.load(std::sync::atomic::Ordering::SeqCst) {
            *self.topology.write().unwrap_or_else(|p| p.into_inner()) = Some(topology.clone());
        }
        *self
            .persisted_topology
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(topology);
    }

    /// The last known source topology.
    pub fn topology(&self) -> Option<offline::Topology> {
        self.topology
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Source brokers to advertise offline: the listener's live view, else
    /// the persisted topology's.
    pub(crate) fn offline_brokers(&self) -> Vec<offline::Broker> {
        let live: Vec<offline::Broker> = self
            .nodes
            .get()
            .map(|n| n.snapshot())
            .unwrap_or_default()
            .into_iter()
            .map(|(node_id, a)| offline::Broker {
                node_id,
                host: a.host,
                port: i32::from(a.port),
            })
            .collect();
        if !live.is_empty() {
            return live;
        }
        self.topology().map(|t| t.brokers).unwrap_or_default()
    }
}

impl MirrorContext {
    /// Gives the mirror its listener's source nodes (advertised in offline
    /// answers); the first listener built for the mirror sets them.
    pub fn set_nodes(&self, nodes: Arc<NodeRegistry>) {
        let _ = self.nodes.set(nodes);
    }

    /// Maps (and, for the fetcher, observes) the PIDs of a Fetch response
    /// frame in place, leaving the partitions `skip` names alone. Returns
    /// what the response must wait for first, if anything (then nothing has
    /// been changed and the frame is rewritten again once it completes).
    pub(crate) fn rewrite_fetch_frame(
        self: &Arc<Self>,
        h: &RequestHeader,
        mut frame: BytesMut,
        skip: &dyn Fn(&FetchTopic<'_>, i32) -> bool,
        fetcher: bool,
    ) -> Result<Rewritten, RewriteError> {
        let err = |message: String| RewriteError {
            api: "Fetch",
            version: h.api_version,
            message,
        };
        let header_version = handlers::response_header_version(h.api_key, h.api_version)
            .ok_or_else(|| err("unknown response header version".into()))?;
        let body_at = response_body_offset(&frame, header_version)
            .ok_or_else(|| err("response header truncated".into()))?;
        let body = &mut frame[body_at..];
        let mut held = Vec::new();
        let pending =
            rewrite_fetch_body_holding(self, h.api_version, body, skip, fetcher, Some(&mut held))
                .map_err(|e| err(e.to_string()))?;
        let Some(pending) = pending else {
            if held.is_empty() {
                // Every partition could have been streamed.
                self.stream_hold
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                return Ok(Rewritten::Ready(frame));
            }
            // Everything else is rewritten: answer the held partitions with
            // no records and look their topic ids up.
            return topic_lookup::hold_partitions(self, h, body_at, frame, &held);
        };
        let wait = self.pending_wait(pending, h.api_version);
        Ok(Rewritten::Blocked {
            frame: Some(frame),
            wait,
        })
    }
}

impl MirrorContext {
    /// The work `pending` names, as one future (the store-and-forward path
    /// blocks the response on it; the streamed path its current batch).
    pub(crate) fn pending_wait(
        self: &Arc<Self>,
        pending: Pending,
        version: i16,
    ) -> BoxFuture<'static, Result<(), RewriteError>> {
        let salts = self.salts.clone();
        let mirror = self.clone();
        let servers = self.replay_servers();
        let max_frame = crate::config::DEFAULT_MAX_FRAME_BYTES as usize;
        Box::pin(async move {
            let what = match &pending {
                Pending::Salts(_) => "collision salt not persisted",
                Pending::TopicIds => "destination topic ids not read",
                Pending::Replay(_) => "source range not replayed",
                Pending::Claims(_) => "producer claims not persisted",
                Pending::TakeOver(_) => "partition not taken over from another instance",
                Pending::Recheck(_) => "__mirror_state not read for a partition's gap",
            };
            let done = match pending {
                Pending::Salts(p) => salts.persist(p).await.map_err(MirrorError::from),
                Pending::TopicIds => salts.refresh_topic_ids().await.map_err(MirrorError::from),
                Pending::Replay(jobs) => run_replays(mirror, servers, jobs, max_frame).await,
                Pending::Claims(claims) => persist_claims(salts, claims).await,
                Pending::TakeOver(jobs) => handover::take_over(mirror, jobs).await,
                Pending::Recheck(jobs) => handover::recheck(mirror, jobs).await,
            };
            done.map_err(|message: MirrorError| RewriteError {
                api: "Fetch",
                version,
                message: format!("{what}: {message}"),
            })
        })
    }
}

/// Makes claims durable (one type-6 record per new producer, all of the
/// response in as few Produce requests as fit), then records them in the
/// shadow producer state. The cost is one ~75-byte record per producer,
/// whatever the partition already holds.
pub(super) async fn persist_claims(
    salts: Arc<dyn SaltStore>,
    claims: Vec<(PartitionHandle, Vec<(i64, Origin)>)>,
) -> Result<(), MirrorError> {
    let now = now_ms();
    let records = claims
        .iter()
        .map(|(handle, new)| (handle.key().clone(), new.clone()))
        .collect();
    salts.persist_claims(records).await?;
    for (handle, new) in claims {
        handle.with(|s| {
            for (mapped, origin) in &new {
                s.claim(*mapped, *origin, now);
            }
        });
    }
    Ok(())
}

/// Runs the replays a response waits for, then marks the partitions warm.
pub(crate) async fn run_replays(
    mirror: Arc<MirrorContext>,
    servers: Vec<(String, u16)>,
    jobs: Vec<replay::ReplayJob>,
    max_frame: usize,
) -> Result<(), MirrorError> {
    let source = mirror
        .source()
        .cloned()
        .ok_or(MirrorError::SourceNotIdentified)?;
    for job in jobs {
        tracing::info!(mirror = %mirror.name, partition = %job.key, from = job.from, upto = job.upto,
            "replaying the source range the producer state has not seen (first fetch here since start-up or since a take-over, a gap, or a source truncation)");
        let key = job.key.clone();
        replay::replay(
            mirror.clone(),
            source.clone(),
            servers.clone(),
            job,
            max_frame,
        )
        .await
        .map_err(MirrorError::Replay)?;
        mirror.mark_warm(&key);
    }
    Ok(())
}
