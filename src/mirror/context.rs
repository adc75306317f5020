//! A mirror's state lookups: partition handles (cached per topic and
//! partition), destination/source topic names, the source identity and
//! the producer-state limits.

use super::*;

impl MirrorContext {
    /// The producer-state handle of [`partition_key`](Self::partition_key)
    /// (cached per source topic and partition).
    /// Fails (the caller fails the response closed) when a new partition
    /// would exceed `producer_state.max_partitions`.
    pub fn partition_handle(
        &self,
        topic: &FetchTopic<'_>,
        partition: i32,
    ) -> Result<PartitionHandle, MirrorError> {
        let index = usize::try_from(partition)
            .ok()
            .filter(|&i| i < MAX_CACHED_PARTITION);
        if let Some(i) = index {
            let c = self.handles.read().unwrap_or_else(|p| p.into_inner());
            let slots = match topic {
                FetchTopic::Name(name) => c.by_name.get(*name),
                FetchTopic::Id(id) => c.by_id.get(id),
            };
            if let Some(h) = slots.and_then(|v| v.get(i)).and_then(Option::as_ref) {
                // A partition the registry dropped (its destination topic
                // was deleted, or it sat empty and idle) is looked up again.
                if !h.is_removed() {
                    return Ok(h.clone());
                }
            }
        }
        // An id is cached only once its name is known (ids are never
        // forgotten): before that its key is a placeholder that changes.
        let resolved = match topic {
            FetchTopic::Name(_) => true,
            FetchTopic::Id(id) => self
                .topics
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .by_id
                .contains_key(id),
        };
        let key = self.partition_key(topic, partition);
        let handle = match self.registry.get(&key) {
            Some(h) => h,
            None if self.registry.partition_count() >= self.registry.config().max_partitions => {
                return Err(MirrorError::PartitionLimit {
                    tracked: self.registry.partition_count(),
                    key,
                });
            }
            None => self.registry.partition(&key),
        };
        if let (Some(i), true) = (index, resolved) {
            let mut c = self.handles.write().unwrap_or_else(|p| p.into_inner());
            let slots = match topic {
                FetchTopic::Name(name) => c.by_name.entry(Box::from(*name)).or_default(),
                FetchTopic::Id(id) => c.by_id.entry(*id).or_default(),
            };
            if slots.len() <= i {
                slots.resize(i + 1, None);
            }
            slots[i] = Some(handle.clone());
        }
        Ok(handle)
    }

    /// Whether the source's Metadata named the source topic id `id`.
    pub(crate) fn names_source_id(&self, id: &[u8; 16]) -> bool {
        self.topics
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_id
            .contains_key(id)
    }

    /// The destination partition a Fetch response partition feeds: keyed by
    /// destination topic *name* (the source name, unless renamed) and
    /// partition, so mirrors from different sources into one destination
    /// partition share its state. The destination topic id is looked up on
    /// the state cluster when a record needs it.
    pub fn partition_key(&self, topic: &FetchTopic<'_>, partition: i32) -> PartitionKey {
        match topic {
            FetchTopic::Name(name) => {
                PartitionKey::new([0; 16], self.destination_topic(name), partition)
            }
            FetchTopic::Id(id) => {
                let t = self.topics.read().unwrap_or_else(|p| p.into_inner());
                let name = match t.by_id.get(id) {
                    Some(n) => self.destination_topic(n),
                    // Not in the source's Metadata yet: keep it apart by id.
                    None => Arc::from(format!("topic-id:{}", ps::ClusterId(*id))),
                };
                PartitionKey::new([0; 16], name, partition)
            }
        }
    }

    /// Destination topics fed by this mirror with their partition counts
    /// (from the source's last Metadata). A source's internal topics (names
    /// starting with `__`: `__consumer_offsets`, `__transaction_state`, ...)
    /// are never mirrored partitions: the destination has its own.
    pub fn destination_topics(&self) -> Vec<(String, i32)> {
        let t = self.topics.read().unwrap_or_else(|p| p.into_inner());
        t.partitions
            .iter()
            .filter(|(name, _)| !name.starts_with("__"))
            .map(|(name, n)| (format!("{}{}", self.topic_prefix, name), *n))
            .collect()
    }

