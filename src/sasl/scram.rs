//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), both sides,
//! without channel binding (`n,,` GS2 header, as Kafka uses it).
//!
//! The client proves it knows the password without sending it; the server
//! keeps only the salted credential (salt, iterations, StoredKey,
//! ServerKey), never the password. Proofs and signatures are compared in
//! constant time.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{KeyInit, Mac};
use sha2::{Digest, Sha256, Sha512};
use subtle::ConstantTimeEq;

use super::{Mechanism, SaslError};

/// Kafka's minimum (and the RFC's recommended) iteration count.
pub const MIN_ITERATIONS: u32 = 4096;
/// Kafka's maximum iteration count.
pub const MAX_ITERATIONS: u32 = 16384;

/// What a server stores for one user and one SCRAM mechanism.
#[derive(Clone, PartialEq, Eq)]
pub struct StoredCredential {
    /// Salt.
    pub salt: Vec<u8>,
    /// PBKDF2 iterations.
    pub iterations: u32,
    /// `H(HMAC(SaltedPassword, "Client Key"))`.
    pub stored_key: Vec<u8>,
    /// `HMAC(SaltedPassword, "Server Key")`.
    pub server_key: Vec<u8>,
}

impl std::fmt::Debug for StoredCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredCredential")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

fn hmac(m: Mechanism, key: &[u8], data: &[u8]) -> Vec<u8> {
    match m {
        Mechanism::ScramSha512 => {
            let mut mac = hmac::Hmac::<Sha512>::new_from_slice(key).expect("any key length");
            mac.update(data);
            mac.finalize().into_bytes().to_vec()
        }
        _ => {
            let mut mac = hmac::Hmac::<Sha256>::new_from_slice(key).expect("any key length");
            mac.update(data);
            mac.finalize().into_bytes().to_vec()
        }
    }
}

fn hash(m: Mechanism, data: &[u8]) -> Vec<u8> {
    match m {
        Mechanism::ScramSha512 => Sha512::digest(data).to_vec(),
        _ => Sha256::digest(data).to_vec(),
    }
}

/// `Hi(password, salt, i)` of RFC 5802: PBKDF2 with the mechanism's HMAC.
pub fn salted_password(m: Mechanism, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
    match m {
        Mechanism::ScramSha512 => {
            pbkdf2::pbkdf2_hmac_array::<Sha512, 64>(password, salt, iterations).to_vec()
        }
        _ => pbkdf2::pbkdf2_hmac_array::<Sha256, 32>(password, salt, iterations).to_vec(),
    }
}

impl StoredCredential {
    /// The credential of `password` with `salt` and `iterations`.
    pub fn derive(m: Mechanism, password: &[u8], salt: &[u8], iterations: u32) -> Self {
        let salted = salted_password(m, password, salt, iterations);
        let client_key = hmac(m, &salted, b"Client Key");
        Self {
            salt: salt.to_vec(),
            iterations,
            stored_key: hash(m, &client_key),
            server_key: hmac(m, &salted, b"Server Key"),
        }
    }

    /// Whether `password` is the one this credential was derived from
    /// (SASL/PLAIN checked against a SCRAM credential), in constant time.
    pub fn matches_password(&self, m: Mechanism, password: &[u8]) -> bool {
        let other = Self::derive(m, password, &self.salt, self.iterations);
        bool::from(other.stored_key.ct_eq(&self.stored_key))
    }
}

/// A fresh printable nonce (24 random bytes, base64).
pub fn nonce() -> Result<String, SaslError> {
    let mut b = [0u8; 24];
    getrandom::getrandom(&mut b)
        .map_err(|e| SaslError::Local(format!("no randomness for a nonce: {e}")))?;
    Ok(B64.encode(b))
}

/// `saslname` escaping of RFC 5802 (`,` and `=`).
fn escape(user: &str) -> String {
    user.replace('=', "=3D").replace(',', "=2C")
}

fn unescape(name: &str) -> Result<String, SaslError> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i..i + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(SaslError::malformed("invalid saslname escape")),
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The `k=value` attributes of a SCRAM message, in order.
fn attributes(msg: &str) -> Result<Vec<(char, &str)>, SaslError> {
    msg.split(',')
        .map(|part| {
            let mut chars = part.chars();
            match (chars.next(), chars.next()) {
                (Some(k), Some('=')) if k.is_ascii_alphabetic() => Ok((k, &part[2..])),
                _ => Err(SaslError::malformed("SCRAM attribute is not k=value")),
            }
        })
        .collect()
}

