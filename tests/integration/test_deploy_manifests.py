"""The deploy/ manifests are valid for the tools that read them.

- deploy/prometheus/alerts.yml: `promtool check rules`;
- deploy/prometheus/scrape.yml: `promtool check config` on a Prometheus
  configuration made of its scrape jobs plus alerts.yml as a rule file (the
  way deploy/README.md tells operators to combine them);
- deploy/kubernetes/*.yaml: `kubernetes-validate --strict` against the API
  schemas bundled in its pinned wheel (unknown fields are errors; nothing is
  fetched at test time), the multi-broker StatefulSet among them (its
  mirrorguard config is parsed per pod by tests/deploy_config.rs);
- the multi-instance alerts: `promtool test rules` on made-up series (they
  fire on lasting churn, not on a single restart);
- deploy/grafana/mirrorguard.json: every panel query parses (as a promtool
  recording rule).

Each check is also run on a broken copy made here, so a check that accepts
anything fails the test. promtool and kubernetes-validate are installed
(pinned) by scripts/install-test-deps.sh; no broker is started.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROMTOOL = ROOT / ".tools" / "bin" / "promtool"
KUBE_VALIDATE = ROOT / ".tools" / "deploycheck" / "bin" / "kubernetes-validate"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
SCRAPE = DEPLOY / "prometheus" / "scrape.yml"
KUBE_MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
DASHBOARD = DEPLOY / "grafana" / "mirrorguard.json"


def run(argv: list) -> subprocess.CompletedProcess:
    for tool in (PROMTOOL, KUBE_VALIDATE):
        if str(argv[0]) == str(tool):
            assert tool.is_file(), f"{tool} missing: run scripts/install-test-deps.sh"
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=60)


def check_rules(path: Path) -> subprocess.CompletedProcess:
    return run([PROMTOOL, "check", "rules", path])


def check_config(scrape: Path, rules: Path, work: Path) -> subprocess.CompletedProcess:
    # scrape.yml is a fragment (`scrape_configs:`); a whole configuration
    # adds the global section and the rule file next to it.
    config = work / "prometheus.yml"
    config.write_text("global:\n  evaluation_interval: 30s\n"
                      f"rule_files:\n  - {rules}\n" + scrape.read_text())
    return run([PROMTOOL, "check", "config", config])


def check_kube(path: Path) -> subprocess.CompletedProcess:
    # Through the venv's own python: the script's shebang names the path the
    # venv was created at, which a shared .tools reached through a symlink
    # from another checkout does not have.
    assert KUBE_VALIDATE.is_file(), f"{KUBE_VALIDATE} missing: run scripts/install-test-deps.sh"
    return run([KUBE_VALIDATE.parent / "python", KUBE_VALIDATE, "--strict", path])


def explain(r: subprocess.CompletedProcess) -> str:
    return f"exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"


def test_alert_rules_pass_promtool():
    r = check_rules(ALERTS)
    assert r.returncode == 0, explain(r)
    assert "SUCCESS" in r.stdout, explain(r)


def test_scrape_config_with_the_alert_rules_passes_promtool(tmp_path):
    r = check_config(SCRAPE, ALERTS, tmp_path)
    assert r.returncode == 0, explain(r)


@pytest.mark.parametrize("manifest", KUBE_MANIFESTS, ids=lambda p: p.name)
def test_kubernetes_manifests_match_the_api_schemas(manifest):
    r = check_kube(manifest)
    assert r.returncode == 0, explain(r)
    assert "passed" in r.stdout + r.stderr, explain(r)


def broken(tmp_path: Path, src: Path, old: str, new: str) -> Path:
    """A copy of `src` with the first `old` replaced by `new`."""
    text = src.read_text()
    assert old in text, f"{src} no longer holds {old!r}: pick another mutation"
    out = tmp_path / src.name
    out.write_text(text.replace(old, new, 1))
    return out


def test_a_broken_alert_expression_is_refused(tmp_path):
    bad = broken(tmp_path, ALERTS, "expr: increase(", "expr: increase((")
    r = check_rules(bad)
    assert r.returncode != 0, explain(r)


def test_a_broken_scrape_interval_is_refused(tmp_path):
    bad = broken(tmp_path, SCRAPE, "scrape_interval: 15s", "scrape_interval: 15 parsecs")
    r = check_config(bad, ALERTS, tmp_path)
    assert r.returncode != 0, explain(r)


def test_a_broken_rule_file_fails_the_config_check(tmp_path):
    bad = broken(tmp_path, ALERTS, "expr: increase(", "expr: increase((")
    r = check_config(SCRAPE, bad, tmp_path)
    assert r.returncode != 0, explain(r)


@pytest.mark.parametrize("name,old,new", [
    ("sidecar.yaml", "replicas: 1", "replicas: one"),  # wrong type
    ("sidecar.yaml", "serviceName: kafka-dr", "serviceNme: kafka-dr"),  # unknown field (strict)
    ("statefulset-multi-broker.yaml", "replicas: 3", "replicas: three"),
    ("statefulset-multi-broker.yaml", "fieldPath: metadata.name", "fieldPth: metadata.name"),
    ("statefulset-multi-broker.yaml", "initContainers:", "initContainer:"),
], ids=["wrong-type", "unknown-field", "multi-wrong-type", "multi-downward-api-field",
        "multi-init-containers"])
def test_a_broken_kubernetes_manifest_is_refused(tmp_path, name, old, new):
    bad = broken(tmp_path, DEPLOY / "kubernetes" / name, old, new)
    r = check_kube(bad)
    assert r.returncode != 0, explain(r)


def test_the_multi_broker_example_is_checked():
    assert "statefulset-multi-broker.yaml" in [p.name for p in KUBE_MANIFESTS]


# The multi-instance alerts (one mirrorguard per destination broker), run by
# `promtool test rules` on made-up series: each fires on the churn it is
# for and stays quiet on what a rolling restart or a healthy instance does.
MULTI_INSTANCE_RULE_TESTS = """
rule_files: [{alerts}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # mg-a and mg-b take partitions of mirror m from each other all the time.
      - series: 'mirrorguard_mirror_events_total{{job="mirrorguard",instance="mg-a",mirror="m",kind="take_over"}}'
        values: '0+1x60'
      - series: 'mirrorguard_mirror_events_total{{job="mirrorguard",instance="mg-a",mirror="m",kind="stale_dropped"}}'
        values: '0+1x60'
      # mg-c was restarted once: it took its partitions over, nothing since.
      - series: 'mirrorguard_mirror_events_total{{job="mirrorguard",instance="mg-c",mirror="n",kind="take_over"}}'
        values: '0 40x60'
      - series: 'mirrorguard_mirror_events_total{{job="mirrorguard",instance="mg-c",mirror="n",kind="stale_dropped"}}'
        values: '0 5x60'
      # mg-a cannot read __mirror_state while serving 3 partitions; mg-c can.
      - series: 'mirrorguard_partitions_served{{job="mirrorguard",instance="mg-a",mirror="m"}}'
        values: '3x60'
      - series: 'mirrorguard_state_store_ops_total{{job="mirrorguard",instance="mg-a",listener="__mirror_state",kind="tail_error"}}'
        values: '0+1x60'
      - series: 'mirrorguard_partitions_served{{job="mirrorguard",instance="mg-c",mirror="n"}}'
        values: '2x60'
      - series: 'mirrorguard_state_store_ops_total{{job="mirrorguard",instance="mg-c",listener="__mirror_state",kind="tail_error"}}'
        values: '0x60'
    alert_rule_test:
      - eval_time: 10m
        alertname: MirrorguardTakeOverPingPong
        exp_alerts: []
      - eval_time: 40m
        alertname: MirrorguardTakeOverPingPong
        exp_alerts:
          - exp_labels: {{severity: warning, job: mirrorguard, instance: mg-a, mirror: m}}
            exp_annotations:
              summary: "mg-a keeps taking partitions of mirror m over and losing them again"
              description: "Two destination fetchers fetch the same partitions (a former leader's fetcher still running?) or leadership keeps moving. Each take-over reads __mirror_state and replays from the source; GET /v1/partitions shows served_by."
      - eval_time: 20m
        alertname: MirrorguardTakeOversFlapping
        exp_alerts: []
      - eval_time: 45m
        alertname: MirrorguardTakeOversFlapping
        exp_alerts:
          - exp_labels: {{severity: info, mirror: m}}
            exp_annotations:
              summary: "Partitions of mirror m have kept moving between instances for 30 minutes (destination leadership is not settling)"
      - eval_time: 1m
        alertname: MirrorguardServingWithStaleState
        exp_alerts: []
      - eval_time: 10m
        alertname: MirrorguardServingWithStaleState
        exp_alerts:
          - exp_labels: {{severity: critical, job: mirrorguard, instance: mg-a}}
            exp_annotations:
              summary: "mg-a serves 3 partition(s) but cannot read __mirror_state"
              description: "It cannot see another instance taking its partitions over, so its producer state of them may be stale (a fetch past its state still makes it re-read __mirror_state first, and fails while it cannot). Check the state cluster and this instance's access to it."
"""


def rule_test(tmp_path, tests: str, alerts: Path):
    """`promtool test rules` of the rule tests `tests` against the alert rules `alerts`."""
    f = tmp_path / "rule_test.yml"
    f.write_text(tests.format(alerts=alerts))
    return run([PROMTOOL, "test", "rules", f])


def test_multi_instance_alerts_fire_on_churn_only(tmp_path):
    r = rule_test(tmp_path, MULTI_INSTANCE_RULE_TESTS, ALERTS)
    assert r.returncode == 0, explain(r)
    assert "SUCCESS" in r.stdout + r.stderr, explain(r)


def test_a_multi_instance_alert_that_never_fires_fails_its_rule_test(tmp_path):
    # The ping-pong rule made to look for a kind that is never counted: the
    # rule test above must then fail (it checks what fires, not only syntax).
    bad = broken(tmp_path, ALERTS,
                 'increase(mirrorguard_mirror_events_total{kind="take_over"}[10m])) > 0',
                 'increase(mirrorguard_mirror_events_total{kind="no_such_kind"}[10m])) > 0')
    r = rule_test(tmp_path, MULTI_INSTANCE_RULE_TESTS, bad)
    assert r.returncode != 0, explain(r)


# The seal alerts: one for a seal that waits on the destination's high
# watermark for too long, one for a seal planned with open transactions
# possibly unknown; quiet for a seal that waits a few minutes.
SEAL_RULE_TESTS = """
rule_files: [{alerts}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # mg-a: one seal of mirror m waits on the destination for an hour.
      - series: 'mirrorguard_seals_awaiting_destination_hw{{job="mirrorguard",instance="mg-a",mirror="m"}}'
        values: '1x60'
      # mg-b: a seal of mirror n waits 3 minutes, then completes.
      - series: 'mirrorguard_seals_awaiting_destination_hw{{job="mirrorguard",instance="mg-b",mirror="n"}}'
        values: '1 1 1 0x57'
      # mg-b planned one seal without every closing past its cut, at minute 20.
      - series: 'mirrorguard_seal_events_total{{job="mirrorguard",instance="mg-b",mirror="n",kind="open_at_cut_incomplete"}}'
        values: '0x20 1x40'
      - series: 'mirrorguard_seal_events_total{{job="mirrorguard",instance="mg-a",mirror="m",kind="seal_completed"}}'
        values: '0 1x59'
      # mg-b refused the fetch of an ended episode 3 times at minute 30.
      - series: 'mirrorguard_seal_events_total{{job="mirrorguard",instance="mg-b",mirror="n",kind="fetch_refused"}}'
        values: '0x30 3x30'
      # mg-a saw its source truncate a partition at minute 40; its streamed responses never alert.
      - series: 'mirrorguard_mirror_events_total{{job="mirrorguard",instance="mg-a",mirror="m",kind="source_truncated"}}'
        values: '0x40 1x20'
      - series: 'mirrorguard_mirror_events_total{{job="mirrorguard",instance="mg-a",mirror="m",kind="response_streamed"}}'
        values: '0+5x60'
      # mg-b held one streamed response long by its waits at minute 50.
      - series: 'mirrorguard_mirror_events_total{{job="mirrorguard",instance="mg-b",mirror="n",kind="response_held_long"}}'
        values: '0x50 1x10'
    alert_rule_test:
      - eval_time: 5m
        alertname: MirrorguardSealAwaitingDestinationHw
        exp_alerts: []
      - eval_time: 15m
        alertname: MirrorguardSealAwaitingDestinationHw
        exp_alerts:
          - exp_labels: {{severity: warning, job: mirrorguard, instance: mg-a, mirror: m}}
            exp_annotations:
              summary: "1 seal(s) of mirror m on mg-a served whole but waiting 10 minutes for the destination's high watermark"
              description: "The destination fetcher appended the seal, but the destination has not replicated it (an under-replicated partition, a follower down) or its high watermark cannot be read (seal_events_total{{kind=\\"destination_hw_read_error\\"}}). The partition stays STOPPING until the high watermark passes the seal's end; GET /v1/partitions shows destination_hw."
      - eval_time: 10m
        alertname: MirrorguardSealMayMissOpenTransactions
        exp_alerts: []
      - eval_time: 25m
        alertname: MirrorguardSealMayMissOpenTransactions
        exp_alerts:
          - exp_labels: {{severity: warning, job: mirrorguard, instance: mg-b, mirror: n, kind: open_at_cut_incomplete}}
            exp_annotations:
              summary: "A seal of mirror n was planned without knowing every transaction open at its cut"
              description: "Transaction closings past the cut were no longer known, or more than 4,096 producers may have begun a transaction in offsets a restart without the source could not replay (see the WARN line naming the partition), so a transaction may be left open on the destination. After promotion run `mirrorguard ctl abort-open` for that partition."
      # The fetch of an ended episode refused (minute 30): fires; a seal completing never does.
      - eval_time: 20m
        alertname: MirrorguardFetchRefused
        exp_alerts: []
      - eval_time: 35m
        alertname: MirrorguardFetchRefused
        exp_alerts:
          - exp_labels: {{severity: warning, job: mirrorguard, instance: mg-b, mirror: n, kind: fetch_refused}}
            exp_annotations:
              summary: "Mirror n refuses its destination fetcher a partition (POLICY_VIOLATION)"
              description: "A STOPPED partition is fetched past its seal (the destination mirrors it again after a failback) or another mirror holds it; the WARN line names the partition. To mirror it again run `mirrorguard ctl protect` (POST /v1/partitions/protect): a new episode starts at the fetcher's next fetch."
      - eval_time: 55m
        alertname: MirrorguardFetchRefused
        exp_alerts: []
      - eval_time: 45m
        alertname: MirrorguardResponsesHeldLong
        exp_alerts: []
      - eval_time: 55m
        alertname: MirrorguardResponsesHeldLong
        exp_alerts:
          - exp_labels: {{severity: warning, job: mirrorguard, instance: mg-b, mirror: n, kind: response_held_long}}
            exp_annotations:
              summary: "Mirror n held a streamed Fetch response 10 s or more by its waits"
              description: "Taking many partitions over, replaying them or persisting many new producers' claims, one after another, held a response to the destination fetcher (the WARN line gives the waits and the time); past the fetcher's request timeout (30 s by default) the fetcher gives up and fetches again. Check the state cluster's latency from this instance, and whether many partitions moved to it at once."
      - eval_time: 35m
        alertname: MirrorguardSourceTruncated
        exp_alerts: []
      - eval_time: 45m
        alertname: MirrorguardSourceTruncated
        exp_alerts:
          - exp_labels: {{severity: warning, job: mirrorguard, instance: mg-a, mirror: m, kind: source_truncated}}
            exp_annotations:
              summary: "The source of mirror m truncated a partition's log below what was mirrored"
              description: "An unclean leader election or a lost tail on the source: records the destination fetcher had appended are gone from the source and new records took their offsets (the WARN line names the partition). mirrorguard's state for it started over and is replayed from the source; the destination fetcher truncated its log too. Check the source's unclean.leader.election.enable and the records lost there."
"""


def test_seal_alerts_fire_on_a_stuck_or_incomplete_seal_only(tmp_path):
    r = rule_test(tmp_path, SEAL_RULE_TESTS, ALERTS)
    assert r.returncode == 0, explain(r)
    assert "SUCCESS" in r.stdout + r.stderr, explain(r)


def test_a_seal_alert_on_the_wrong_event_fails_its_rule_test(tmp_path):
    for kind in ("open_at_cut_incomplete", "fetch_refused", "source_truncated"):
        bad = broken(tmp_path, ALERTS, f'kind="{kind}"', 'kind="response_streamed"'
                     if kind == "source_truncated" else 'kind="seal_completed"')
        r = rule_test(tmp_path, SEAL_RULE_TESTS, bad)
        assert r.returncode != 0, (kind, explain(r))


def dashboard_rules(dashboard: Path, work: Path) -> Path:
    """The dashboard's queries as recording rules, so promtool parses each one."""
    panels = json.loads(dashboard.read_text())["panels"]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    assert exprs, "a dashboard without queries"
    rules = work / "dashboard_rules.yml"
    rules.write_text("groups:\n  - name: dashboard\n    rules:\n" + "".join(
        f"      - record: dashboard:query{i}\n        expr: {json.dumps(e)}\n"
        for i, e in enumerate(exprs)))
    return rules


def test_dashboard_queries_parse(tmp_path):
    r = check_rules(dashboard_rules(DASHBOARD, tmp_path))
    assert r.returncode == 0, explain(r)
    assert "SUCCESS" in r.stdout, explain(r)
    names = DASHBOARD.read_text()
    for metric in ("mirrorguard_partitions_served", "take_over|stale_dropped"):
        assert metric in names, metric


def test_a_broken_dashboard_query_is_refused(tmp_path):
    bad = broken(tmp_path, DASHBOARD, "sum by (instance,mirror) (", "sum by (instance,mirror) ((")
    r = check_rules(dashboard_rules(bad, tmp_path))
    assert r.returncode != 0, explain(r)


# --------------------------------------------------------------------------------------
# Secure as shipped (issue 30, SPEC section 5 "Least privilege on every listener"): the
# admin API on loopback (or TLS) and behind no Service, no Secret value in the files,
# every container non-root with a read-only root file system, no privilege escalation,
# no capabilities and the runtime's seccomp profile, a NetworkPolicy in front of every
# pod, and no port next to the produce guard that lets producers reach the broker
# around it. checkov (policy), hadolint (the container image) and systemd-analyze (the
# unit) check the same from outside; each is also shown a broken copy.

import ipaddress  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import tomllib  # noqa: E402

CHECKOV = ROOT / ".tools" / "checkov" / "bin" / "checkov"
HADOLINT = ROOT / ".tools" / "lint" / "bin" / "hadolint"
DOCKERFILE = ROOT / "Dockerfile"
SYSTEMD_UNIT = DEPLOY / "systemd" / "mirrorguard.service"
YAML_PYTHON = KUBE_VALIDATE.parent / "python"  # PyYAML comes with kubernetes-validate


def load_yaml(path: Path) -> list[dict]:
    """Every document of a YAML file (through the deploycheck venv, which has PyYAML)."""
    assert YAML_PYTHON.is_file(), f"{YAML_PYTHON} missing: run scripts/install-test-deps.sh"
    r = subprocess.run([str(YAML_PYTHON), "-c",
                        "import json, sys, yaml; "
                        "print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d]))",
                        str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, explain(r)
    return json.loads(r.stdout)


def all_docs() -> list[tuple[str, dict]]:
    return [(p.name, d) for p in KUBE_MANIFESTS for d in load_yaml(p)]


def pod_templates(docs) -> list[tuple[str, dict, dict]]:
    """(workload name, pod template metadata, pod spec) of every workload."""
    out = []
    for _, d in docs:
        if d["kind"] in ("StatefulSet", "Deployment", "DaemonSet", "ReplicaSet", "Job"):
            t = d["spec"]["template"]
            out.append((d["metadata"]["name"], t.get("metadata", {}), t["spec"]))
        elif d["kind"] == "Pod":
            out.append((d["metadata"]["name"], d["metadata"], d["spec"]))
    return out


def shipped_configs(docs) -> list[tuple[str, dict]]:
    """The mirrorguard configurations the ConfigMaps hold, parsed (templates included:
    `@POD_NAME@` sits inside TOML strings)."""
    out = []
    for file, d in docs:
        if d["kind"] == "ConfigMap":
            for key, text in d.get("data", {}).items():
                if key.startswith("proxy.toml"):
                    out.append((f"{file}:{d['metadata']['name']}/{key}", tomllib.loads(text)))
    assert out, "no mirrorguard configuration in deploy/kubernetes"
    return out


def port_of(addr: str) -> int:
    return int(addr.rsplit(":", 1)[1])


def is_loopback(addr: str) -> bool:
    host = addr.rsplit(":", 1)[0].strip("[]")
    return ipaddress.ip_address(host).is_loopback


def test_the_admin_api_is_on_loopback_or_tls_in_every_shipped_config():
    for name, cfg in shipped_configs(all_docs()):
        admin = cfg["admin"]
        assert is_loopback(admin["listen"]) or "tls" in admin, (
            f"{name}: [admin] listen = {admin['listen']!r} without [admin.tls]")


def test_no_service_and_no_host_port_exposes_the_admin_api():
    docs = all_docs()
    admin_ports = {port_of(cfg["admin"]["listen"]) for _, cfg in shipped_configs(docs)}
    for file, d in docs:
        if d["kind"] == "Service":
            for p in d["spec"].get("ports", []):
                assert p["port"] not in admin_ports and p.get("targetPort") not in admin_ports | {"admin"}, (
                    f"{file}: Service {d['metadata']['name']} exposes the admin API: {p}")
    for name, _, spec in pod_templates(docs):
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            for p in c.get("ports", []):
                assert "hostPort" not in p, f"{name}/{c['name']}: hostPort {p}"
                assert p["containerPort"] not in admin_ports, f"{name}/{c['name']} declares the admin port {p}"


def test_no_secret_value_is_shipped():
    for file, d in all_docs():
        if d["kind"] == "Secret":
            assert not d.get("data") and not d.get("stringData"), (
                f"{file}: Secret {d['metadata']['name']} ships a value; the README shows how to "
                "create it (openssl rand -hex 32)")
    for p in KUBE_MANIFESTS:
        assert "change-me" not in p.read_text().lower(), p


RESTRICTED = "runAsNonRoot, readOnlyRootFilesystem, allowPrivilegeEscalation: false, drop ALL, RuntimeDefault"


def test_every_container_runs_restricted():
    pods = pod_templates(all_docs())
    assert pods
    for name, _, spec in pods:
        pod_sc = spec.get("securityContext", {})
        assert spec.get("automountServiceAccountToken") is False, f"{name}: the API token is mounted"
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC"), name
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            sc = c.get("securityContext", {})
            where = f"{name}/{c['name']} ({RESTRICTED})"
            assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, where
            assert sc.get("runAsUser", pod_sc.get("runAsUser", 1)) != 0, where
            assert sc.get("readOnlyRootFilesystem") is True, where
            assert sc.get("allowPrivilegeEscalation") is False, where
            assert sc.get("privileged", False) is False, where
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], where
            assert not sc.get("capabilities", {}).get("add"), where
            seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {}))
            assert seccomp.get("type") == "RuntimeDefault", where


def policies_for(docs, labels: dict) -> list[dict]:
    return [d for _, d in docs if d["kind"] == "NetworkPolicy"
            and d["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()]


def test_every_pod_is_behind_a_network_policy():
    docs = all_docs()
    for name, meta, _ in pod_templates(docs):
        policies = policies_for(docs, meta.get("labels", {}))
        assert any("Ingress" in p["spec"].get("policyTypes", []) for p in policies), (
            f"{name}: no NetworkPolicy restricts ingress to its pods")


def admitted(rule: dict, port: int, names: dict) -> bool:
    """Whether an ingress rule admits `port` (named ports resolved with `names`)."""
    ports = rule.get("ports")
    if not ports:
        return True
    return any(p.get("port") in (port, names.get(port)) for p in ports)


def test_no_port_lets_producers_around_the_produce_guard():
    """The broker's port (the guard's upstream) is reachable only from the broker pods
    themselves (inter-broker traffic, the sidecars' own connections); the guard's port
    from clients. No Service names the broker's port."""
    docs = all_docs()
    configs = shipped_configs(docs)
    broker_ports = {port_of(u) for _, cfg in configs for g in cfg.get("guard", [])
                    for u in g["upstream_bootstrap"]}
    guard_ports = {port_of(g["bootstrap"]) for _, cfg in configs for g in cfg.get("guard", [])}
    assert broker_ports and guard_ports
    for file, d in docs:
        if d["kind"] == "Service":
            for p in d["spec"].get("ports", []):
                assert p["port"] not in broker_ports and p.get("targetPort") not in broker_ports, (
                    f"{file}: Service {d['metadata']['name']} exposes the broker port next to the guard: {p}")
    for name, meta, spec in pod_templates(docs):
        labels = meta.get("labels", {})
        names = {p["containerPort"]: p.get("name") for c in spec["containers"] for p in c.get("ports", [])}
        rules = [r for p in policies_for(docs, labels) for r in p["spec"].get("ingress", [])]
        for port in broker_ports:
            for r in (r for r in rules if admitted(r, port, names)):
                peers = r.get("from")
                assert peers, f"{name}: an ingress rule admits broker port {port} from anywhere: {r}"
                for peer in peers:
                    assert "namespaceSelector" not in peer and "ipBlock" not in peer, (name, r)
                    sel = peer.get("podSelector", {}).get("matchLabels", {})
                    assert sel and sel.items() <= labels.items(), (
                        f"{name}: broker port {port} admitted from pods other than the brokers': {r}")
        for port in guard_ports:
            assert any(admitted(r, port, names) for r in rules), f"{name}: the guard port {port} is closed"


def checkov(*files: Path) -> subprocess.CompletedProcess:
    """checkov's Kubernetes and Dockerfile policies over `files` (nothing is downloaded:
    --skip-download; a check skipped is skipped in the file, with its reason)."""
    assert CHECKOV.is_file(), f"{CHECKOV} missing: run scripts/install-test-deps.sh"
    argv = [CHECKOV.parent / "python", CHECKOV, "--quiet", "--compact", "--skip-download",
            "--framework", "kubernetes", "dockerfile"]
    for f in files:
        argv += ["-f", f]
    return run(argv)


def test_checkov_passes_the_manifests_and_the_dockerfile():
    r = checkov(*KUBE_MANIFESTS, DOCKERFILE)
    assert r.returncode == 0, explain(r)
    for framework in ("kubernetes", "dockerfile"):
        assert f"{framework} scan results" in r.stdout, explain(r)
    assert "Failed checks: 0" in r.stdout, explain(r)


def test_checkov_refuses_a_writable_root_file_system(tmp_path):
    bad = broken(tmp_path, DEPLOY / "kubernetes" / "sidecar.yaml",
                 "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false")
    r = checkov(bad)
    assert r.returncode != 0 and "CKV_K8S_22" in r.stdout, explain(r)


def hadolint(path: Path) -> subprocess.CompletedProcess:
    assert HADOLINT.is_file(), f"{HADOLINT} missing: run scripts/install-test-deps.sh"
    return run([HADOLINT, "--no-color", path])


def test_the_container_image_passes_hadolint():
    r = hadolint(DOCKERFILE)
    assert r.returncode == 0, explain(r)


def test_hadolint_refuses_an_unpinned_package(tmp_path):
    text = DOCKERFILE.read_text()
    first_run = text.index("\nRUN ")
    bad = tmp_path / "Dockerfile"
    bad.write_text(text[:first_run] + "\nRUN apt-get update && apt-get install -y curl" + text[first_run:])
    r = hadolint(bad)
    assert r.returncode != 0 and "DL3008" in r.stdout, explain(r)


def test_the_container_image_is_multi_stage_minimal_and_non_root():
    lines = [ln.strip() for ln in DOCKERFILE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    froms = [ln for ln in lines if ln.upper().startswith("FROM ")]
    assert len(froms) >= 2, "build and runtime stages"
    final = lines[lines.index(froms[-1]):]
    assert "distroless" in froms[-1] or "scratch" in froms[-1], froms[-1]
    users = [ln.split()[1] for ln in final if ln.upper().startswith("USER ")]
    assert users and users[-1].split(":")[0].isdigit() and int(users[-1].split(":")[0]) >= 10000, users
    assert not any(ln.upper().startswith("ADD ") for ln in lines), "COPY, not ADD"
    dockerignore = (ROOT / ".dockerignore").read_text().split()
    for must in ("target", ".tools", ".git"):
        assert must in dockerignore or f"/{must}" in dockerignore, must


def unit_directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for ln in text.splitlines():
        ln = ln.strip()
        if ln and not ln.startswith(("#", ";", "[")) and "=" in ln:
            k, v = ln.split("=", 1)
            out.setdefault(k.strip(), []).append(v.strip())
    return out


HARDENING = {
    "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
    "PrivateDevices": "yes", "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes", "ProtectControlGroups": "yes", "ProtectClock": "yes",
    "ProtectHostname": "yes", "ProtectProc": "invisible", "ProcSubset": "pid", "UMask": "0077",
    "RestrictNamespaces": "yes", "RestrictRealtime": "yes", "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes", "MemoryDenyWriteExecute": "yes", "SystemCallArchitectures": "native",
    "CapabilityBoundingSet": "", "AmbientCapabilities": "", "PrivateUsers": "yes",
    "RemoveIPC": "yes", "KeyringMode": "private",
}


def test_the_systemd_unit_is_hardened():
    d = unit_directives(SYSTEMD_UNIT.read_text())
    truthy = {"yes": {"yes", "true", "1", "on"}}
    for key, want in HARDENING.items():
        assert key in d, f"{key}= missing"
        assert d[key][-1].lower() in truthy.get(want, {want}), f"{key}={d[key][-1]} (want {want})"
    assert d["RestrictAddressFamilies"][-1].split() == ["AF_INET", "AF_INET6", "AF_UNIX"], d["RestrictAddressFamilies"]
    assert "@system-service" in d["SystemCallFilter"][0], d["SystemCallFilter"]
    assert any(v.startswith("~@privileged") for v in d["SystemCallFilter"]), d["SystemCallFilter"]
    assert any(v.startswith("admin.token:") for v in d["LoadCredential"]), "the token through LoadCredential"
    assert d["User"][-1] not in ("root", "0"), d["User"]


def systemd_analyze(*args) -> subprocess.CompletedProcess:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (test_the_systemd_unit_is_hardened checks the directives)")
    return run([tool, *args])


def unit_for_verify(tmp_path: Path, text: str) -> Path:
    # verify checks that ExecStart names an executable: point it at this build's binary.
    binary = ROOT / "target" / "debug" / "mirrorguard"
    if not binary.is_file():
        binary = Path("/bin/true")
    unit = tmp_path / "mirrorguard.service"
    unit.write_text(text.replace("/usr/local/bin/mirrorguard", str(binary)))
    return unit


def test_systemd_analyze_verifies_the_unit(tmp_path):
    r = systemd_analyze("verify", "--man=no", unit_for_verify(tmp_path, SYSTEMD_UNIT.read_text()))
    assert r.returncode == 0 and not r.stderr.strip(), explain(r)


def test_systemd_analyze_rates_the_unit_ok(tmp_path):
    # The exposure score systemd-analyze gives (0 = locked down, 10 = unprotected): at most
    # 2.0, "OK". The unit before issue 30 scored 6.0 ("MEDIUM").
    unit = unit_for_verify(tmp_path, SYSTEMD_UNIT.read_text())
    r = systemd_analyze("security", "--offline=true", "--threshold=20", "--no-pager", unit)
    assert r.returncode == 0, explain(r)
    score = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout).group(1))
    assert score <= 2.0, explain(r)
    # A copy without the hardening scores worse and fails the threshold.
    soft_dir = tmp_path / "soft"
    soft_dir.mkdir()
    soft = "\n".join(ln for ln in SYSTEMD_UNIT.read_text().splitlines()
                     if ln.split("=", 1)[0] not in HARDENING and not ln.startswith(("SystemCall", "Restrict")))
    r = systemd_analyze("security", "--offline=true", "--threshold=20", "--no-pager",
                        unit_for_verify(soft_dir, soft))
    assert r.returncode != 0, explain(r)


# The security alerts on made-up series: each fires on what it is for and stays quiet
# on the ordinary (one failed login, a client that gave up once, a certificate with
# months left). promtool's clock starts at 0, so a notAfter of 10 days is 864000.
SECURITY_RULE_TESTS = """
rule_files: [{alerts}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # mg-a's own credentials are refused by the source from minute 5.
      - series: 'mirrorguard_upstream_errors_total{{job="mirrorguard",instance="mg-a",listener="a-to-b",kind="authentication"}}'
        values: '0x5 1+1x55'
      - series: 'mirrorguard_upstream_errors_total{{job="mirrorguard",instance="mg-b",listener="a-to-b",kind="connect"}}'
        values: '0+1x60'
      # Someone guesses credentials on mg-a's mirror listener; one typo on mg-b's.
      - series: 'mirrorguard_connection_ends_total{{job="mirrorguard",instance="mg-a",listener="a-to-b",side="client",cause="authentication"}}'
        values: '0+2x60'
      - series: 'mirrorguard_connection_ends_total{{job="mirrorguard",instance="mg-b",listener="a-to-b",side="client",cause="authentication"}}'
        values: '0 1x59'
      # Bad tokens on mg-a; one request with a stale token on mg-b.
      - series: 'mirrorguard_admin_refused_total{{job="mirrorguard",instance="mg-a",reason="bad_token"}}'
        values: '0+1x60'
      - series: 'mirrorguard_admin_refused_total{{job="mirrorguard",instance="mg-b",reason="bad_token"}}'
        values: '0 1x59'
      - series: 'mirrorguard_admin_refused_total{{job="mirrorguard",instance="mg-b",reason="missing_token"}}'
        values: '0+5x60'
      # Clients with a certificate from another CA keep trying mg-a's guard.
      - series: 'mirrorguard_tls_handshake_errors_total{{job="mirrorguard",instance="mg-a",listener="dr-guard",kind="unknown_ca"}}'
        values: '0+3x60'
      - series: 'mirrorguard_tls_handshake_errors_total{{job="mirrorguard",instance="mg-b",listener="dr-guard",kind="eof"}}'
        values: '0 2x59'
      # The source's certificate is refused on mg-a.
      - series: 'mirrorguard_upstream_errors_total{{job="mirrorguard",instance="mg-a",listener="a-to-b",kind="tls_handshake"}}'
        values: '0+1x60'
      # Certificates: mg-a's guard 10 days left, its source client 1 day, mg-b's 90 days.
      - series: 'mirrorguard_tls_certificate_expiry_timestamp_seconds{{job="mirrorguard",instance="mg-a",tls="dr-guard tls",role="server"}}'
        values: '864000x60'
      - series: 'mirrorguard_tls_certificate_expiry_timestamp_seconds{{job="mirrorguard",instance="mg-a",tls="a-to-b upstream tls",role="client"}}'
        values: '86400x60'
      - series: 'mirrorguard_tls_certificate_expiry_timestamp_seconds{{job="mirrorguard",instance="mg-b",tls="dr-guard tls",role="server"}}'
        values: '7776000x60'
    alert_rule_test:
      - eval_time: 3m
        alertname: MirrorguardOwnAuthenticationFailing
        exp_alerts: []
      - eval_time: 10m
        alertname: MirrorguardOwnAuthenticationFailing
        exp_alerts:
          - exp_labels: {{severity: critical, job: mirrorguard, instance: mg-a, listener: a-to-b}}
            exp_annotations:
              summary: "A cluster refuses mirrorguard's own credentials on listener a-to-b (mg-a)"
              description: "mirrorguard's SASL authentication towards the upstream of this listener fails (a changed password, a removed user, a mechanism no longer enabled): it cannot fetch or write there. The ERROR lines of the listener name the cluster."
      - eval_time: 20m
        alertname: MirrorguardClientAuthenticationFailures
        exp_alerts:
          - exp_labels: {{severity: warning, job: mirrorguard, instance: mg-a, listener: a-to-b}}
            exp_annotations:
              summary: "20 client authentications failed on listener a-to-b (mg-a) in 10 minutes"
              description: "Clients of a listener that authenticates them fail (wrong credentials, an unknown user, authentication abandoned): a misconfigured fetcher, or someone guessing."
      - eval_time: 20m
        alertname: MirrorguardAdminRefused
        exp_alerts:
          - exp_labels: {{severity: warning, job: mirrorguard, instance: mg-a, reason: bad_token}}
            exp_annotations:
              summary: "Admin API requests refused on mg-a: bad_token"
              description: "bad_token: a wrong bearer token (a stale token file, or someone guessing); host_not_allowed: a Host name that is neither an IP address, localhost nor in [admin] allowed_hosts (a web page using DNS rebinding, or a name missing from allowed_hosts)."
      - eval_time: 20m
        alertname: MirrorguardTlsHandshakeErrors
        exp_alerts:
          - exp_labels: {{severity: warning, job: mirrorguard, instance: mg-a, listener: dr-guard, kind: unknown_ca}}
            exp_annotations:
              summary: "TLS handshakes failing on dr-guard (mg-a): unknown_ca"
              description: "Clients fail the TLS handshake: unknown_ca, cert_expired, no_client_cert or bad_certificate are clients with the wrong certificate (or none); plaintext is a client without TLS; timeout and eof are clients that give up. The WARN lines name each peer."
      - eval_time: 3m
        alertname: MirrorguardUpstreamTlsErrors
        exp_alerts: []
      - eval_time: 20m
        alertname: MirrorguardUpstreamTlsErrors
        exp_alerts:
          - exp_labels: {{severity: critical, job: mirrorguard, instance: mg-a, listener: a-to-b}}
            exp_annotations:
              summary: "mirrorguard cannot complete TLS handshakes with the upstream of a-to-b (mg-a)"
              description: "The broker's certificate does not chain to the configured CA, does not name the host, or expired; or mirrorguard's own client certificate is refused."
      - eval_time: 10m
        alertname: MirrorguardCertificateExpiresSoon
        exp_alerts:
          - exp_labels: {{severity: warning, job: mirrorguard, instance: mg-a, tls: dr-guard tls, role: server}}
            exp_annotations:
              summary: "The server certificate of dr-guard tls on mg-a expires within 14 days"
              description: "Renew it and send SIGHUP (systemctl reload, or kill -HUP 1 in the container): mirrorguard re-reads every certificate, key and CA bundle."
          - exp_labels: {{severity: warning, job: mirrorguard, instance: mg-a, tls: a-to-b upstream tls, role: client}}
            exp_annotations:
              summary: "The client certificate of a-to-b upstream tls on mg-a expires within 14 days"
              description: "Renew it and send SIGHUP (systemctl reload, or kill -HUP 1 in the container): mirrorguard re-reads every certificate, key and CA bundle."
      - eval_time: 10m
        alertname: MirrorguardCertificateExpiresVerySoon
        exp_alerts:
          - exp_labels: {{severity: critical, job: mirrorguard, instance: mg-a, tls: a-to-b upstream tls, role: client}}
            exp_annotations:
              summary: "The client certificate of a-to-b upstream tls on mg-a expires within 2 days (or has expired)"
              description: "Once it has expired, handshakes fail: the mirror stops (source TLS), the fetcher or producers cannot connect (served certificate). Renew it and send SIGHUP."
"""


def test_security_alerts_fire_on_attacks_and_expiring_certificates_only(tmp_path):
    r = rule_test(tmp_path, SECURITY_RULE_TESTS, ALERTS)
    assert r.returncode == 0, explain(r)
    assert "SUCCESS" in r.stdout + r.stderr, explain(r)


def test_a_certificate_alert_on_the_wrong_horizon_fails_its_rule_test(tmp_path):
    bad = broken(tmp_path, ALERTS, "- time() < 14 * 86400", "- time() < 7 * 86400")
    r = rule_test(tmp_path, SECURITY_RULE_TESTS, bad)
    assert r.returncode != 0, explain(r)
