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
              description: "Transaction closings past the cut were no longer known (see the WARN line naming the partition), so a transaction may be left open on the destination. After promotion run `mirrorguard ctl abort-open` for that partition."
"""


def test_seal_alerts_fire_on_a_stuck_or_incomplete_seal_only(tmp_path):
    r = rule_test(tmp_path, SEAL_RULE_TESTS, ALERTS)
    assert r.returncode == 0, explain(r)
    assert "SUCCESS" in r.stdout + r.stderr, explain(r)


def test_a_seal_alert_on_the_wrong_event_fails_its_rule_test(tmp_path):
    bad = broken(tmp_path, ALERTS, 'kind="open_at_cut_incomplete"', 'kind="seal_completed"')
    r = rule_test(tmp_path, SEAL_RULE_TESTS, bad)
    assert r.returncode != 0, explain(r)


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
