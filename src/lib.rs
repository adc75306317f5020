//! mirrorguard: a Kafka-protocol sidecar proxy that makes cross-cluster
//! mirroring safe for idempotent and transactional producers.
