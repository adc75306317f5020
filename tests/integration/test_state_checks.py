"""Start-up checks of the state cluster (issue 18 item 7), against real Apache Kafka:
a `[state]` that is a mirror's source cluster is refused with both cluster ids named
whatever `production` says (only `allow_source_cluster = true`, for one-cluster test beds,
lets it through with a WARN), a
state topic with a replication factor below 3 or min.insync.replicas below 2 is refused
in production mode (the default) and reported as WARN lines with `production = false`;
a three-broker state cluster with a well replicated state topic starts.
"""

from __future__ import annotations

import subprocess

import harness
from mirror_harness import MirrorSpec, mirror_factory  # noqa: F401 - mirror_factory is a fixture

MIRROR = "m"


def _run_refused(mg) -> str:
    """Runs mirrorguard on `mg`'s config; it must exit non-zero at start-up."""
    r = subprocess.run([str(harness.MIRRORGUARD_BIN), "run", "--config", str(mg.config_path)],
                       capture_output=True, text=True, timeout=90, env={"NO_COLOR": "1", "PATH": "/usr/bin:/bin"})
    out = r.stdout + r.stderr
    assert r.returncode != 0, f"started although it should have been refused:\n{out}"
    return out


def _good_state_topic(kafka3) -> str:
    topic = f"__mirror_state_{harness.topic_name('checked')}"
    harness.create_topics(kafka3.bootstrap, [topic], replication_factor=3,
                          config={"cleanup.policy": "compact", "min.insync.replicas": "2"})
    return topic


def test_under_replicated_state_topic_refused_in_production(kafka1, kafka3, mirror_factory):
    mg = mirror_factory(kafka1.bootstrap, [MirrorSpec.of(MIRROR, kafka3)], start=False, production=True)
    out = _run_refused(mg)
    assert "state cluster refused" in out, out
    assert "replication factor 1" in out and "min.insync.replicas=1" in out, out
    assert "is the source cluster" not in out, out


def test_under_replicated_state_topic_only_warned_when_not_production(kafka1, mirror_factory):
    mg = mirror_factory(kafka1.bootstrap, [MirrorSpec.of(MIRROR, kafka1)], production=False)
    log = mg.log_text()
    warns = [line for line in log.splitlines() if "WARN" in line and "production = false, not refused" in line]
    assert any("replication factor 1" in line for line in warns), warns
    assert any("min.insync.replicas=1" in line for line in warns), warns
    # The same cluster as the source: let through only by the harness's explicit
    # allow_source_cluster = true, and reported.
    allowed = [line for line in log.splitlines() if "WARN" in line and "allow_source_cluster = true, not refused" in line]
    assert any("is the source cluster" in line and kafka1.cluster_id in line for line in allowed), allowed


def test_replicated_state_cluster_of_its_own_starts(kafka1, kafka3, mirror_factory):
    topic = _good_state_topic(kafka3)
    mg = mirror_factory(kafka3.bootstrap.split(",")[0], [MirrorSpec.of(MIRROR, kafka1)], production=True, state_topic=topic)
    log = mg.log_text()
    assert "state cluster checked" in log, log
    assert "not refused" not in log


def test_state_cluster_that_is_the_source_refused(kafka3, mirror_factory):
    topic = _good_state_topic(kafka3)
    # Refused whatever `production` says: only `allow_source_cluster` lets it through.
    mg = mirror_factory(kafka3.bootstrap.split(",")[0], [MirrorSpec.of(MIRROR, kafka3)], start=False, production=False,
                        allow_source_cluster=False, state_topic=topic)
    out = _run_refused(mg)
    line = next((line for line in out.splitlines() if "is the source cluster" in line), None)
    assert line is not None, out
    assert line.count(kafka3.cluster_id) == 2, line  # the state's id and the source's, named
    assert f'mirror "{MIRROR}"' in line, line
    assert "replication factor" not in line, "a well replicated state topic was reported"