fn attr<'a>(attrs: &[(char, &'a str)], key: char) -> Result<&'a str, SaslError> {
    attrs
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| *v)
        .ok_or_else(|| SaslError::malformed(format!("SCRAM message lacks `{key}=`")))
}

fn xor(a: &[u8], b: &[u8]) -> Vec<u8> {
    a.iter().zip(b).map(|(x, y)| x ^ y).collect()
}

/// The client side of one SCRAM exchange.
pub struct ScramClient {
    mechanism: Mechanism,
    password: Vec<u8>,
    client_nonce: String,
    client_first_bare: String,
    server_signature: Option<Vec<u8>>,
}

impl ScramClient {
    /// Starts an exchange for `user` (a fresh nonce unless `nonce` is given,
    /// for tests).
    pub fn new(
        mechanism: Mechanism,
        user: &str,
        password: &[u8],
        nonce_override: Option<&str>,
    ) -> Result<Self, SaslError> {
        let client_nonce = match nonce_override {
            Some(n) => n.to_owned(),
            None => nonce()?,
        };
        Ok(Self {
            mechanism,
            password: password.to_vec(),
            client_first_bare: format!("n={},r={client_nonce}", escape(user)),
            client_nonce,
            server_signature: None,
        })
    }

    /// The client-first message.
    pub fn client_first(&self) -> String {
        format!("n,,{}", self.client_first_bare)
    }

    /// Answers the server-first message with the client-final message.
    pub fn client_final(&mut self, server_first: &str) -> Result<String, SaslError> {
        let attrs = attributes(server_first)?;
        if let Ok(e) = attr(&attrs, 'e') {
            return Err(SaslError::Rejected(format!("server refused: {e}")));
        }
        let nonce = attr(&attrs, 'r')?;
        if !nonce.starts_with(&self.client_nonce) || nonce.len() == self.client_nonce.len() {
            return Err(SaslError::malformed(
                "server nonce does not extend the client nonce",
            ));
        }
        let salt = B64
            .decode(attr(&attrs, 's')?)
            .map_err(|_| SaslError::malformed("salt is not base64"))?;
        let iterations: u32 = attr(&attrs, 'i')?
            .parse()
            .map_err(|_| SaslError::malformed("iteration count is not a number"))?;
        // Kafka's client refuses fewer than the mechanism's minimum: a server
        // (or a host on the path) asking for 1 would make a captured
        // exchange cheap to brute-force.
        if iterations < MIN_ITERATIONS {
            return Err(SaslError::Rejected(format!(
                "the server asks for {iterations} SCRAM iterations, fewer than the minimum of \
                 {MIN_ITERATIONS}"
            )));
        }
        if iterations > 1_000_000 {
            return Err(SaslError::malformed("iteration count out of range"));
        }
        let m = self.mechanism;
        let salted = salted_password(m, &self.password, &salt, iterations);
        let client_key = hmac(m, &salted, b"Client Key");
        let stored_key = hash(m, &client_key);
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let signature = hmac(m, &stored_key, auth_message.as_bytes());
        let proof = xor(&client_key, &signature);
        let server_key = hmac(m, &salted, b"Server Key");
        self.server_signature = Some(hmac(m, &server_key, auth_message.as_bytes()));
        Ok(format!("{without_proof},p={}", B64.encode(proof)))
    }

    /// Checks the server-final message (the server proves it knows the
    /// credential too).
    pub fn verify_server_final(&self, server_final: &str) -> Result<(), SaslError> {
        let attrs = attributes(server_final)?;
        if let Ok(e) = attr(&attrs, 'e') {
            return Err(SaslError::Rejected(format!("server refused: {e}")));
        }
        let v = B64
            .decode(attr(&attrs, 'v')?)
            .map_err(|_| SaslError::malformed("server signature is not base64"))?;
        let expected = self
            .server_signature
            .as_ref()
            .ok_or_else(|| SaslError::malformed("server-final before server-first"))?;
        if bool::from(v.ct_eq(expected)) {
            Ok(())
        } else {
            Err(SaslError::Rejected(
                "the server's signature is wrong (it does not know this user's credential)".into(),
            ))
        }
    }
}

