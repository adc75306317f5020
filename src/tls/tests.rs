//! Handshakes over local sockets with certificates made here (rcgen): the
//! error kinds hostile or misconfigured peers produce, hostname checks,
//! reloads, and the config errors naming field and file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// A CA and the PEM of certificates it signs.
struct Ca {
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// (cert PEM, key PEM) for `names`; `expired` dates it in the past.
    fn leaf(&self, names: &[&str], expired: bool) -> (String, String) {
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// Writes a test file readable by its owner only, as key files must be
/// (configuration validation refuses a key others can read).
fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

struct Bed {
    dir: tempfile::TempDir,
    ca: Ca,
    server: ServerTlsConfig,
}

/// A server identity for 127.0.0.1/localhost, optionally requiring client
/// certificates from the same CA.
fn bed(mtls: bool, handshake_timeout_ms: u64) -> Bed {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test ca");
    let (cert, key) = ca.leaf(&["localhost", "127.0.0.1"], false);
    let server = ServerTlsConfig {
        cert: write(dir.path(), "server.pem", &cert),
        key: write(dir.path(), "server.key", &key),
        client_ca: mtls.then(|| write(dir.path(), "ca.pem", &ca.cert_pem)),
        handshake_timeout_ms,
    };
    write(dir.path(), "ca.pem", &ca.cert_pem);
    Bed { dir, ca, server }
}

impl Bed {
    fn client(&self, name: Option<&str>, identity: Option<(String, String)>) -> ClientTlsConfig {
        let (cert, key) = match identity {
            Some((c, k)) => (
                Some(write(self.dir.path(), "client.pem", &c)),
                Some(write(self.dir.path(), "client.key", &k)),
            ),
            None => (None, None),
        };
        ClientTlsConfig {
            ca: self.dir.path().join("ca.pem"),
            cert,
            key,
            server_name: name.map(str::to_owned),
            insecure_skip_hostname_verification: false,
            handshake_timeout_ms: 5_000,
        }
    }
}

/// Accepts connections with `tls` and echoes one read back on success;
/// every outcome's kind goes to the returned channel.
async fn echo_server(
    tls: Arc<ServerTls>,
) -> (
    std::net::SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<Result<(), &'static str>>,
) {
    let socket = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = socket.accept().await.unwrap();
            let (tls, tx) = (tls.clone(), tx.clone());
            tokio::spawn(async move {
                match tls.accept(tcp).await {
                    Ok(mut t) => {
                        let _ = tx.send(Ok(()));
                        let mut buf = [0u8; 64];
                        if let Ok(n) = t.read(&mut buf).await {
                            let _ = t.write_all(&buf[..n]).await;
                            let _ = t.flush().await;
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e.kind()));
                    }
                }
            });
        }
    });
    (addr, rx)
}

async fn tls_client(
    cfg: &ClientTlsConfig,
    addr: std::net::SocketAddr,
) -> Result<Transport, HandshakeError> {
    let client = ClientTls::new(cfg, "test client").unwrap();
    let tcp = TcpStream::connect(addr).await.unwrap();
    client.connect(tcp, "127.0.0.1").await
}

async fn roundtrip(t: &mut Transport) {
    t.write_all(b"ping").await.unwrap();
    t.flush().await.unwrap();
    let mut buf = [0u8; 4];
    t.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping");
}

#[tokio::test]
async fn handshake_and_echo_with_hostname_verified() {
    let b = bed(false, 5_000);
    let (addr, mut outcomes) = echo_server(ServerTls::new(&b.server, "t").unwrap()).await;
    let mut t = tls_client(&b.client(None, None), addr).await.unwrap();
    assert!(t.is_tls());
    roundtrip(&mut t).await;
    assert_eq!(outcomes.recv().await, Some(Ok(())));
    // A name the certificate does not carry is refused ...
    let e = tls_client(&b.client(Some("kafka.example"), None), addr)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "bad_hostname", "{e}");
    // ... unless hostname verification is explicitly off (the chain still counts).
    let mut cfg = b.client(Some("kafka.example"), None);
    cfg.insecure_skip_hostname_verification = true;
    let mut t = tls_client(&cfg, addr).await.unwrap();
    roundtrip(&mut t).await;
    let other = Ca::new("other ca");
    let other_ca = write(b.dir.path(), "other-ca.pem", &other.cert_pem);
    cfg.ca = other_ca;
    let e = tls_client(&cfg, addr).await.unwrap_err();
    assert_eq!(e.kind(), "unknown_ca", "{e}");
}