    /// The destination partition key of a destination topic name.
    pub fn key_for(&self, destination_topic: &str, partition: i32) -> PartitionKey {
        PartitionKey::new([0; 16], destination_topic, partition)
    }

    /// The source topic of a destination topic name, when it is one of ours.
    pub(crate) fn source_topic(&self, destination_topic: &str) -> Option<String> {
        if destination_topic.starts_with("topic-id:") {
            return None;
        }
        destination_topic
            .strip_prefix(&self.topic_prefix)
            .map(str::to_string)
    }

    /// Makes replays and topic lookups reach the source the way its
    /// listener does (the same TLS configuration, reloaded with it).
    pub fn set_source_connector(&self, connector: crate::kafka_client::TransportConnector) {
        let _ = self.source_connector.set(connector);
    }

    /// How to reach the source (plain TCP unless set).
    pub(crate) fn source_connector(&self) -> crate::kafka_client::TransportConnector {
        self.source_connector
            .get()
            .cloned()
            .unwrap_or_default()
            .with_sasl(self.source_identity())
    }

    /// Where replays read the source: the known source nodes, then the
    /// bootstrap servers.
    pub(crate) fn replay_servers(&self) -> Vec<(String, u16)> {
        self.nodes
            .get()
            .map(|n| n.snapshot())
            .unwrap_or_default()
            .into_iter()
            .map(|(_, a)| (a.host, a.port))
            .chain(self.source_bootstrap.iter().cloned())
            .collect()
    }

    pub(crate) fn is_warm(&self, key: &PartitionKey) -> bool {
        self.warm
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(key)
    }

    /// Counts and logs a producer-state limit hit; returns the error.
    pub(super) fn state_limit(&self, error: MirrorError) -> MirrorError {
        self.metrics.state_limit.inc();
        tracing::error!(mirror = %self.name, "{error}");
        error
    }

