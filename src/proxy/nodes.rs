//! Port-per-node broker address registry.
//!
//! Every upstream broker a client can learn about is served on its own proxy
//! port (`node_port_base + node_id`) and advertised as
//! `advertised_host:that port`. The registry learns upstream addresses from
//! every response that carries them (and from the proxy's own periodic
//! Metadata refresh), binds the node's port the first time the node is seen,
//! and answers "where is upstream node N now" for new connections, so brokers
//! that move are followed without restarting anything.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use crate::metrics::Metrics;

/// Upstream address of one broker node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamAddr {
    /// Host as the upstream advertises it.
    pub host: String,
    /// Port as the upstream advertises it.
    pub port: u16,
}

#[derive(Debug)]
struct NodeEntry {
    upstream: UpstreamAddr,
    /// Whether the node's proxy port is bound and accepting.
    bound: bool,
}

/// Binds and serves a node's port; implemented by the listener.
pub trait NodeBinder: Send + Sync {
    /// Binds `port` for upstream node `node_id` and starts accepting; returns
    /// false (after logging why) when the port cannot be bound.
    fn bind_node(&self, node_id: i32, port: u16) -> bool;
}

/// The registry of one listener.
pub struct NodeRegistry {
    listener: String,
    advertised_host: String,
    node_port_base: u16,
    nodes: Mutex<HashMap<i32, NodeEntry>>,
    binder: Mutex<Option<Weak<dyn NodeBinder>>>,
    metrics: Arc<Metrics>,
}

impl NodeRegistry {
    /// A registry for one listener.
    pub fn new(
        listener: &str,
        advertised_host: &str,
        node_port_base: u16,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            listener: listener.to_string(),
            advertised_host: advertised_host.to_string(),
            node_port_base,
            nodes: Mutex::new(HashMap::new()),
            binder: Mutex::new(None),
            metrics,
        }
    }

    /// Sets who binds node ports (the listener, once it exists).
    pub fn set_binder(&self, binder: Weak<dyn NodeBinder>) {
        *lock(&self.binder) = Some(binder);
    }

    /// The proxy port for a node, if it fits in 16 bits.
    pub fn node_port(&self, node_id: i32) -> Option<u16> {
        let port = i64::from(self.node_port_base) + i64::from(node_id);
        u16::try_from(port).ok().filter(|p| *p != 0)
    }

    /// Records that upstream node `node_id` lives at `host:port`, binds its
    /// proxy port if needed, and returns the address to hand to clients.
    /// Never returns the upstream address.
    pub fn advertise(&self, node_id: i32, host: &str, port: i32) -> (String, i32) {
        let Some(proxy_port) = self.node_port(node_id) else {
            tracing::error!(
                listener = %self.listener, node_id, base = self.node_port_base,
                "upstream node id does not fit a proxy port (node_port_base + node_id > 65535); \
                 advertising port 0 so clients fail instead of bypassing the proxy"
            );
            Metrics::count(
                &self.metrics.rewrite_errors,
                &self.listener,
                "node_port_out_of_range",
            );
            return (self.advertised_host.clone(), 0);
        };
        let upstream = UpstreamAddr {
            host: host.to_string(),
            port: u16::try_from(port).unwrap_or(0),
        };
        let need_bind = {
            let mut nodes = lock(&self.nodes);
            let entry = nodes.entry(node_id).or_insert_with(|| NodeEntry {
                upstream: upstream.clone(),
                bound: false,
            });
            if entry.upstream != upstream {
                tracing::info!(
                    listener = %self.listener, node_id,
                    old = %format!("{}:{}", entry.upstream.host, entry.upstream.port),
                    new = %format!("{}:{}", upstream.host, upstream.port),
                    "upstream node moved"
                );
                entry.upstream = upstream;
            }
            let need = !entry.bound;
            entry.bound = true; // claim the bind so concurrent callers do not race it
            need
        };
        if need_bind {
            let binder = lock(&self.binder).as_ref().and_then(Weak::upgrade);
            let ok = binder
                .map(|b| b.bind_node(node_id, proxy_port))
                .unwrap_or(false);
            if !ok {
                if let Some(e) = lock(&self.nodes).get_mut(&node_id) {
                    e.bound = false; // retried on the next sighting
                }
            }
            self.metrics
                .upstream_nodes
                .get_or_create(&crate::metrics::ListenerLabels {
                    listener: self.listener.clone(),
                })
                .set(lock(&self.nodes).values().filter(|e| e.bound).count() as i64);
        }
        (self.advertised_host.clone(), i32::from(proxy_port))
    }

    /// Where upstream node `node_id` is now.
    pub fn upstream_of(&self, node_id: i32) -> Option<UpstreamAddr> {
        lock(&self.nodes).get(&node_id).map(|e| e.upstream.clone())
    }

    /// Known node ids with their upstream addresses.
    pub fn snapshot(&self) -> Vec<(i32, UpstreamAddr)> {
        let mut v: Vec<_> = lock(&self.nodes)
            .iter()
            .map(|(id, e)| (*id, e.upstream.clone()))
            .collect();
        v.sort_by_key(|(id, _)| *id);
        v
    }
}

/// Locks a mutex, recovering from poisoning (the data is plain maps that stay
/// consistent at every await-free step).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct CountingBinder(AtomicUsize);
    impl NodeBinder for CountingBinder {
        fn bind_node(&self, _node_id: i32, _port: u16) -> bool {
            self.0.fetch_add(1, Ordering::SeqCst);
            true
        }
    }

    #[test]
    fn advertises_proxy_port_and_binds_once() {
        let r = NodeRegistry::new("main", "proxy.local", 19100, Metrics::new());
        let binder = Arc::new(CountingBinder(AtomicUsize::new(0)));
        let dyn_binder: Arc<dyn NodeBinder> = binder.clone();
        r.set_binder(Arc::downgrade(&dyn_binder));
        assert_eq!(
            r.advertise(111, "broker-a", 9092),
            ("proxy.local".into(), 19211)
        );
        assert_eq!(
            r.advertise(111, "broker-b", 9093),
            ("proxy.local".into(), 19211)
        );
        assert_eq!(
            r.upstream_of(111),
            Some(UpstreamAddr {
                host: "broker-b".into(),
                port: 9093
            })
        );
        assert_eq!(binder.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn out_of_range_node_never_leaks_upstream() {
        let r = NodeRegistry::new("main", "proxy.local", 65000, Metrics::new());
        let (host, port) = r.advertise(1000, "broker-a", 9092);
        assert_eq!((host.as_str(), port), ("proxy.local", 0));
        assert_eq!(r.upstream_of(1000), None);
    }
}