#[tokio::test]
async fn hostile_peers_close_only_their_connection() {
    let b = bed(false, 300);
    let (addr, mut outcomes) = echo_server(ServerTls::new(&b.server, "t").unwrap()).await;

    // A plaintext Kafka request (size prefix, ApiVersions) on the TLS port.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(&[0, 0, 0, 10, 0, 18, 0, 3, 0, 0, 0, 1, 0, 0])
        .await
        .unwrap();
    assert_eq!(outcomes.recv().await, Some(Err("plaintext")));
    let mut buf = [0u8; 8];
    assert_eq!(plain.read(&mut buf).await.unwrap_or(0), 0, "closed");

    // A handshake that never finishes: one byte of a record, then silence.
    let mut stalled = TcpStream::connect(addr).await.unwrap();
    stalled.write_all(&[0x16]).await.unwrap();
    // Meanwhile a good client is served.
    let mut good = tls_client(&b.client(None, None), addr).await.unwrap();
    roundtrip(&mut good).await;
    assert_eq!(outcomes.recv().await, Some(Ok(())));
    assert_eq!(outcomes.recv().await, Some(Err("timeout")));

    // Garbage after a TLS record header claiming a ClientHello.
    let mut garbage = TcpStream::connect(addr).await.unwrap();
    let mut hello = vec![0x16, 0x03, 0x01, 0x00, 0x40, 0x01, 0x00, 0x00, 0x3c];
    hello.extend(std::iter::repeat_n(0xAB, 0x3c));
    garbage.write_all(&hello).await.unwrap();
    assert_eq!(outcomes.recv().await, Some(Err("protocol")));

    // Connect and close at once (a port scan, a health check).
    drop(TcpStream::connect(addr).await.unwrap());
    assert_eq!(outcomes.recv().await, Some(Err("eof")));
    drop(stalled);
}

#[tokio::test]
async fn mutual_tls_refuses_missing_expired_and_foreign_client_certificates() {
    let b = bed(true, 5_000);
    let (addr, mut outcomes) = echo_server(ServerTls::new(&b.server, "t").unwrap()).await;
    let good = b.ca.leaf(&["client"], false);
    let mut t = tls_client(&b.client(None, Some(good)), addr).await.unwrap();
    roundtrip(&mut t).await;
    assert!(t.peer_certificate().is_some());
    assert_eq!(outcomes.recv().await, Some(Ok(())));

    // With TLS 1.3 the client learns of the refusal on its first read.
    async fn refused(t: Result<Transport, HandshakeError>) {
        if let Ok(mut t) = t {
            let _ = t.write_all(b"ping").await;
            let mut buf = [0u8; 4];
            assert!(t.read_exact(&mut buf).await.is_err());
        }
    }
    refused(tls_client(&b.client(None, None), addr).await).await;
    assert_eq!(outcomes.recv().await, Some(Err("no_client_cert")));

    let expired = b.ca.leaf(&["client"], true);
    refused(tls_client(&b.client(None, Some(expired)), addr).await).await;
    assert_eq!(outcomes.recv().await, Some(Err("cert_expired")));

    let foreign = Ca::new("someone else").leaf(&["client"], false);
    refused(tls_client(&b.client(None, Some(foreign)), addr).await).await;
    assert_eq!(outcomes.recv().await, Some(Err("unknown_ca")));
}

#[tokio::test]
async fn reload_swaps_certificates_and_keeps_the_old_on_a_bad_file() {
    let b = bed(false, 5_000);
    let server = ServerTls::new(&b.server, "reload test").unwrap();
    let (addr, _outcomes) = echo_server(server.clone()).await;
    let first = tls_client(&b.client(None, None), addr).await.unwrap();
    let first_cert = server_cert(&first);

    // A new certificate from the same CA: new connections get it.
    let (cert, key) = b.ca.leaf(&["localhost", "127.0.0.1"], false);
    std::fs::write(&b.server.cert, cert).unwrap();
    std::fs::write(&b.server.key, key).unwrap();
    let report = reload_all();
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    let second = tls_client(&b.client(None, None), addr).await.unwrap();
    assert_ne!(server_cert(&second), first_cert);

    // A key that is not the certificate's: refused, the old pair stays.
    let (_, other_key) = b.ca.leaf(&["x"], false);
    std::fs::write(&b.server.key, other_key).unwrap();
    let report = reload_all();
    let mine: Vec<_> = report
        .failed
        .iter()
        .filter(|(what, _)| what == "reload test")
        .collect();
    assert_eq!(mine.len(), 1, "{:?}", report.failed);
    assert_eq!(mine[0].1.field, "key");
    assert!(
        mine[0].1.message.contains("does not belong"),
        "{}",
        mine[0].1
    );
    let mut third = tls_client(&b.client(None, None), addr).await.unwrap();
    assert_eq!(server_cert(&third), server_cert(&second));
    roundtrip(&mut third).await;
}

fn server_cert(t: &Transport) -> Vec<u8> {
    t.peer_certificate().unwrap().to_vec()
}