    pub(crate) fn mark_warm(&self, key: &PartitionKey) {
        self.warm
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone());
    }

    pub(super) fn destination_topic(&self, source_topic: &str) -> Arc<str> {
        Arc::from(format!("{}{}", self.topic_prefix, source_topic))
    }

    /// A mirror from its configuration; the source id is set if configured.
    pub fn new(
        cfg: &MirrorConfig,
        registry: Arc<ProducerStateRegistry>,
        salts: Arc<dyn SaltStore>,
        lifecycle: Arc<crate::lifecycle::Lifecycle>,
        metrics: &Metrics,
    ) -> Result<Arc<Self>, MirrorError> {
        let ctx = Self {
            name: cfg.name.clone(),
            mode: cfg.pid_mode,
            layout: match cfg.layout {
                LayoutConfig::High => Layout::High,
                LayoutConfig::SignBit => Layout::SignBit,
            },
            source: OnceLock::new(),
            registry,
            salts,
            metrics: MirrorMetrics::new(metrics, &cfg.name, cfg.crc_verify_every),
            topics: Default::default(),
            handles: Default::default(),
            topic_prefix: cfg.destination_topic_prefix.clone(),
            warm: Default::default(),
            owned: Default::default(),
            gap_checked: Default::default(),
            nodes: OnceLock::new(),
            source_connector: OnceLock::new(),
            source_bootstrap: cfg
                .source_bootstrap
                .iter()
                .filter_map(|a| crate::config::split_host_port(a).ok())
                .collect(),
            lifecycle,
            seal_metrics: SealMetrics::new(metrics, &cfg.name),
            request_timeout: std::time::Duration::from_millis(cfg.upstream_request_timeout_ms),
            topology: Default::default(),
            persisted_topology: Default::default(),
            topology_live: Default::default(),
            sessions: Default::default(),
            lookups: Default::default(),
            source_identity: Default::default(),
            dest_hw: OnceLock::new(),
            closings_retention: cfg.closings_retention(),
            stream_hold: std::sync::atomic::AtomicBool::new(true),
        };
        if let Some(text) = &cfg.source_cluster_id {
            ctx.set_source(SourceIdentity::parse(text)?)?;
        }
        Ok(Arc::new(ctx))
    }

    /// Makes seals complete only once the destination's high watermark has
    /// passed their end (at start-up; see [`super::dest_hw`]).
    pub fn set_destination_hw(&self, gate: Arc<super::dest_hw::DestinationHw>) {
        let _ = self.dest_hw.set(gate);
    }

    /// The stop rule of this mirror's seals and, under the destination
    /// rule, its gate.
    pub(crate) fn destination_hw(&self) -> Option<&Arc<super::dest_hw::DestinationHw>> {
        self.dest_hw.get()
    }

    /// Sets mirrorguard's own SASL identity toward the source (at start-up,
    /// before any source connection).
    pub fn set_source_identity(&self, identity: crate::sasl::Identity) {
        let _ = self.source_identity.set(identity);
    }

    /// mirrorguard's own SASL identity toward the source.
    pub fn source_identity(&self) -> crate::sasl::Identity {
        self.source_identity.get().cloned().flatten()
    }

    /// The source identity, once known.
    pub fn source(&self) -> Option<&SourceIdentity> {
        self.source.get()
    }

    /// Learns the source identity from a Metadata refresh when none is set.
    pub(super) fn learn_source(
        &self,
        view: &crate::proxy::refresh::ClusterView,
    ) -> Result<(), MirrorError> {
        if self.source().is_none() {
            let text = view
                .cluster_id
                .as_deref()
                .ok_or_else(|| MirrorError::NoSourceId {
                    mirror: self.name.clone(),
                })?;
            let id = SourceIdentity::parse(text).map_err(|error| MirrorError::BadSourceId {
                mirror: self.name.clone(),
                text: text.to_string(),
                error,
            })?;
            self.set_source(id)?;
        }
        Ok(())
    }

    /// Sets the source identity (configured or learned). A different id than
    /// the one already set is refused: PIDs would change region mid-stream.
    pub fn set_source(&self, id: SourceIdentity) -> Result<(), MirrorError> {
        match self.source.get() {
            Some(cur) if cur.id != id.id => Err(MirrorError::SourceChanged {
                mirror: self.name.clone(),
                from: cur.text.clone(),
                to: id.text,
            }),
            Some(_) => Ok(()),
            None => {
                tracing::info!(mirror = %self.name, source_cluster_id = %id.text, fold = id.fold,
                    mode = ?self.mode, layout = self.layout.name(), "mirror source identified");
                let _ = self.source.set(id);
                Ok(())
            }
        }
    }

    /// The PID that leaves the proxy for `pid` with `salt`.
    pub(super) fn map(&self, source: &SourceIdentity, pid: i64, salt: i64) -> i64 {
        map_with_salt(pid, source.fold, salt, self.layout)
    }
}

#[cfg(test)]
mod handle_cache_tests {
    use super::*;
    use crate::proxy::refresh::{ClusterView, RefreshHook};

    fn ctx(prefix: &str) -> Arc<MirrorContext> {
        let cfg: MirrorConfig = toml::from_str(&format!(
            "name = \"m\"\nbootstrap = \"127.0.0.1:1\"\nadvertised_host = \"h\"\n\
             node_port_base = 2\nsource_bootstrap = [\"127.0.0.1:3\"]\n\
             source_cluster_id = \"MkU3OEVBNTcwNTJENDM2Qg\"\ndestination_topic_prefix = \"{prefix}\"\n"
        ))
        .unwrap();
        let metrics = Metrics::new();
        MirrorContext::new(
            &cfg,
            Arc::new(ProducerStateRegistry::default()),
            Arc::new(crate::mirror::test_store::NoopStore::new()),
            crate::lifecycle::Lifecycle::new(metrics.clone()),
            &metrics,
        )
        .unwrap()
    }

