//! Secrets mirrorguard holds: the admin token, TLS private keys, SASL
//! passwords and credential files.
//!
//! - **File permissions.** A secret file that users other than
//!   mirrorguard's own can read is refused at start-up, naming the file
//!   (`[secrets] unsafe_permissions = "warn"` makes it a WARN line): no
//!   permission for "other", no group write, and group read only for a group
//!   the process is in (how Kubernetes hands Secret volumes to a non-root
//!   container: `fsGroup`, mode 0440).
//! - **The admin token** must be at least [`MIN_TOKEN_BYTES`] long and not a
//!   placeholder (`change-me` and a few like it, or too few distinct
//!   characters to be random). Only its SHA-256 digest is kept
//!   ([`AdminToken`]); a presented token is hashed and the digests compared
//!   in constant time (`subtle`), so neither its bytes nor its length leak
//!   through timing.
//! - **Environment passwords** (`password_env`) are taken out of the
//!   process environment once read ([`take_env_secrets`], before any thread
//!   starts): the value is overwritten where the environment keeps it, so
//!   `/proc/<pid>/environ` (what `ps e` shows) no longer holds it, and the
//!   variable is removed.
//! - What is read is zeroized when dropped (`zeroize`).

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::Path;
use std::sync::Mutex;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use zeroize::{Zeroize, Zeroizing};

/// The shortest admin token accepted (`openssl rand -hex 16` gives 32).
pub const MIN_TOKEN_BYTES: usize = 32;

/// Words that mark a token as a placeholder, compared with the token
/// lowercased and stripped of everything but letters and digits.
const PLACEHOLDERS: &[&str] = &[
    "changeme",
    "replaceme",
    "replacewith",
    "placeholder",
    "example",
    "yourtoken",
    "insertrandom",
    "notasecret",
    "password",
];

/// Fewer distinct bytes than this and a token is not random.
const MIN_DISTINCT_BYTES: usize = 8;

/// What to do with a secret file others can read (`[secrets] unsafe_permissions`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnsafePermissions {
    /// Refuse to start (the default).
    #[default]
    Refuse,
    /// Start, with a WARN line naming the file.
    Warn,
}

/// Why a secret cannot be used. Never holds the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// The file cannot be read (or its metadata cannot).
    #[error("{path}: cannot read: {reason}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        reason: String,
    },
    /// Users other than mirrorguard's own can read or change it.
    #[error(
        "{path}: {who} (mode {mode:04o}); a secret file must be readable by mirrorguard only: \
         `chmod 0600 {path}` (or 0640 with a group mirrorguard runs in; \
         [secrets] unsafe_permissions = \"warn\" to start anyway)"
    )]
    Permissions {
        /// The file.
        path: String,
        /// Who else can read or write it.
        who: String,
        /// Its permission bits.
        mode: u32,
    },
    /// The token file is empty.
    #[error("{path} is empty; create a token with `openssl rand -hex 32 > {path}`")]
    Empty {
        /// The file.
        path: String,
    },
    /// Too short to be a secret.
    #[error(
        "{path}: the token is {len} bytes long; at least 32 bytes are required \
         (create one with `openssl rand -hex 32 > {path}`)"
    )]
    TooShort {
        /// The file.
        path: String,
        /// Its length.
        len: usize,
    },
    /// A placeholder such as `change-me`.
    #[error(
        "{path}: the token is a placeholder ({why}), not a secret; \
         create one with `openssl rand -hex 32 > {path}`"
    )]
    Placeholder {
        /// The file.
        path: String,
        /// What gave it away (never the token itself).
        why: String,
    },
    /// A byte a bearer token cannot carry (space, control, non-ASCII).
    #[error(
        "{path}: the token holds a character an HTTP header cannot carry (visible ASCII only)"
    )]
    BadCharacter {
        /// The file.
        path: String,
    },
}

/// Checks who can read `path`: refused (or a WARN line, with
/// [`UnsafePermissions::Warn`]) when anyone but mirrorguard's own user and
/// groups can read it, or anyone but its owner can change it. A file that
/// cannot be found is left to whoever reads it (the error names the field).
pub fn check_permissions(path: &Path, policy: UnsafePermissions) -> Result<(), SecretError> {
    use std::os::unix::fs::MetadataExt;
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(SecretError::Read {
                path: path.display().to_string(),
                reason: e.to_string(),
            })
        }
    };
    let mode = meta.mode() & 0o7777;
    let who = if mode & 0o007 != 0 {
        Some("every user of the host can read or change it".to_owned())
    } else if mode & 0o020 != 0 {
        Some(format!("group {} can change it", meta.gid()))
    } else if mode & 0o040 != 0 && !in_group(meta.gid()) {
        Some(format!(
            "group {} can read it and mirrorguard is not in that group",
            meta.gid()
        ))
    } else {
        None
    };
    let Some(who) = who else { return Ok(()) };
    let err = SecretError::Permissions {
        path: path.display().to_string(),
        who,
        mode,
    };
    match policy {
        UnsafePermissions::Refuse => Err(err),
        UnsafePermissions::Warn => {
            tracing::warn!("secret file permissions (unsafe_permissions = \"warn\"): {err}");
            Ok(())
        }
    }
}

