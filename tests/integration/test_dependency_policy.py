"""The dependency policy (deny.toml) is enforced: `cargo deny check bans licenses sources`
passes on the project (scripts/test.sh runs it too) and fails on a copy of the policy
that no longer allows a license the dependencies use, so the check is known to look.
The advisory database (RustSec, fetched from GitHub) cannot be fetched on the test
machines: `advisories` is not checked here (README, "Security"). cargo-deny is installed
(pinned) by scripts/install-test-deps.sh; nothing is fetched."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CARGO_DENY = ROOT / ".tools" / "bin" / "cargo-deny"
POLICY = ROOT / "deny.toml"


def deny(config: Path) -> subprocess.CompletedProcess:
    assert CARGO_DENY.is_file(), f"{CARGO_DENY} missing: run scripts/install-test-deps.sh"
    return subprocess.run([str(CARGO_DENY), "--manifest-path", str(ROOT / "Cargo.toml"),
                           "--config", str(config), "check", "--hide-inclusion-graph",
                           "bans", "licenses", "sources"],
                          capture_output=True, text=True, timeout=120)


def test_the_dependencies_pass_the_policy():
    r = deny(POLICY)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "bans ok, licenses ok, sources ok" in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]


def test_a_license_the_policy_does_not_allow_is_refused(tmp_path):
    text = POLICY.read_text()
    assert '    "MIT",\n' in text
    bad = tmp_path / "deny.toml"
    bad.write_text(text.replace('    "MIT",\n', ""))
    r = deny(bad)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "licenses FAILED" in out and "rejected" in out, out[-3000:]
