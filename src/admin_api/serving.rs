//! Which instance serves a partition, for `GET /v1/partitions`: with one
//! mirrorguard per destination broker, any instance shows the latest
//! serving record (type 9) of every partition of its mirrors.

use super::*;

/// Fills the serving fields of one partition's view.
pub(super) fn fill(s: &ApiState, v: &mut PartitionView) {
    let Some(m) = s.mirrors.get(&v.mirror) else {
        return;
    };
    let key = m.key_for(&v.topic, v.partition);
    if let Some(by) = m.served_by(&key) {
        v.served_here = m.instance_id().as_deref() == Some(by.instance_id.as_str());
        v.served_by = Some(by.instance_id);
        v.served_from_offset = Some(by.from_offset);
        v.snapshot_offset = by.snapshot_offset;
    }
    v.state_offset = s
        .registry
        .get(&key)
        .map(|h| h.with(|p| p.next_offset()))
        .filter(|o| *o > 0);
}
