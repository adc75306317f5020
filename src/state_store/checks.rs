//! Start-up checks of the state cluster (`[state]`).
//!
//! `__mirror_state` holds every durable decision (salts, claims, seals), and
//! the disaster seal (SPEC 3.1) is made with the source down: a state
//! cluster that is the source cluster itself would be down with it. So a
//! `[state]` whose cluster id is a mirror's source cluster id is refused,
//! and a state topic that would lose acknowledged records to one broker
//! failure (replication factor below [`MIN_REPLICATION_FACTOR`] or
//! `min.insync.replicas` below [`MIN_INSYNC_REPLICAS`]) is reported.
//!
//! A state cluster that is a source cluster stops start-up unless
//! `[state] allow_source_cluster = true` (test beds with one cluster only);
//! a weakly replicated state topic stops it unless `[state] production =
//! false` (single-broker test beds). Either way the problem is a WARN line.

use std::time::Duration;

use crate::config::Config;
use crate::pid::ClusterId;

use super::StateClusterReport;

/// Replication factor below which the state topic is reported.
pub const MIN_REPLICATION_FACTOR: usize = 3;
/// `min.insync.replicas` below which the state topic is reported.
pub const MIN_INSYNC_REPLICAS: i32 = 2;
/// How long a source may take to tell its cluster id at start-up (a source
/// that is down must not hold a restart up; the check is then skipped).
pub const SOURCE_ID_TIMEOUT: Duration = Duration::from_secs(2);

/// Why the state topic may lose acknowledged records (empty when it cannot).
pub fn durability_problems(report: &StateClusterReport, topic: &str) -> Vec<String> {
    let mut out = Vec::new();
    if report.replication_factor < MIN_REPLICATION_FACTOR {
        out.push(format!(
            "state topic {topic:?} has replication factor {} (below {MIN_REPLICATION_FACTOR}; the \
             state cluster lists {} broker(s)): one broker failure can lose the decisions it holds",
            report.replication_factor, report.brokers
        ));
    }
    match report.min_insync_replicas {
        Some(n) if n < MIN_INSYNC_REPLICAS => out.push(format!(
            "state topic {topic:?} has min.insync.replicas={n} (below {MIN_INSYNC_REPLICAS}): an \
             acks=all write can be acknowledged by a single replica"
        )),
        Some(_) => {}
        None => out.push(format!(
            "state topic {topic:?}: min.insync.replicas could not be read (DescribeConfigs)"
        )),
    }
    out
}

