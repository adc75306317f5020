//! [`StateStoreError`]: why a state-store operation failed, with a stable
//! `kind` label for metrics and the retriability the store's retry loop
//! follows. Transport and broker failures arrive as
//! [`crate::kafka_client::ClientError`] and keep their Kafka error code.

use super::proto::{self, code};
use crate::kafka_client::ClientError;
use crate::wire::WireError;

/// Why a state-store operation failed. [`StateStoreError::kind`] gives a
/// stable label for metrics.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StateStoreError {
    /// No bootstrap server (or the leader) could be reached.
    #[error("state cluster unreachable: {0}")]
    Unreachable(String),
    /// A request got no answer within the request timeout.
    #[error("state cluster request timed out: {0}")]
    Timeout(String),
    /// The broker refused an operation for lack of permissions.
    #[error("not authorized on the state cluster: {api} returned {name} ({code})")]
    Authorization {
        /// API that was refused.
        api: &'static str,
        /// Kafka error code.
        code: i16,
        /// Its name.
        name: &'static str,
    },
    /// Creating the topic was refused.
    #[error("creating topic {topic} was refused: {name} ({code}){}", message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    TopicCreation {
        /// Topic name.
        topic: String,
        /// Kafka error code.
        code: i16,
        /// Its name.
        name: &'static str,
        /// Broker's message, if any.
        message: Option<String>,
    },
    /// The topic exists but cannot be used as the state topic.
    #[error("topic {topic} cannot hold mirrorguard state: {reason}")]
    TopicConfig {
        /// Topic name.
        topic: String,
        /// What is wrong.
        reason: String,
    },
    /// The broker answered with an error code.
    #[error("{api} failed on the state cluster: {name} ({code}){}", message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Broker {
        /// API that failed.
        api: &'static str,
        /// Kafka error code.
        code: i16,
        /// Its name.
        name: &'static str,
        /// Broker's message, if any.
        message: Option<String>,
        /// Whether retrying may help.
        retriable: bool,
    },
    /// No version of an API is spoken by both sides.
    #[error("state cluster does not support {api} in a version mirrorguard speaks (broker offers {offered})")]
    UnsupportedVersion {
        /// API name.
        api: &'static str,
        /// What the broker offers.
        offered: String,
    },
    /// A response could not be parsed.
    #[error("malformed response from the state cluster: {0}")]
    Protocol(String),
    /// The connection failed mid-request.
    #[error("connection to the state cluster failed: {0}")]
    Io(String),
    /// Stored data cannot be read (e.g. a compressed or legacy batch).
    #[error("unreadable data in the state topic at offset {offset}: {detail}")]
    Corrupt {
        /// Offset of the offending batch.
        offset: i64,
        /// What is wrong.
        detail: String,
    },
    /// mirrorguard's own SASL authentication was refused.
    #[error("authentication to the state cluster failed: {0}")]
    Authentication(String),
    /// The configuration is unusable.
    #[error("invalid state store configuration: {0}")]
    Config(String),
    /// The store's task has stopped (the store was shut down).
    #[error("state store task has stopped")]
    Closed,
}

impl StateStoreError {
    /// Stable label for a metric's `kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Unreachable(_) => "unreachable",
            Self::Timeout(_) => "timeout",
            Self::Authorization { .. } => "authorization",
            Self::TopicCreation { .. } => "topic_creation",
            Self::TopicConfig { .. } => "topic_config",
            Self::Broker { .. } => "broker_error",
            Self::UnsupportedVersion { .. } => "unsupported_version",
            Self::Protocol(_) => "protocol",
            Self::Io(_) => "io",
            Self::Corrupt { .. } => "corrupt",
            Self::Config(_) => "config",
            Self::Authentication(_) => "authentication",
            Self::Closed => "closed",
        }
    }

    /// Whether the broker refused a batch as too large (MESSAGE_TOO_LARGE
    /// or RECORD_LIST_TOO_LARGE): retrying the same batch cannot succeed.
    pub fn is_too_large(&self) -> bool {
        matches!(self, Self::Broker { code, .. }
            if *code == code::MESSAGE_TOO_LARGE || *code == code::RECORD_LIST_TOO_LARGE)
    }

    /// Whether a retry (after reconnecting) may succeed.
    pub fn is_retriable(&self) -> bool {
        match self {
            Self::Unreachable(_) | Self::Timeout(_) | Self::Io(_) => true,
            Self::Broker { retriable, .. } => *retriable,
            _ => false,
        }
    }

    pub(super) fn broker(api: i16, code: i16, message: Option<String>) -> Self {
        let api = proto::api_name(api);
        if proto::is_authorization(code) {
            return Self::Authorization {
                api,
                code,
                name: proto::error_name(code),
            };
        }
        Self::Broker {
            api,
            code,
            name: proto::error_name(code),
            message,
            retriable: proto::is_retriable(code),
        }
    }
}

impl From<ClientError> for StateStoreError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Unreachable(m) => Self::Unreachable(m),
            ClientError::Timeout(m) => Self::Timeout(m),
            ClientError::Io(m) => Self::Io(m),
            ClientError::Protocol(m) => Self::Protocol(m),
            ClientError::Authentication(m) => Self::Authentication(m),
            ClientError::Broker { api, code, message } => Self::broker(api, code, message),
        }
    }
}

impl From<StateStoreError> for String {
    fn from(e: StateStoreError) -> Self {
        e.to_string()
    }
}

impl From<WireError> for StateStoreError {
    fn from(e: WireError) -> Self {
        Self::Protocol(e.to_string())
    }
}

pub(crate) type Result<T> = std::result::Result<T, StateStoreError>;
