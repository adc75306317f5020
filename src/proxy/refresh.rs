//! The proxy's own upstream Metadata refresh.
//!
//! Clients are not the only source of node addresses: the listener asks the
//! upstream for its brokers at start-up (readiness waits for it) and then
//! periodically, so node ports exist before any client asks and moved brokers
//! are followed. Metadata v4 with an empty topic list asks for brokers only
//! and is served by every broker from Kafka 0.11 to 4.x.

use bytes::BufMut;
use tokio::io::AsyncWriteExt;

use crate::codec::api::METADATA;
use crate::codec::header::{response_body_offset, response_correlation_id};
use crate::codec::FrameReader;
use crate::handlers::rewrite_metadata_response;
use crate::proxy::listener::Listener;
use crate::proxy::upstream::connect_any;

const METADATA_VERSION: i16 = 4;
const CLIENT_ID: &[u8] = b"mirrorguard";

/// A Metadata v4 request for no topics (header v1).
pub fn metadata_request(correlation_id: i32) -> Vec<u8> {
    let mut body = Vec::with_capacity(32);
    body.put_i16(METADATA);
    body.put_i16(METADATA_VERSION);
    body.put_i32(correlation_id);
    body.put_i16(CLIENT_ID.len() as i16);
    body.put_slice(CLIENT_ID);
    body.put_i32(0); // topics: empty array = none (null would mean all)
    body.put_u8(0); // allow_auto_topic_creation = false
    let mut frame = Vec::with_capacity(body.len() + 4);
    frame.put_i32(body.len() as i32);
    frame.extend_from_slice(&body);
    frame
}

/// Reads the upstream's brokers into the listener's node registry; returns
/// how many brokers the upstream reported.
pub async fn refresh_nodes(listener: &Listener) -> anyhow::Result<usize> {
    let timeout = listener.connect_timeout();
    let mut stream = connect_any(listener.upstream_bootstrap(), 0, timeout).await?;
    let correlation_id = 1;
    stream.write_all(&metadata_request(correlation_id)).await?;
    let mut reader = FrameReader::new(&mut stream, listener.max_frame());
    let frame = tokio::time::timeout(timeout * 2, reader.next_frame())
        .await
        .map_err(|_| anyhow::anyhow!("no Metadata response within {:?}", timeout * 2))??
        .ok_or_else(|| anyhow::anyhow!("upstream closed before answering Metadata"))?;
    if response_correlation_id(&frame) != Some(correlation_id) {
        anyhow::bail!("Metadata response has the wrong correlation id");
    }
    let body_at = response_body_offset(&frame, 0)
        .ok_or_else(|| anyhow::anyhow!("Metadata response too short"))?;
    let mut count = 0;
    let mut learn = |node_id: i32, host: &str, port: i32| {
        count += 1;
        listener.nodes.advertise(node_id, host, port);
        None
    };
    rewrite_metadata_response(METADATA_VERSION, &frame[body_at..], &mut learn)?;
    Ok(count)
}
