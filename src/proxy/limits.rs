//! What one client may take of the process: connections (in total and per
//! client address) and request bytes held in memory (a process-wide budget).
//!
//! Every listener admits a connection through [`ConnectionLimits::admit`]
//! before anything else (TLS included); a refused one is closed at once,
//! logged at most once a second per listener and reason, and counted in
//! `mirrorguard_connections_refused_total{listener,reason}`.
//!
//! Requests held whole (the ones a filter reads or answers: ApiVersions for
//! the clamp, a guard's Produce headers, a mirror's Fetch and Metadata; the
//! head read to route a large one; a frame read before authentication)
//! reserve their announced size from the [`MemoryBudget`] before their body
//! is read. Frames of at most [`SMALL_REQUEST_BYTES`] always pass (counted,
//! never refused), so a flood of large announced frames cannot lock a
//! fetcher's small requests out; the rest are refused when the budget cannot
//! cover them, and the connection closed (`mirrorguard_budget_refused_total`).
//! The reservation lives as long as the bytes: [`BudgetPermit`] releases it
//! on drop.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

pub use crate::config::SMALL_REQUEST_BYTES;
use crate::metrics::Metrics;

/// Connection caps shared by every listener of the process.
pub struct ConnectionLimits {
    max_total: usize,
    max_per_address: usize,
    open: AtomicUsize,
    per_address: Mutex<HashMap<IpAddr, usize>>,
}

/// Why a connection was refused (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `[limits] max_connections`.
    Total,
    /// `[limits] max_connections_per_address`.
    PerAddress,
}

impl Refusal {
    /// The metric label and the setting's name.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Total => "max_connections",
            Refusal::PerAddress => "max_connections_per_address",
        }
    }
}

/// An admitted connection; its slot is given back on drop.
pub struct Admitted {
    limits: Arc<ConnectionLimits>,
    ip: IpAddr,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.limits.open.fetch_sub(1, Ordering::SeqCst);
        let mut m = self
            .limits
            .per_address
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

impl ConnectionLimits {
    /// Caps of `max_total` connections, `max_per_address` from one address.
    pub fn new(max_total: usize, max_per_address: usize) -> Arc<Self> {
        Arc::new(Self {
            max_total,
            max_per_address,
            open: AtomicUsize::new(0),
            per_address: Mutex::new(HashMap::new()),
        })
    }

    /// No caps (tests).
    pub fn unlimited() -> Arc<Self> {
        Self::new(usize::MAX, usize::MAX)
    }

    /// Takes a slot for a connection from `ip`, or says which cap is full.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Admitted, Refusal> {
        let mut m = self.per_address.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.get(&ip).copied().unwrap_or(0);
        if n >= self.max_per_address {
            return Err(Refusal::PerAddress);
        }
        if self.open.fetch_add(1, Ordering::SeqCst) >= self.max_total {
            self.open.fetch_sub(1, Ordering::SeqCst);
            return Err(Refusal::Total);
        }
        m.insert(ip, n + 1);
        drop(m);
        Ok(Admitted {
            limits: self.clone(),
            ip,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

/// The process-wide budget of request bytes held in memory.
pub struct MemoryBudget {
    limit: usize,
    used: AtomicUsize,
    metrics: Option<Arc<Metrics>>,
}

/// Bytes reserved from a [`MemoryBudget`]; released on drop.
pub struct BudgetPermit {
    budget: Arc<MemoryBudget>,
    bytes: usize,
}

impl std::fmt::Debug for BudgetPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BudgetPermit({})", self.bytes)
    }
}

impl Drop for BudgetPermit {
    fn drop(&mut self) {
        let now = self.budget.used.fetch_sub(self.bytes, Ordering::SeqCst) - self.bytes;
        self.budget.export(now);
    }
}

impl MemoryBudget {
    /// A budget of `limit` bytes, exported as `mirrorguard_buffered_request_bytes`.
    pub fn new(limit: usize, metrics: Option<Arc<Metrics>>) -> Arc<Self> {
        Arc::new(Self {
            limit,
            used: AtomicUsize::new(0),
            metrics,
        })
    }

