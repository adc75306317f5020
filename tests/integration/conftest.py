"""Fixtures: Apache Kafka and Tansu brokers, mirrorguard proxies, on free loopback ports.

`--mg-broker=kafka` (default) runs the client and proxy tests (the `broker`, `proxy`,
`kafka` and `own_broker` fixtures) on Apache Kafka 4.4; `--mg-broker=tansu` on Tansu;
`--mg-broker=both` on each in turn. Env: MG_BROKER. Tests that do not stop or hang
their broker share the session's `kafka1`; the others get a cluster of their own.
Tests that need a particular implementation use `kafka1`/`kafka_factory` or
`broker_factory` (Tansu) directly and say why.

`--mg-target=proxy` (default) runs the client tests through mirrorguard;
`--mg-target=direct` runs them against the broker directly (to validate the tests and
the harness without the proxy); `--mg-target=both` runs both. Env: MG_TARGET.
Tests that are about the proxy itself (metrics, hostile input, ...) always use it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import Proxy, TansuBroker  # noqa: E402

# Workers, the leak check after every test, the slowest tests at the end.
pytest_plugins = ["suite_plugin"]

# Files the tests write (tokens, passwords, credential files, keys) are readable by this
# user only: mirrorguard refuses a secret file others can read ([secrets]
# unsafe_permissions), as an operator's should be.
os.umask(0o077)

LOGS_KEY = pytest.StashKey[list]()


def pytest_addoption(parser):
    parser.addoption(
        "--mg-target",
        default=os.environ.get("MG_TARGET", "proxy"),
        choices=["proxy", "direct", "both"],
        help="where the client tests send their traffic",
    )
    parser.addoption(
        "--mg-broker",
        default=os.environ.get("MG_BROKER", "kafka"),
        choices=["kafka", "tansu", "both"],
        help="which broker implementation the broker-parametrised tests run on",
    )


def pytest_generate_tests(metafunc):
    if "broker_kind" in metafunc.fixturenames:
        b = metafunc.config.getoption("--mg-broker")
        metafunc.parametrize("broker_kind", ["kafka", "tansu"] if b == "both" else [b], indirect=True)
    if "kafka" in metafunc.fixturenames:
        t = metafunc.config.getoption("--mg-target")
        targets = ["proxy", "direct"] if t == "both" else [t]
        metafunc.parametrize("mg_target", targets, indirect=True)


def pytest_collection_modifyitems(config, items):
    if config.getoption("--mg-target") != "direct":
        return
    skip = pytest.mark.skip(reason="needs mirrorguard (--mg-target=direct)")
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if "kafka" not in names and names & {"proxy", "proxy_factory"}:
            item.add_marker(skip)


def _register_log(request, name: str, path: Path) -> None:
    logs = request.node.stash.setdefault(LOGS_KEY, [])
    logs.append((name, path))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for name, path in item.stash.get(LOGS_KEY, []):
            try:
                data = Path(path).read_bytes()
            except OSError:
                continue
            text = data[-60_000:].decode(errors="replace")
            report.sections.append((f"{name} log ({path}) [{report.when}]", text))


@pytest.fixture
def broker_factory(request, tmp_path):
    """Starts Tansu brokers; all of them are stopped at teardown, pass or fail."""
    started: list[TansuBroker] = []

    def make(port: int | None = None, cid: str | None = None, start: bool = True) -> TansuBroker:
        # A free port can be taken by someone else before the broker binds it: retry with a
        # new one (only when the port was not asked for).
        for attempt in range(3):
            b = TansuBroker(tmp_path, port=port, cid=cid, name=f"tansu{len(started)}")
            started.append(b)
            _register_log(request, b.name, b.log_path)
            if not start:
                return b
            try:
                return b.start()
            except harness.HarnessError:
                if port is not None or attempt == 2 or "in use" not in b.proc.log_text().lower():
                    raise
                b.stop()
        raise AssertionError("unreachable")

    yield make
    harness.close_clients()
    for b in started:
        b.stop()


@pytest.fixture
def broker_kind(request) -> str:
    """"kafka" or "tansu" (parametrised from --mg-broker)."""
    return request.param


@pytest.fixture
def broker(broker_kind, request):
    """The upstream of the client/proxy tests: the session's shared Apache Kafka node
    (tests use their own topics), or a fresh Tansu broker. Tests that stop or hang their
    broker use `own_broker` instead."""
    if broker_kind == "kafka":
        return request.getfixturevalue("kafka1")
    return request.getfixturevalue("broker_factory")()


@pytest.fixture
def own_broker(broker_kind, request):
    """Makes brokers private to one test (it may stop, kill or hang them): one-node Apache
    Kafka clusters or Tansu brokers. `make(port=None)`; the result has `.bootstrap`,
    `.port`, `.node_ids`, `.kind` and `stop()`/`pause()`/`resume()`/`restart()` through
    `broker_control`."""
    if broker_kind == "kafka":
        factory = request.getfixturevalue("kafka_factory")

        def make(port: int | None = None, **kw):
            return factory(nodes=1, port=port, **kw)
    else:
        factory = request.getfixturevalue("broker_factory")

        def make(port: int | None = None, **kw):
            return factory(port=port, **kw)

    return make


@pytest.fixture
def proxy_factory(request, tmp_path):
    """Starts mirrorguard processes. At teardown each one gets SIGTERM and must exit 0
    within its grace period, and its log must show no panic."""
    started: list[Proxy] = []

    def make(upstream: list[str], wait_ready: bool = True, **kw) -> Proxy:
        for attempt in range(3):
            p = Proxy(tmp_path, upstream, name=f"mirrorguard{len(started)}", **kw)
            started.append(p)
            _register_log(request, p.name, p.log_path)
            try:
                return p.start(wait_ready=wait_ready)
            except harness.HarnessError:
                # One of its free ports was taken before it bound it: retry on new ones.
                if attempt == 2 or p.alive() or "in use" not in p.proc.log_text().lower():
                    raise
                p.exit_code = 0  # exited at start-up: nothing for teardown to check
        raise AssertionError("unreachable")

    yield make
    harness.close_clients()
    problems = []
    for p in started:
        rc = p.terminate()
        if rc != 0:
            problems.append(f"{p.name}: exit code {rc} after SIGTERM (None = still running after grace)")
        log = p.log_path.read_text(errors="replace") if p.log_path.exists() else ""
        if "panicked" in log:
            problems.append(f"{p.name}: panic in log")
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)


@pytest.fixture
def proxy(broker, proxy_factory) -> Proxy:
    return proxy_factory([broker.bootstrap], node_ids=broker.node_ids)


@dataclass
class Target:
    """Where a client test sends its traffic."""

    name: str
    bootstrap: str
    broker: "TansuBroker | KafkaCluster"
    proxy: Proxy | None

    @property
    def on_kafka(self) -> bool:
        return self.broker.kind == "kafka"

    @property
    def via_proxy(self) -> bool:
        return self.proxy is not None


@pytest.fixture
def mg_target(request):
    return request.param


@pytest.fixture
def kafka(mg_target, broker, proxy_factory) -> Target:
    if mg_target == "direct":
        return Target("direct", broker.bootstrap, broker, None)
    p = proxy_factory([broker.bootstrap], node_ids=broker.node_ids)
    return Target("proxy", p.bootstrap, broker, p)


# --------------------------------------------------------------------------
# Apache Kafka 4.4 brokers (kafka_broker.py)

from kafka_broker import KafkaCluster  # noqa: E402


def _need_kafka():
    import kafka_broker

    if not kafka_broker.kafka_available():
        pytest.fail(
            f"Apache Kafka {kafka_broker.KAFKA_VERSION} is not installed in {kafka_broker.KAFKA_LIBS}: "
            "run scripts/install-test-deps.sh",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def kafka_session_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("kafka")


@pytest.fixture(scope="session")
def kafka1(kafka_session_dir) -> KafkaCluster:
    """One Apache Kafka node shared by the whole session (tests use their own topics).
    Tests that kill, hang or restart a broker use `kafka_factory` instead."""
    _need_kafka()
    c = KafkaCluster(kafka_session_dir, nodes=1, name="kafka1")
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture(scope="session")
def kafka3(kafka_session_dir) -> KafkaCluster:
    """Three Apache Kafka nodes (combined mode, three voters) shared by the session."""
    _need_kafka()
    c = KafkaCluster(kafka_session_dir, nodes=3, name="kafka3")
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture
def kafka_factory(request, tmp_path):
    """Starts Apache Kafka clusters private to one test (which may kill, hang or restart
    them); all of them are stopped at teardown, pass or fail."""
    _need_kafka()
    started: list[KafkaCluster] = []

    def make(nodes: int = 1, cluster_id: str | None = None, name: str | None = None, **kw) -> KafkaCluster:
        kw.setdefault("name", name or f"kafka{len(started)}")
        c = KafkaCluster(tmp_path, nodes=nodes, cluster_id=cluster_id, **kw)
        started.append(c)
        for n in c.nodes:
            _register_log(request, n.name, n.log_path)
        return c.start()

    yield make
    harness.close_clients()
    for c in started:
        c.stop()


@pytest.fixture
def fault_proxy(request, tmp_path):
    """A Toxiproxy server of this test (tests/integration/fault_proxy.py), stopped at
    teardown."""
    from fault_proxy import FaultProxy

    fp = FaultProxy(tmp_path)
    _register_log(request, "toxiproxy", fp.process.log_path)
    yield fp
    fp.stop()