/// The server side of one SCRAM exchange, after the client-first message.
pub struct ScramServer {
    mechanism: Mechanism,
    /// The authenticated user name (once the proof is checked).
    pub user: String,
    credential: StoredCredential,
    /// Whether `credential` is the user's (else a made-up one: the proof
    /// is checked all the same and then refused).
    known: bool,
    nonce: String,
    client_first_bare: String,
    server_first: String,
}

impl ScramServer {
    /// Reads the client-first message; `lookup` finds the user's credential
    /// (`None`: unknown user, which fails at the proof like a wrong
    /// password, after a server-first built from a made-up salt, so an
    /// unknown user cannot be told from a wrong password).
    pub fn new(
        mechanism: Mechanism,
        client_first: &str,
        lookup: impl FnOnce(&str) -> Option<StoredCredential>,
    ) -> Result<Self, SaslError> {
        Self::new_with(mechanism, client_first, |user| match lookup(user) {
            Some(c) => (c, true),
            None => {
                let salted = salted_password(mechanism, b"", &hash(mechanism, user.as_bytes()), 1);
                let mut c = StoredCredential::derive(mechanism, &salted, b"unknown", 1);
                c.salt = hash(mechanism, user.as_bytes())[..16].to_vec();
                c.iterations = MIN_ITERATIONS;
                (c, false)
            }
        })
    }