/// Whether the process runs with group `gid` (effective or supplementary).
fn in_group(gid: u32) -> bool {
    // SAFETY: getegid has no preconditions; getgroups writes at most `n`
    // entries into a buffer of that size.
    unsafe {
        if libc::getegid() == gid {
            return true;
        }
        let n = libc::getgroups(0, std::ptr::null_mut());
        if n <= 0 {
            return false;
        }
        let mut groups = vec![0 as libc::gid_t; n as usize];
        let n = libc::getgroups(n, groups.as_mut_ptr());
        n > 0 && groups[..n as usize].contains(&gid)
    }
}

/// Reads a secret file (permissions checked first); the result is zeroized
/// when dropped. A trailing newline (`\n` or `\r\n`) is dropped.
pub fn read_secret_file(
    path: &Path,
    policy: UnsafePermissions,
) -> Result<Zeroizing<Vec<u8>>, SecretError> {
    check_permissions(path, policy)?;
    let mut bytes = Zeroizing::new(std::fs::read(path).map_err(|e| SecretError::Read {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?);
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
    }
    Ok(bytes)
}

/// The admin bearer token, kept as its SHA-256 digest only.
#[derive(Clone)]
pub struct AdminToken {
    digest: [u8; 32],
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

impl AdminToken {
    /// Reads and checks `admin.token_file`: permissions, then the token
    /// itself (surrounding white space ignored): not empty, at least
    /// [`MIN_TOKEN_BYTES`], visible ASCII, not a placeholder.
    pub fn load(path: &Path, policy: UnsafePermissions) -> Result<Self, SecretError> {
        let bytes = read_secret_file(path, policy)?;
        Self::from_bytes(&bytes, path)
    }

    /// Checks a token read from `path` (named in errors).
    pub fn from_bytes(raw: &[u8], path: &Path) -> Result<Self, SecretError> {
        let name = path.display().to_string();
        let token = raw.trim_ascii();
        if token.is_empty() {
            return Err(SecretError::Empty { path: name });
        }
        if !token.iter().all(|b| b.is_ascii_graphic()) {
            return Err(SecretError::BadCharacter { path: name });
        }
        if let Some(why) = placeholder(token) {
            return Err(SecretError::Placeholder { path: name, why });
        }
        if token.len() < MIN_TOKEN_BYTES {
            return Err(SecretError::TooShort {
                path: name,
                len: token.len(),
            });
        }
        Ok(Self {
            digest: Sha256::digest(token).into(),
        })
    }

    /// Whether `presented` is the token. Both sides are hashed first, so
    /// the comparison takes the same time whatever the presented token's
    /// length and contents.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented.trim_ascii()).into();
        bool::from(digest.ct_eq(&self.digest))
    }
}

/// Why `token` looks like a placeholder: the word it contains, or that it
/// has too few distinct characters to be random. Never the token itself.
fn placeholder(token: &[u8]) -> Option<String> {
    let mut folded: Zeroizing<Vec<u8>> = Zeroizing::new(
        token
            .iter()
            .filter(|b| b.is_ascii_alphanumeric())
            .map(|b| b.to_ascii_lowercase())
            .collect(),
    );
    let found = PLACEHOLDERS
        .iter()
        .find(|w| folded.windows(w.len()).any(|x| x == w.as_bytes()));
    folded.zeroize();
    if let Some(w) = found {
        return Some(format!("it contains {w:?}"));
    }
    let mut seen = [false; 256];
    for &b in token {
        seen[b as usize] = true;
    }
    let distinct = seen.iter().filter(|s| **s).count();
    (distinct < MIN_DISTINCT_BYTES)
        .then(|| format!("only {distinct} distinct characters: not random"))
}

/// Passwords taken out of the environment by [`take_env_secrets`], by
/// variable name.
static ENV_SECRETS: Mutex<Option<HashMap<String, Zeroizing<Vec<u8>>>>> = Mutex::new(None);

/// Takes each named variable out of the process environment: its value is
/// kept here (for [`env_secret`]), overwritten in place where the
/// environment holds it (so `/proc/<pid>/environ` no longer shows it) and
/// the variable removed. Variables not set are left for [`env_secret`] to
/// report.
///
/// Must run before any other thread exists (`run` calls it before the
/// runtime starts): the environment is changed.
pub fn take_env_secrets<'a>(names: impl IntoIterator<Item = &'a str>) {
    let mut stash = ENV_SECRETS.lock().unwrap_or_else(|p| p.into_inner());
    let stash = stash.get_or_insert_with(HashMap::new);
    for name in names {
        if name.is_empty() || name.contains(['=', '\0']) || stash.contains_key(name) {
            continue;
        }
        let Some(value) = std::env::var_os(name) else {
            continue;
        };
        let value: OsString = value;
        stash.insert(
            name.to_owned(),
            Zeroizing::new(std::os::unix::ffi::OsStringExt::into_vec(value)),
        );
        scrub_env_value(name);
        // SAFETY (edition 2024 terms): no other thread runs yet, see above.
        std::env::remove_var(name);
    }
}