    /// No limit (tests).
    pub fn unlimited() -> Arc<Self> {
        Self::new(usize::MAX / 4, None)
    }

    fn export(&self, used: usize) {
        if let Some(m) = &self.metrics {
            m.buffered_request_bytes.set(used as i64);
        }
    }

    /// Reserves `bytes`: always for a small frame
    /// ([`SMALL_REQUEST_BYTES`]), otherwise only within the limit.
    pub fn acquire(self: &Arc<Self>, bytes: usize) -> Option<BudgetPermit> {
        if bytes <= SMALL_REQUEST_BYTES {
            let now = self.used.fetch_add(bytes, Ordering::SeqCst) + bytes;
            self.export(now);
            return Some(self.permit(bytes));
        }
        let mut cur = self.used.load(Ordering::SeqCst);
        loop {
            let next = cur.checked_add(bytes).filter(|n| *n <= self.limit)?;
            match self
                .used
                .compare_exchange(cur, next, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    self.export(next);
                    return Some(self.permit(bytes));
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Whether `bytes` could be reserved now (nothing is reserved).
    pub fn would_admit(&self, bytes: usize) -> bool {
        bytes <= SMALL_REQUEST_BYTES
            || self.used.load(Ordering::SeqCst).saturating_add(bytes) <= self.limit
    }

    fn permit(self: &Arc<Self>, bytes: usize) -> BudgetPermit {
        BudgetPermit {
            budget: self.clone(),
            bytes,
        }
    }

    /// Bytes reserved now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::SeqCst)
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }
}

/// Lets one log line through per second (per instance), counting the ones
/// it held back: a flood must not turn into a flood of log lines.
#[derive(Default)]
pub struct LogLimiter {
    last_second: AtomicU64,
    suppressed: AtomicU64,
}

impl LogLimiter {
    /// A limiter that lets its first line through.
    pub const fn new() -> Self {
        Self {
            last_second: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(lines held back since the last one)` when a line may be logged now.
    pub fn allow(&self) -> Option<u64> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let last = self.last_second.load(Ordering::Relaxed);
        if last != now
            && self
                .last_second
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_caps_count_per_address_and_in_total() {
        let l = ConnectionLimits::new(3, 2);
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let a1 = l.admit(a).unwrap();
        let _a2 = l.admit(a).unwrap();
        assert_eq!(l.admit(a).err(), Some(Refusal::PerAddress));
        let _b1 = l.admit(b).unwrap();
        assert_eq!(l.admit(b).err(), Some(Refusal::Total));
        drop(a1);
        assert_eq!(l.open(), 2);
        let _b2 = l.admit(b).unwrap();
        assert_eq!(l.admit(b).err(), Some(Refusal::PerAddress));
    }

    #[test]
    fn budget_refuses_large_frames_past_the_limit_but_never_small_ones() {
        let b = MemoryBudget::new(100_000, None);
        let big = b.acquire(80_000).unwrap();
        assert!(b.acquire(30_000).is_none());
        assert!(!b.would_admit(30_000));
        let small: Vec<_> = (0..10)
            .map(|_| b.acquire(SMALL_REQUEST_BYTES).unwrap())
            .collect();
        assert_eq!(b.used(), 80_000 + 10 * SMALL_REQUEST_BYTES);
        drop(big);
        drop(small);
        assert_eq!(b.used(), 0);
        assert!(b.acquire(100_000).is_some());
        assert!(b.acquire(100_001).is_none());
    }

    #[test]
    fn log_limiter_lets_one_line_a_second() {
        let l = LogLimiter::default();
        assert_eq!(l.allow(), Some(0));
        assert_eq!(l.allow(), None);
        assert_eq!(l.allow(), None);
    }
}