#[test]
fn config_errors_name_field_and_file() {
    let b = bed(false, 5_000);
    let check = |text: &str| -> String {
        let toml = format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\n\
             [[listener]]\nname = \"l\"\nbootstrap = \"127.0.0.1:1\"\nnode_port_base = 2\n\
             upstream_bootstrap = [\"127.0.0.1:3\"]\n{text}"
        );
        crate::config::Config::parse(&toml, Path::new("proxy.toml"))
            .map(|_| String::new())
            .unwrap_or_else(|e| e.to_string())
    };
    let d = b.dir.path().display();
    let cert = b.server.cert.display();
    let key = b.server.key.display();
    assert_eq!(
        check(&format!(
            "[listener.tls]\ncert = \"{cert}\"\nkey = \"{key}\"\n\
             [listener.upstream_tls]\nca = \"{d}/ca.pem\"\n"
        )),
        ""
    );
    // A private key other users can read is refused, naming field and file.
    let loose = write(
        b.dir.path(),
        "loose.key",
        &std::fs::read_to_string(&b.server.key).unwrap(),
    );
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let e = check(&format!(
        "[listener.tls]\ncert = \"{cert}\"\nkey = \"{}\"\n",
        loose.display()
    ));
    assert!(
        e.contains("listener[0].tls.key") && e.contains("loose.key") && e.contains("chmod 0600"),
        "{e}"
    );
    let e = check(&format!(
        "[listener.tls]\ncert = \"{d}/missing.pem\"\nkey = \"{key}\"\n"
    ));
    assert!(
        e.contains("listener[0].tls.cert")
            && e.contains("missing.pem")
            && e.contains("cannot read"),
        "{e}"
    );
    write(b.dir.path(), "junk.pem", "not pem at all\n");
    let e = check(&format!("[listener.upstream_tls]\nca = \"{d}/junk.pem\"\n"));
    assert!(
        e.contains("listener[0].upstream_tls.ca")
            && e.contains("junk.pem")
            && e.contains("no CERTIFICATE"),
        "{e}"
    );
    let (_, other_key) = b.ca.leaf(&["x"], false);
    write(b.dir.path(), "other.key", &other_key);
    let e = check(&format!(
        "[listener.tls]\ncert = \"{cert}\"\nkey = \"{d}/other.key\"\n"
    ));
    assert!(
        e.contains("listener[0].tls.key") && e.contains("does not belong"),
        "{e}"
    );
    let e = check(&format!(
        "[listener.tls]\ncert = \"{cert}\"\nkey = \"{cert}\"\n"
    ));
    assert!(
        e.contains("listener[0].tls.key") && e.contains("private key"),
        "{e}"
    );
    let e = check(&format!(
        "[listener.upstream_tls]\nca = \"{d}/ca.pem\"\ncert = \"{cert}\"\n"
    ));
    assert!(e.contains("listener[0].upstream_tls.key"), "{e}");
    let e = check(&format!(
        "[listener.tls]\ncert = \"{cert}\"\nkey = \"{key}\"\nhandshake_timeout_ms = 0\n"
    ));
    assert!(e.contains("listener[0].tls.handshake_timeout_ms"), "{e}");
}

/// The relay writes each frame with `write_all` and does not flush (plain
/// TCP needs none): a TLS transport must not keep the tail of a frame in its
/// buffer once the write has returned, or the peer waits for it forever.
/// Small socket buffers make the socket full while rustls still holds
/// ciphertext when the last write returns.
#[tokio::test]
async fn a_written_frame_reaches_the_peer_without_a_flush() {
    let b = bed(false, 5_000);
    let tls = ServerTls::new(&b.server, "t").unwrap();
    let listen = tokio::net::TcpSocket::new_v4().unwrap();
    listen.set_send_buffer_size(4096).unwrap();
    listen.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let socket = listen.listen(8).unwrap();
    let addr = socket.local_addr().unwrap();
    const SIZE: usize = 48 << 10;
    tokio::spawn(async move {
        let (tcp, _) = socket.accept().await.unwrap();
        let mut t = tls.accept(tcp).await.unwrap();
        t.write_all(&vec![7u8; SIZE]).await.unwrap();
        // No flush: wait for the peer's answer, as the relay waits for the next request.
        let mut one = [0u8; 1];
        let _ = t.read(&mut one).await;
    });
    let client = ClientTls::new(&b.client(None, None), "test client").unwrap();
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let tcp = sock.connect(addr).await.unwrap();
    let mut c = client.connect(tcp, "127.0.0.1").await.unwrap();
    let mut got = vec![0u8; SIZE];
    tokio::time::timeout(std::time::Duration::from_secs(10), c.read_exact(&mut got))
        .await
        .expect("the whole frame arrives without the writer flushing")
        .unwrap();
    assert!(got.iter().all(|&x| x == 7));
}
