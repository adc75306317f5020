//! The mirrorguard configuration shipped in deploy/kubernetes/ is one
//! mirrorguard accepts: the multi-broker StatefulSet's template, rendered
//! for each pod the way its init container does (`@POD_NAME@` replaced by
//! the pod name), parses and validates, and gives every pod a distinct
//! `[state] instance_id` and its own guard address, with one shared state
//! topic and the broker's fetcher on its own sidecar.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use mirrorguard::config::Config;

const MANIFEST: &str = "deploy/kubernetes/statefulset-multi-broker.yaml";
const TOKEN_PATH: &str = "/etc/mirrorguard/token/admin.token";

/// The YAML block scalar under `key: |` (its lines, indentation removed).
fn block_scalar(yaml: &str, key: &str) -> String {
    let mut lines = yaml.lines().skip_while(|l| l.trim() != format!("{key}: |"));
    let header = lines
        .next()
        .unwrap_or_else(|| panic!("no `{key}: |` block"));
    let header_indent = header.len() - header.trim_start().len();
    let mut indent = None;
    let mut out = String::new();
    for l in lines {
        if l.trim().is_empty() {
            out.push('\n');
            continue;
        }
        let this = l.len() - l.trim_start().len();
        if this <= header_indent {
            break;
        }
        let i = *indent.get_or_insert(this);
        out.push_str(&l[i..]);
        out.push('\n');
    }
    out
}

/// A token mirrorguard accepts (32 bytes or more, no placeholder).
const TEST_TOKEN: &str = "3b8f0c2e9d4a71f65e0b9c8d7a6f5e4d\n";

/// Writes a secret file readable by its owner only (mirrorguard refuses others).
fn write_secret(dir: &Path, name: &str, contents: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// The admin listener of a shipped configuration: on loopback, with the
/// probes' and Prometheus' metrics listener on the pod's address.
fn assert_admin_on_loopback(cfg: &Config) {
    let admin: std::net::SocketAddr = cfg.admin.listen.parse().unwrap();
    assert!(admin.ip().is_loopback(), "{}", cfg.admin.listen);
    assert!(cfg.admin.token_file.is_some());
    assert_eq!(cfg.admin.metrics_listen.as_deref(), Some("0.0.0.0:9645"));
}

#[test]
fn sidecar_config_parses_with_the_admin_api_on_loopback() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let manifest = "deploy/kubernetes/sidecar.yaml";
    let yaml = std::fs::read_to_string(root.join(manifest)).unwrap();
    let mut text = block_scalar(&yaml, "proxy.toml");
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["kafka-dr-0.kafka-dr".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let cert_path = write_secret(dir.path(), "tls.crt", &cert.pem());
    let key_path = write_secret(dir.path(), "tls.key", &key.serialize_pem());
    for (shipped, test) in [
        (
            TOKEN_PATH,
            write_secret(dir.path(), "admin.token", TEST_TOKEN),
        ),
        ("/etc/mirrorguard/tls/tls.crt", cert_path.clone()),
        ("/etc/mirrorguard/tls/tls.key", key_path.clone()),
        ("/etc/mirrorguard/source-tls/ca.crt", cert_path.clone()),
        ("/etc/mirrorguard/source-tls/tls.crt", cert_path),
        ("/etc/mirrorguard/source-tls/tls.key", key_path),
    ] {
        assert!(text.contains(shipped), "{shipped} not in {manifest}");
        text = text.replace(shipped, test.to_str().unwrap());
    }
    let cfg = Config::parse(&text, Path::new(manifest)).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_admin_on_loopback(&cfg);
    assert_eq!(cfg.guards.len(), 1);
    assert_eq!(cfg.mirrors.len(), 1);
}

/// `replicas: N` of the StatefulSet.
fn replicas(yaml: &str) -> usize {
    yaml.lines()
        .find_map(|l| l.trim().strip_prefix("replicas: "))
        .expect("replicas")
        .parse()
        .expect("replicas is a number")
}

#[test]
fn multi_broker_statefulset_config_renders_to_one_valid_config_per_pod() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let yaml = std::fs::read_to_string(root.join(MANIFEST)).unwrap();
    let template = block_scalar(&yaml, "proxy.toml.template");
    assert!(template.contains("@POD_NAME@"), "{template}");
    assert!(template.contains(TOKEN_PATH), "{template}");
    let dir = tempfile::tempdir().unwrap();
    let token = write_secret(dir.path(), "admin.token", TEST_TOKEN);

    let pods = replicas(&yaml);
    assert!(pods >= 2, "a multi-broker example");
    let (mut ids, mut guards, mut topics) = (HashSet::new(), HashSet::new(), HashSet::new());
    for ordinal in 0..pods {
        let pod = format!("kafka-dr-{ordinal}");
        // What the init container's sed does, plus the token at a test path.
        let text = template
            .replace("@POD_NAME@", &pod)
            .replace(TOKEN_PATH, token.to_str().unwrap());
        let cfg = Config::parse(&text, Path::new(MANIFEST))
            .unwrap_or_else(|e| panic!("{pod}: {e}\n{text}"));
        assert_admin_on_loopback(&cfg);
        let state = cfg.state.as_ref().expect("[state]");
        let id = state.instance_id(&cfg.admin.listen);
        assert_eq!(id, pod, "instance id from the pod name");
        ids.insert(id);
        topics.insert(state.topic.clone());
        guards.extend(cfg.guards.iter().map(|g| g.advertised_host.clone()));
        assert_eq!(cfg.mirrors.len(), 1);
        assert_eq!(
            cfg.mirrors[0].fetcher_bootstrap.as_deref(),
            Some("127.0.0.1:19192"),
            "the local broker's fetcher uses its own sidecar"
        );
    }
    assert_eq!(ids.len(), pods, "distinct instance ids: {ids:?}");
    assert_eq!(guards.len(), pods, "one guard address per pod: {guards:?}");
    assert_eq!(topics.len(), 1, "one shared __mirror_state: {topics:?}");
}
