"""The deploy/ manifests are valid for the tools that read them.

- deploy/prometheus/alerts.yml: `promtool check rules`;
- deploy/prometheus/scrape.yml: `promtool check config` on a Prometheus
  configuration made of its scrape jobs plus alerts.yml as a rule file (the
  way deploy/README.md tells operators to combine them);
- deploy/kubernetes/*.yaml: `kubernetes-validate --strict` against the API
  schemas bundled in its pinned wheel (unknown fields are errors; nothing is
  fetched at test time).

Each check is also run on a broken copy made here, so a check that accepts
anything fails the test. promtool and kubernetes-validate are installed
(pinned) by scripts/install-test-deps.sh; no broker is started.
"""

from __future__ import annotations

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
    return run([KUBE_VALIDATE, "--strict", path])


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


@pytest.mark.parametrize("old,new", [
    ("replicas: 1", "replicas: one"),           # wrong type
    ("serviceName: kafka-dr", "serviceNme: kafka-dr"),  # unknown field (strict)
], ids=["wrong-type", "unknown-field"])
def test_a_broken_kubernetes_manifest_is_refused(tmp_path, old, new):
    src = DEPLOY / "kubernetes" / "sidecar.yaml"
    bad = broken(tmp_path, src, old, new)
    r = check_kube(bad)
    assert r.returncode != 0, explain(r)