    fn producers(h: &PartitionHandle) -> usize {
        h.with(|s| s.producer_count())
    }

    fn observe_one(h: &PartitionHandle, pid: i64) {
        let origin = Origin {
            source_cluster: ps::ClusterId([1; 16]),
            original_pid: pid,
        };
        let mut sink = Vec::new();
        h.observe(
            &origin,
            &BatchObservation::data(pid, 0, pid * 10, 0, 1, false),
            0,
            &mut sink,
        );
    }

    #[test]
    fn cached_handle_is_the_registry_handle_of_the_key() {
        let m = ctx("dst.");
        let a = m.partition_handle(&FetchTopic::Name("t"), 3).unwrap();
        assert_eq!(a.key(), &m.partition_key(&FetchTopic::Name("t"), 3));
        assert_eq!(&*a.key().topic, "dst.t");
        let b = m.partition_handle(&FetchTopic::Name("t"), 3).unwrap();
        observe_one(&a, 5);
        assert_eq!(producers(&b), 1, "same state through the cache");
        let r = m.registry.get(a.key()).unwrap();
        assert_eq!(producers(&r), 1, "same state as the registry's");
        // other partitions and topics are distinct
        assert_eq!(
            producers(&m.partition_handle(&FetchTopic::Name("t"), 4).unwrap()),
            0
        );
        assert_eq!(
            producers(&m.partition_handle(&FetchTopic::Name("u"), 3).unwrap()),
            0
        );
        // out-of-range indexes bypass the cache but still resolve
        let big = m
            .partition_handle(&FetchTopic::Name("t"), i32::MAX)
            .unwrap();
        assert_eq!(big.key().partition, i32::MAX);
        let neg = m.partition_handle(&FetchTopic::Name("t"), -1).unwrap();
        assert_eq!(neg.key().partition, -1);
    }

    /// A topic deleted on the source is forgotten at the next full refresh:
    /// `stop --all` covers the source's topics, and a deleted one (whose
    /// destination topic is usually gone too) made every stop fail.
    #[test]
    fn a_topic_deleted_on_the_source_leaves_the_mirrors_topics() {
        let m = ctx("b.");
        let view = |topics: &[&str]| ClusterView {
            cluster_id: None,
            topics: topics.iter().map(|t| (t.to_string(), [0; 16], 2)).collect(),
            brokers: vec![crate::mirror::offline::Broker {
                node_id: 1,
                host: "h".into(),
                port: 1,
            }],
            ..Default::default()
        };
        m.on_refresh(&view(&["kept", "deleted"])).unwrap();
        let mut topics = m.destination_topics();
        topics.sort();
        assert_eq!(topics, vec![("b.deleted".into(), 2), ("b.kept".into(), 2)]);
        m.on_refresh(&view(&["kept"])).unwrap();
        assert_eq!(m.destination_topics(), vec![("b.kept".into(), 2)]);
        // A refresh that names no brokers is not a full view of the source
        // (below Metadata v12): it forgets nothing.
        m.on_refresh(&ClusterView::default()).unwrap();
        assert_eq!(m.destination_topics(), vec![("b.kept".into(), 2)]);
    }

    #[test]
    fn topic_id_is_cached_only_once_its_name_is_known() {
        let m = ctx("");
        let id = [9u8; 16];
        let early = m.partition_handle(&FetchTopic::Id(id), 0).unwrap();
        assert!(early.key().topic.starts_with("topic-id:"));
        m.on_refresh(&ClusterView {
            cluster_id: None,
            topics: vec![("named".into(), id, 1)],
            ..Default::default()
        })
        .unwrap();
        let late = m.partition_handle(&FetchTopic::Id(id), 0).unwrap();
        assert_eq!(&*late.key().topic, "named");
        let by_name = m.partition_handle(&FetchTopic::Name("named"), 0).unwrap();
        observe_one(&late, 7);
        assert_eq!(producers(&by_name), 1);
        assert_eq!(
            producers(&m.partition_handle(&FetchTopic::Id(id), 0).unwrap()),
            1
        );
    }
}