/// Overwrites the bytes of `name`'s value where the C environment holds
/// them (for the initial environment: the process stack, which is what
/// `/proc/<pid>/environ` reads).
fn scrub_env_value(name: &str) {
    let Ok(c_name) = std::ffi::CString::new(name) else {
        return;
    };
    // SAFETY: single-threaded (see take_env_secrets); getenv returns a
    // pointer to the NUL-terminated value inside a writable `NAME=value`
    // string (the initial environment on the stack, or memory setenv
    // allocated), or null. The bytes before the terminator are overwritten,
    // the terminator stays.
    unsafe {
        let p = libc::getenv(c_name.as_ptr());
        if !p.is_null() {
            let len = libc::strlen(p);
            std::ptr::write_bytes(p, b'*', len);
        }
    }
}

/// A password named by `password_env`: taken out of the environment at
/// start-up ([`take_env_secrets`]), or still in it (tests, tools).
pub fn env_secret(name: &str) -> Option<Zeroizing<Vec<u8>>> {
    let stash = ENV_SECRETS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(v) = stash.as_ref().and_then(|s| s.get(name)) {
        return Some(v.clone());
    }
    std::env::var_os(name).map(|v| Zeroizing::new(std::os::unix::ffi::OsStringExt::into_vec(v)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn token_err(t: &str) -> String {
        AdminToken::from_bytes(t.as_bytes(), Path::new("/etc/mg/admin.token"))
            .map(|_| String::new())
            .unwrap_or_else(|e| e.to_string())
    }

    #[test]
    fn placeholders_and_short_tokens_are_refused_naming_the_file() {
        for t in [
            "change-me",
            "CHANGE_ME-change-me-change-me-change-me",
            "replace-with-openssl-rand-hex-32-output",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "01010101010101010101010101010101010101",
            "this-is-an-example-token-0123456789abcdef",
        ] {
            let e = token_err(t);
            assert!(
                e.contains("/etc/mg/admin.token") && e.contains("placeholder"),
                "{t}: {e}"
            );
            assert!(
                !e.contains(t),
                "the token itself is never in the message: {e}"
            );
            assert!(e.contains("openssl rand -hex 32"), "{e}");
        }
        let e = token_err("9f8e7d6c5b4a39281706f5e4");
        assert!(e.contains("24 bytes") && e.contains("at least 32"), "{e}");
        assert!(token_err("   \n").contains("is empty"));
        assert!(token_err("4f1c0a9e7b2d48c6 a35e91d07f62b8ac").contains("character"));
        assert_eq!(token_err("4f1c0a9e7b2d48c6a35e91d07f62b8ac\n"), "");
    }

    #[test]
    fn the_token_compare_hashes_both_sides() {
        let t =
            AdminToken::from_bytes(b"4f1c0a9e7b2d48c6a35e91d07f62b8ac", Path::new("t")).unwrap();
        assert!(t.matches(b"4f1c0a9e7b2d48c6a35e91d07f62b8ac"));
        assert!(t.matches(b" 4f1c0a9e7b2d48c6a35e91d07f62b8ac "));
        assert!(!t.matches(b"4f1c0a9e7b2d48c6a35e91d07f62b8a"));
        assert!(!t.matches(b"4f1c0a9e7b2d48c6a35e91d07f62b8acd"));
        assert!(!t.matches(b""));
        assert!(!format!("{t:?}").contains("4f1c"));
    }

    #[test]
    fn secret_files_others_can_read_are_refused_or_warned() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("secret");
        std::fs::write(&f, "s\n").unwrap();
        let set = |mode: u32| std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode));
        for ok in [0o600, 0o400] {
            set(ok).unwrap();
            check_permissions(&f, UnsafePermissions::Refuse).unwrap();
        }
        for bad in [0o644, 0o604, 0o660, 0o602] {
            set(bad).unwrap();
            let e = check_permissions(&f, UnsafePermissions::Refuse)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&f.display().to_string()) && e.contains("chmod 0600"),
                "{e}"
            );
            check_permissions(&f, UnsafePermissions::Warn).unwrap();
        }
        // Group read by a group the process is in (its own): accepted.
        set(0o640).unwrap();
        check_permissions(&f, UnsafePermissions::Refuse).unwrap();
        // A missing file is for its reader to report.
        check_permissions(&dir.path().join("missing"), UnsafePermissions::Refuse).unwrap();
        set(0o600).unwrap();
        assert_eq!(
            &*read_secret_file(&f, UnsafePermissions::Refuse).unwrap(),
            b"s"
        );
    }

    #[test]
    fn env_secrets_leave_the_environment() {
        std::env::set_var("MG_SECRETS_TEST_PW", "pw-4711");
        take_env_secrets(["MG_SECRETS_TEST_PW", "MG_SECRETS_TEST_UNSET"]);
        assert!(std::env::var_os("MG_SECRETS_TEST_PW").is_none());
        assert_eq!(&*env_secret("MG_SECRETS_TEST_PW").unwrap(), b"pw-4711");
        assert!(env_secret("MG_SECRETS_TEST_UNSET").is_none());
    }
}
