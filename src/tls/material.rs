//! Reading PEM files into rustls configurations, with errors that name the
//! field and the file.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

use super::TlsError;
use crate::config::{ClientTlsConfig, ServerTlsConfig};

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(field: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::new(field, path, format!("cannot read: {e}")))
}

/// notAfter of the leaf in `cert` (role `role`), and the earliest of the CA
/// bundle `ca` (role `ca`); files that cannot be read are skipped (the
/// configuration itself reports them).
fn expiries(leaf: Option<(&'static str, &Path)>, ca: Option<&Path>) -> Vec<(&'static str, i64)> {
    let mut out = Vec::new();
    if let Some((role, path)) = leaf {
        if let Some(t) = certs("cert", path)
            .ok()
            .and_then(|c| c.first().and_then(|c| super::x509::not_after(c)))
        {
            out.push((role, t));
        }
    }
    if let Some(path) = ca {
        if let Some(t) = certs("ca", path)
            .ok()
            .and_then(|c| c.iter().filter_map(|c| super::x509::not_after(c)).min())
        {
            out.push(("ca", t));
        }
    }
    out
}

/// Certificate expiries of a server section: its leaf, its `client_ca`.
pub(super) fn server_expiries(files: &ServerTlsConfig) -> Vec<(&'static str, i64)> {
    expiries(Some(("server", &files.cert)), files.client_ca.as_deref())
}

/// Certificate expiries of a client section: its leaf (if any), its `ca`.
pub(super) fn client_expiries(files: &ClientTlsConfig) -> Vec<(&'static str, i64)> {
    expiries(
        files.cert.as_deref().map(|c| ("client", c)),
        Some(&files.ca),
    )
}

fn certs(field: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(field, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::new(field, path, format!("bad PEM: {e}")))?;
    if certs.is_empty() {
        return Err(TlsError::new(
            field,
            path,
            "no CERTIFICATE block found (PEM expected)".into(),
        ));
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    // The PEM text is wiped once the key is parsed out of it.
    let pem = zeroize::Zeroizing::new(read("key", path)?);
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        TlsError::new(
            "key",
            path,
            format!("no usable private key (PKCS#8, PKCS#1 or SEC1 PEM expected): {e}"),
        )
    })
}

fn roots(field: &'static str, path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut store = RootCertStore::empty();
    for c in certs(field, path)? {
        store
            .add(c)
            .map_err(|e| TlsError::new(field, path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(Arc::new(store))
}

/// A certificate chain and its key, checked to belong together.
fn identity(
    cert: &Path,
    key_path: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let chain = certs("cert", cert)?;
    let key = key(key_path)?;
    let signing = provider()
        .key_provider
        .load_private_key(key.clone_key())
        .map_err(|e| TlsError::new("key", key_path, format!("unusable private key: {e}")))?;
    let certified = rustls::sign::CertifiedKey::new(chain.clone(), signing);
    match certified.keys_match() {
        Ok(()) => {}
        // Some keys cannot say their public half; rustls then checks at use.
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(e) => {
            return Err(TlsError::new(
                "key",
                key_path,
                format!(
                    "does not belong to the certificate in {}: {e}",
                    cert.display()
                ),
            ))
        }
    }
    Ok((chain, key))
}

/// The server configuration of a listener.
pub(super) fn server_config(files: &ServerTlsConfig) -> Result<rustls::ServerConfig, TlsError> {
    let (chain, key) = identity(&files.cert, &files.key)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::new("cert", &files.cert, e.to_string()))?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(roots("client_ca", ca)?, provider())
                    .build()
                    .map_err(|e| TlsError::new("client_ca", ca, e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::new("key", &files.key, e.to_string()))
}

/// The client configuration for one cluster.
pub(super) fn client_config(files: &ClientTlsConfig) -> Result<rustls::ClientConfig, TlsError> {
    let roots = roots("ca", &files.ca)?;
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::new("ca", &files.ca, e.to_string()))?;
    let builder = if files.insecure_skip_hostname_verification {
        let inner = WebPkiServerVerifier::builder_with_provider(roots, provider())
            .build()
            .map_err(|e| TlsError::new("ca", &files.ca, e.to_string()))?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ChainOnly(inner)))
    } else {
        builder.with_root_certificates(roots)
    };
    match (&files.cert, &files.key) {
        (Some(cert), Some(key_path)) => {
            let (chain, key) = identity(cert, key_path)?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| TlsError::new("key", key_path, e.to_string()))
        }
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(cert), None) => Err(TlsError::new(
            "key",
            cert,
            "a client certificate needs its `key` too".into(),
        )),
        (None, Some(key_path)) => Err(TlsError::new(
            "cert",
            key_path,
            "a client key needs its `cert` too".into(),
        )),
    }
}

/// Verifies the chain against the CA bundle but not the name in it
/// (`insecure_skip_hostname_verification`): webpki checks the chain before
/// the name, so a name mismatch means the chain itself was good.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