/// Whether two cluster ids name one cluster (Kafka base64 or UUID text).
pub fn same_cluster(a: &str, b: &str) -> bool {
    match (ClusterId::parse(a), ClusterId::parse(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a.trim() == b.trim(),
    }
}

/// The refusal of a state cluster that is `mirror`'s source.
pub fn same_cluster_message(
    config: &Config,
    mirror: &str,
    state_id: &str,
    source_id: &str,
) -> String {
    let state = config
        .state
        .as_ref()
        .map(|s| s.bootstrap.join(","))
        .unwrap_or_default();
    format!(
        "[state] ({state}, cluster id {state_id}) is the source cluster of mirror {mirror:?} \
         (source cluster id {source_id}): the disaster seal needs __mirror_state while the source \
         is down; put [state] on the destination cluster"
    )
}

/// Runs the checks on the state cluster `report` (see the module
/// documentation). Errors when one fails in production mode.
pub async fn check(config: &Config, report: &StateClusterReport) -> anyhow::Result<()> {
    let Some(st) = &config.state else {
        return Ok(());
    };
    let mut errors = Vec::new();
    for problem in durability_problems(report, &st.topic) {
        errors.push(problem);
    }
    match &report.cluster_id {
        None => tracing::warn!(
            "state cluster sent no cluster id: not checked against the mirrors' sources"
        ),
        Some(state_id) => {
            for m in &config.mirrors {
                let source_id = match &m.source_cluster_id {
                    Some(id) => Some(id.clone()),
                    None => {
                        // An unreadable secret is reported when the mirror starts.
                        let identity = crate::sasl::ClientCredentials::resolve_opt(
                            m.source_sasl.as_ref(),
                            "source_sasl",
                        )
                        .unwrap_or_default();
                        source_cluster_id(&m.source_bootstrap, m.source_tls.as_ref(), identity)
                            .await
                    }
                };
                match source_id {
                    Some(source_id) if same_cluster(state_id, &source_id) => {
                        let message = same_cluster_message(config, &m.name, state_id, &source_id);
                        if !st.allow_source_cluster {
                            anyhow::bail!(
                                "state cluster refused: {message} (a test bed with one cluster \
                                 only may set [state] allow_source_cluster = true)"
                            );
                        }
                        tracing::warn!(
                            "state cluster (allow_source_cluster = true, not refused): {message}"
                        );
                    }
                    Some(_) => {}
                    None => tracing::warn!(mirror = %m.name,
                        "source cluster id not known at start-up (source unreachable, none \
                         configured): [state] not checked against it"),
                }
            }
        }
    }
    if errors.is_empty() {
        tracing::info!(topic = %st.topic, replication_factor = report.replication_factor,
            min_insync_replicas = ?report.min_insync_replicas, cluster_id = ?report.cluster_id,
            "state cluster checked");
        return Ok(());
    }
    if st.production {
        anyhow::bail!(
            "state cluster refused: {} (for a single-broker test setup set [state] production = \
             false to report these as warnings)",
            errors.join("; ")
        );
    }
    for e in &errors {
        tracing::warn!("state cluster (production = false, not refused): {e}");
    }
    Ok(())
}

/// A source's cluster id from its Metadata, if it answers in time.
async fn source_cluster_id(
    bootstrap: &[String],
    tls: Option<&crate::config::ClientTlsConfig>,
    identity: crate::sasl::Identity,
) -> Option<String> {
    let connector =
        crate::kafka_client::TransportConnector::from_config(tls, "source (cluster id check)")
            .ok()?
            .with_sasl(identity);
    let servers: Vec<(String, u16)> = bootstrap
        .iter()
        .filter_map(|a| crate::config::split_host_port(a).ok())
        .collect();
    let view = tokio::time::timeout(
        SOURCE_ID_TIMEOUT,
        crate::proxy::refresh::fetch_cluster_view(
            &servers,
            &connector,
            SOURCE_ID_TIMEOUT,
            crate::config::DEFAULT_MAX_FRAME_BYTES as usize,
        ),
    )
    .await
    .ok()?
    .ok()?;
    view.cluster_id
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(rf: usize, isr: Option<i32>) -> StateClusterReport {
        StateClusterReport {
            cluster_id: Some("MkU3OEVBNTcwNTJENDM2Qg".into()),
            brokers: rf,
            replication_factor: rf,
            min_insync_replicas: isr,
        }
    }

    #[test]
    fn durability_needs_three_replicas_and_two_in_sync() {
        assert!(durability_problems(&report(3, Some(2)), "s").is_empty());
        assert_eq!(durability_problems(&report(1, Some(2)), "s").len(), 1);
        assert_eq!(durability_problems(&report(3, Some(1)), "s").len(), 1);
        assert_eq!(durability_problems(&report(1, Some(1)), "s").len(), 2);
        assert_eq!(durability_problems(&report(3, None), "s").len(), 1);
    }

    #[test]
    fn cluster_ids_compare_across_text_forms() {
        let b64 = "MkU3OEVBNTcwNTJENDM2Qg";
        let uuid = ClusterId::parse(b64).unwrap().to_uuid_string();
        assert!(same_cluster(b64, &uuid));
        assert!(same_cluster(b64, b64));
        assert!(!same_cluster(b64, "AAAAAAAAAAAAAAAAAAAAAA"));
    }
}