    /// [`new`](Self::new) with a lookup that always yields a credential:
    /// the user's (`true`), or one made up for an unknown user (`false`),
    /// with which the exchange runs to the same failure as a wrong password.
    pub fn new_with(
        mechanism: Mechanism,
        client_first: &str,
        lookup: impl FnOnce(&str) -> (StoredCredential, bool),
    ) -> Result<Self, SaslError> {
        let bare = client_first
            .strip_prefix("n,,")
            .ok_or_else(|| SaslError::malformed("only the `n,,` GS2 header is supported"))?;
        let attrs = attributes(bare)?;
        if attrs.iter().any(|(k, _)| *k == 'm') {
            return Err(SaslError::malformed("SCRAM extensions are not supported"));
        }
        let user = unescape(attr(&attrs, 'n')?)?;
        let client_nonce = attr(&attrs, 'r')?;
        if client_nonce.is_empty() || client_nonce.contains(',') {
            return Err(SaslError::malformed("empty client nonce"));
        }
        let (credential, known) = lookup(&user);
        let nonce = format!("{client_nonce}{}", self::nonce()?);
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&credential.salt),
            credential.iterations
        );
        Ok(Self {
            mechanism,
            user,
            credential,
            known,
            nonce,
            client_first_bare: bare.to_owned(),
            server_first,
        })
    }

    /// The server-first message.
    pub fn server_first(&self) -> &str {
        &self.server_first
    }

    /// Checks the client-final message; returns the server-final message.
    pub fn finish(&self, client_final: &str) -> Result<String, SaslError> {
        let attrs = attributes(client_final)?;
        if attr(&attrs, 'c')? != "biws" {
            return Err(SaslError::malformed("channel binding is not supported"));
        }
        if attr(&attrs, 'r')? != self.nonce {
            return Err(SaslError::Rejected("nonce mismatch".into()));
        }
        let proof = B64
            .decode(attr(&attrs, 'p')?)
            .map_err(|_| SaslError::malformed("proof is not base64"))?;
        let without_proof = client_final
            .rsplit_once(",p=")
            .map(|(w, _)| w)
            .ok_or_else(|| SaslError::malformed("proof is not last"))?;
        let cred = &self.credential;
        let m = self.mechanism;
        let auth_message = format!(
            "{},{},{without_proof}",
            self.client_first_bare, self.server_first
        );
        let signature = hmac(m, &cred.stored_key, auth_message.as_bytes());
        if proof.len() != signature.len() {
            return Err(SaslError::Rejected("invalid credentials".into()));
        }
        let client_key = xor(&proof, &signature);
        if !bool::from(hash(m, &client_key).ct_eq(&cred.stored_key)) || !self.known {
            return Err(SaslError::Rejected("invalid credentials".into()));
        }
        let server_signature = hmac(m, &cred.server_key, auth_message.as_bytes());
        Ok(format!("v={}", B64.encode(server_signature)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 7677, section 3.
    const USER: &str = "user";
    const PASSWORD: &str = "pencil";
    const CLIENT_NONCE: &str = "rOprNGfwEbeRWgbNEkqO";
    const SERVER_FIRST: &str =
        "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
    const CLIENT_FINAL: &str = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                                p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
    const SERVER_FINAL: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

    #[test]
    fn client_matches_rfc7677() {
        let mut c = ScramClient::new(
            Mechanism::ScramSha256,
            USER,
            PASSWORD.as_bytes(),
            Some(CLIENT_NONCE),
        )
        .unwrap();
        assert_eq!(c.client_first(), "n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        assert_eq!(c.client_final(SERVER_FIRST).unwrap(), CLIENT_FINAL);
        c.verify_server_final(SERVER_FINAL).unwrap();
        let e = c
            .verify_server_final("v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .unwrap_err();
        assert!(e.to_string().contains("signature"), "{e}");
    }

    #[test]
    fn server_verifies_rfc7677_proof() {
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let cred = StoredCredential::derive(Mechanism::ScramSha256, b"pencil", &salt, 4096);
        let mut s = ScramServer::new(
            Mechanism::ScramSha256,
            "n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
            |u| (u == "user").then(|| cred.clone()),
        )
        .unwrap();
        // Replay the RFC's server nonce so the RFC's proof applies.
        s.nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0".into();
        s.server_first = SERVER_FIRST.into();
        assert_eq!(s.finish(CLIENT_FINAL).unwrap(), SERVER_FINAL);
        let bad = CLIENT_FINAL.replace("p=dHz", "p=eHz");
        assert!(s.finish(&bad).is_err());
        assert!(cred.matches_password(Mechanism::ScramSha256, b"pencil"));
        assert!(!cred.matches_password(Mechanism::ScramSha256, b"pencil2"));
    }

    #[test]
    fn both_sides_agree_for_every_mechanism_and_refuse_wrong_passwords() {
        for m in [Mechanism::ScramSha256, Mechanism::ScramSha512] {
            let cred = StoredCredential::derive(m, b"s3cret", b"0123456789abcdef", 4096);
            for (pw, ok) in [(&b"s3cret"[..], true), (b"wrong", false)] {
                let mut c = ScramClient::new(m, "a,b=c", pw, None).unwrap();
                let s = ScramServer::new(m, &c.client_first(), |u| {
                    (u == "a,b=c").then(|| cred.clone())
                })
                .unwrap();
                let fin = c.client_final(s.server_first()).unwrap();
                match s.finish(&fin) {
                    Ok(v) => {
                        assert!(ok);
                        c.verify_server_final(&v).unwrap();
                    }
                    Err(e) => {
                        assert!(!ok);
                        assert!(matches!(e, SaslError::Rejected(_)), "{e}");
                    }
                }
            }
            // An unknown user gets a server-first too and fails at the proof.
            let mut c = ScramClient::new(m, "nobody", b"x", None).unwrap();
            let s = ScramServer::new(m, &c.client_first(), |_| None).unwrap();
            let fin = c.client_final(s.server_first()).unwrap();
            assert!(matches!(s.finish(&fin), Err(SaslError::Rejected(_))));
        }
    }

    #[test]
    fn hostile_messages_are_refused_not_panicked_on() {
        let m = Mechanism::ScramSha256;
        for first in [
            "",
            "n,,",
            "y,,n=a,r=b",
            "n,,n=a",
            "n,,n=a=,r=x",
            "n,,x",
            "n,,n=a,r=",
        ] {
            assert!(ScramServer::new(m, first, |_| None).is_err(), "{first:?}");
        }
        let mut c = ScramClient::new(m, "u", b"p", Some("abc")).unwrap();
        for sf in [
            "",
            "r=abc,s=AA==,i=4096",
            "r=zzz1,s=AA==,i=4096",
            "r=abc1,s=!,i=4096",
            "r=abc1,s=AA==,i=0",
            "r=abc1,s=AA==,i=1",
            "r=abc1,s=AA==,i=4095",
            "e=other-error",
        ] {
            assert!(c.client_final(sf).is_err(), "{sf:?}");
        }
    }
}
