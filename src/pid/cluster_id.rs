//! Kafka cluster ids: 16-byte UUIDs written as 22 characters of URL-safe
//! base64 without padding (Kafka's `Uuid.toString`), or as canonical UUID
//! text. Anything else is refused: SPEC 2.1 requires an explicit value
//! (e.g. a UUIDv5 of the name) rather than a guess, because the fold of the
//! id decides every mapped PID and must be identical on every instance.

use std::fmt;
use std::str::FromStr;

use base64::Engine;

/// A cluster id (16 bytes, big-endian halves as Java's `Uuid`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterId(pub [u8; 16]);

/// Why a string is not a cluster id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid cluster id {input:?}: {reason}; expected Kafka's 22-character URL-safe base64 form \
     (e.g. \"MkU3OEVBNTcwNTJENDM2Qg\") or canonical UUID text \
     (e.g. \"3243a1c6-1d26-4a0a-8b0e-4c1c1a1b2c3d\"); for a cluster whose id is neither, \
     configure an explicit UUID (for example a UUIDv5 of its name)"
)]
pub struct ClusterIdError {
    /// The refused input.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl ClusterId {
    /// Parses either accepted form (surrounding whitespace is not accepted:
    /// ids are compared byte for byte elsewhere).
    pub fn parse(s: &str) -> Result<Self, ClusterIdError> {
        let err = |reason| ClusterIdError {
            input: s.to_owned(),
            reason,
        };
        match s.len() {
            22 => {
                let mut out = [0u8; 16];
                // The default engine config refuses non-zero trailing bits,
                // so each id has exactly one accepted spelling.
                let n = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode_slice(s, &mut out)
                    .map_err(|_| err("not URL-safe base64"))?;
                if n != 16 {
                    return Err(err("base64 does not decode to 16 bytes"));
                }
                Ok(ClusterId(out))
            }
            36 => {
                let b = s.as_bytes();
                let mut out = [0u8; 16];
                let mut nibbles = 0usize;
                for (i, &c) in b.iter().enumerate() {
                    if matches!(i, 8 | 13 | 18 | 23) {
                        if c != b'-' {
                            return Err(err(
                                "UUID text needs dashes at positions 8, 13, 18 and 23",
                            ));
                        }
                        continue;
                    }
                    let v = (c as char)
                        .to_digit(16)
                        .ok_or_else(|| err("UUID text has a non-hex digit"))?;
                    if let Some(byte) = out.get_mut(nibbles / 2) {
                        *byte = (*byte << 4) | v as u8;
                    }
                    nibbles += 1;
                }
                Ok(ClusterId(out))
            }
            _ => Err(err("wrong length")),
        }
    }

    /// (most significant 64 bits, least significant 64 bits).
    pub fn halves(&self) -> (u64, u64) {
        let mut msb = [0u8; 8];
        let mut lsb = [0u8; 8];
        msb.copy_from_slice(&self.0[..8]);
        lsb.copy_from_slice(&self.0[8..]);
        (u64::from_be_bytes(msb), u64::from_be_bytes(lsb))
    }

    /// Kafka's base64 form.
    pub fn to_base64(&self) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.0)
    }

    /// Canonical UUID text (lower case).
    pub fn to_uuid_string(&self) -> String {
        let (m, l) = self.halves();
        format!(
            "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            m >> 32,
            (m >> 16) & 0xffff,
            m & 0xffff,
            l >> 48,
            l & 0xffff_ffff_ffff
        )
    }
}

impl FromStr for ClusterId {
    type Err = ClusterIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ClusterId::parse(s)
    }
}

impl fmt::Display for ClusterId {
    /// Kafka's base64 form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_base64())
    }
}
