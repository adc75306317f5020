"""Process and client helpers for the integration tests.

Everything binds to 127.0.0.1 only, every wait has a deadline, and every process
started here runs in its own process group so that it can always be stopped.
"""

from __future__ import annotations

import base64
import logging
import os
import random
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import rawkafka

ROOT = Path(__file__).resolve().parents[2]
TANSU_BIN = Path(os.environ.get("TANSU_BIN", ROOT / ".tools" / "bin" / "tansu"))
MIRRORGUARD_BIN = Path(os.environ.get("MIRRORGUARD_BIN", ROOT / "target" / "debug" / "mirrorguard"))
HOST = "127.0.0.1"
TANSU_NODE_ID = 111  # Tansu is always node 111

# Consumer-group settings that keep group tests fast against Tansu: its JoinGroup
# answers only after about half of session.timeout.ms (23 s with the default 45 s,
# about 1 s with 2 s), so a short session timeout makes a join take ~1 s.
FAST_GROUP_CONF = {
    "session.timeout.ms": 2000,
    "heartbeat.interval.ms": 500,
    "partition.assignment.strategy": "range",
}


class HarnessError(Exception):
    pass


# --------------------------------------------------------------------------
# ports and ids


def cluster_id() -> str:
    """A Kafka-style cluster id: URL-safe base64 of 16 random bytes, 22 chars."""
    cid = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
    assert len(cid) == 22
    return cid


# Each pytest worker (pytest-xdist's PYTEST_XDIST_WORKER=gwN; N=0 without xdist) owns a
# range of ports below the kernel's ephemeral range (32768-60999 here), so that no two
# workers can hand out the same port and no client's ephemeral source port can take one:
# worker N owns [PORT_FLOOR + N * PORT_SPAN, PORT_FLOOR + (N + 1) * PORT_SPAN). Within its
# range a worker goes round and round, so a port it handed out is not handed out again
# before the other PORT_SPAN - 1 have been (a port some process still holds, or still in
# TIME_WAIT, fails the bind check and is skipped).
PORT_FLOOR = 10000
PORT_SPAN = 2800
MAX_WORKERS = 8  # 10000 + 8 * 2800 = 32400 < 32768


def worker_index() -> int:
    """This process's pytest-xdist worker number (0 without xdist)."""
    w = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    try:
        n = int(w.removeprefix("gw"))
    except ValueError:
        n = 0
    if not 0 <= n < MAX_WORKERS:
        raise HarnessError(f"worker {w}: at most {MAX_WORKERS} pytest workers own a port range")
    return n


def port_range() -> range:
    lo = PORT_FLOOR + worker_index() * PORT_SPAN
    return range(lo, lo + PORT_SPAN)


_next_port: int | None = None


def _port_is_free(port: int) -> bool:
    if not 1024 <= port <= 65535:
        return False
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((HOST, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _take_ports(count: int, exclude: set[int]) -> int:
    """The first port `p` of `count` consecutive ports of this worker's range that are all
    free and outside `exclude`; the cursor moves past them."""
    global _next_port
    rng = port_range()
    if _next_port is None:
        # Start somewhere in the range (not always at its floor): a re-run soon after an
        # earlier one does not walk through the other's TIME_WAIT ports first.
        _next_port = random.randrange(rng.start, rng.stop)
    for _ in range(len(rng)):
        p = _next_port
        if p + count > rng.stop:
            p = rng.start
        _next_port = p + count
        ports = range(p, p + count)
        if all(q not in exclude and _port_is_free(q) for q in ports):
            return p
    raise HarnessError(f"no {count} free consecutive ports in {rng.start}-{rng.stop - 1}")


def free_port(exclude: set[int] | None = None) -> int:
    """A free port of this worker's range, outside `exclude`."""
    return _take_ports(1, exclude or set())


def free_node_port_base(
    exclude: set[int] | None = None, node: int = TANSU_NODE_ID, nodes: list[int] | None = None
) -> int:
    """A node_port_base such that base + node is a free port of this worker's range for
    every node id."""
    exclude = exclude or set()
    ids = nodes or [node]
    lo, hi = min(ids), max(ids)
    if hi - lo + 1 > 64:
        raise HarnessError(f"node ids {ids} span more than 64 ports")
    # base + lo .. base + hi is a block of consecutive ports of this range; the ids not
    # used in between stay free for anyone.
    return _take_ports(hi - lo + 1, exclude) - lo


def wait_until(pred, timeout: float, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last_exc = None
    while True:
        try:
            v = pred()
            if v:
                return v
        except HarnessError:
            raise  # fatal (e.g. the process under test exited): no point waiting
        except Exception as e:  # noqa: BLE001 - reported below
            last_exc = e
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout}s (last error: {last_exc!r})")
        time.sleep(interval)


def retry(fn, timeout: float = 60.0, interval: float = 0.5):
    """`fn()`'s result, calling it again while it raises (a restarted broker still electing
    its leaders, say) until `timeout`; then its last error."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except Exception:  # noqa: BLE001 - raised again at the deadline
            if time.monotonic() > deadline:
                raise
            time.sleep(interval)


def wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Waits until every thread of process `pid` is stopped (state T in /proc) after a
    SIGSTOP: the signal is queued at once but each thread stops only when it next enters
    the kernel, and a JVM thread answering a request in that window could still reply."""

    def stopped():
        tasks = os.listdir(f"/proc/{pid}/task")
        for tid in tasks:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                # the state follows the parenthesised command name, which may hold spaces
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state not in ("T", "t"):
                return False
        return True

    wait_until(stopped, timeout, interval=0.01, what=f"every thread of process {pid} stopped")


# --------------------------------------------------------------------------
# processes


class ManagedProcess:
    """A child process in its own process group, with its output in a log file."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict | None = None):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        self._log.write(f"$ {' '.join(map(str, argv))}\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen(
            [str(a) for a in argv],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self, tail: int = 200_000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-tail:].decode(errors="replace")

    def send_signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.proc.pid, sig)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill_group(self) -> None:
        """SIGKILL the whole process group (used as the last resort)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.wait(5)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 5.0) -> int | None:
        """Sends `sig`, waits up to `timeout`; returns the exit code, or None if it had to be killed."""
        if self.alive():
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
        rc = self.wait(timeout)
        if rc is None:
            self.kill_group()
        # Stray children of the group, if any.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._log.close()
        return rc


class TansuBroker:
    """A Tansu broker on 127.0.0.1 with memory storage."""

    def __init__(self, log_dir: Path, port: int | None = None, cid: str | None = None, name: str = "tansu"):
        self.port = port or free_port()
        self.cluster_id = cid or cluster_id()
        self.name = name
        self.log_path = log_dir / f"{name}-{self.port}.log"
        self.proc: ManagedProcess | None = None

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    # -- the interface shared with kafka_broker.KafkaCluster ------------------------
    kind = "tansu"

    @property
    def node_ids(self) -> list[int]:
        return [TANSU_NODE_ID]

    def pause(self) -> None:
        """SIGSTOP: the broker hangs with its sockets open."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        wait_stopped(self.proc.pid)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def start(self, ready_timeout: float = 10.0) -> "TansuBroker":
        url = f"tcp://{HOST}:{self.port}"
        self.proc = ManagedProcess(
            self.name,
            [
                TANSU_BIN,
                "broker",
                # `=` form: a URL-safe base64 id may start with '-'.
                f"--cluster-id={self.cluster_id}",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            self.log_path,
        )
        try:
            self.wait_ready(ready_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float) -> None:
        def ready():
            if not self.proc.alive():
                raise HarnessError(f"tansu exited with {self.proc.proc.returncode}:\n{self.proc.log_text()}")
            with rawkafka.Connection(HOST, self.port, timeout=1.0) as c:
                return rawkafka.API_FETCH in rawkafka.api_versions(c)

        try:
            wait_until(ready, timeout, what=f"tansu on {self.port} answering ApiVersions")
        except HarnessError:
            raise
        except TimeoutError as e:
            raise HarnessError(f"{e}\n{self.proc.log_text()}") from e

    def stop(self, timeout: float = 1.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`: Tansu waits for its clients to hang up
        before exiting on SIGTERM, and memory storage has nothing to flush."""
        if self.proc is not None:
            self.proc.stop(signal.SIGTERM, timeout=timeout)


def http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


@dataclass
class ProxyPorts:
    bootstrap: int
    admin: int
    node_port_base: int
    node_ids: tuple[int, ...] = (TANSU_NODE_ID,)

    @property
    def node_port(self) -> int:
        """The proxy port of the first upstream node (the only one for one-node upstreams)."""
        return self.node_port_base + self.node_ids[0]

    def node_port_of(self, node_id: int) -> int:
        return self.node_port_base + node_id


class Proxy:
    """mirrorguard in front of one upstream, configured on free loopback ports."""

    def __init__(
        self,
        work_dir: Path,
        upstream: list[str],
        *,
        max_frame_bytes: int = 104857600,
        shutdown_grace_ms: int = 5000,
        connect_timeout_ms: int = 2000,
        metadata_refresh_ms: int = 2000,
        log_level: str = "info,mirrorguard=debug",
        name: str = "mirrorguard",
        node_ids: list[int] | tuple[int, ...] = (TANSU_NODE_ID,),
    ):
        # A multi-node cluster's bootstrap is "host:port,host:port": one entry per address.
        upstream = [a for u in upstream for a in u.split(",") if a]
        taken: set[int] = set()
        bs = free_port(taken)
        taken.add(bs)
        admin = free_port(taken)
        taken.add(admin)
        for u in upstream:
            taken.add(int(u.rsplit(":", 1)[1]))
        base = free_node_port_base(taken, nodes=list(node_ids))
        self.ports = ProxyPorts(bs, admin, base, tuple(node_ids))
        self.upstream = upstream
        self.max_frame_bytes = max_frame_bytes
        self.shutdown_grace_ms = shutdown_grace_ms
        self.name = name
        self.config_path = work_dir / f"{name}.toml"
        self.log_path = work_dir / f"{name}.log"
        ups = ", ".join(f'"{u}"' for u in upstream)
        self.config_path.write_text(
            f"""# written by tests/integration/harness.py
[admin]
listen = "{HOST}:{admin}"

[logging]
format = "text"
level = "{log_level}"

[limits]
max_frame_bytes = {max_frame_bytes}
shutdown_grace_ms = {shutdown_grace_ms}

[[listener]]
name = "main"
bootstrap = "{HOST}:{bs}"
listen_host = "{HOST}"
advertised_host = "{HOST}"
node_port_base = {base}
upstream_bootstrap = [{ups}]
connect_timeout_ms = {connect_timeout_ms}
metadata_refresh_ms = {metadata_refresh_ms}
"""
        )
        self.proc: ManagedProcess | None = None
        self.exit_code: int | None = None

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.ports.bootstrap}"

    @property
    def admin_url(self) -> str:
        return f"http://{HOST}:{self.ports.admin}"

    def start(self, wait_ready: bool = True, ready_timeout: float = 20.0) -> "Proxy":
        if not MIRRORGUARD_BIN.exists():
            raise HarnessError(f"{MIRRORGUARD_BIN} does not exist (cargo build --bins, or set MIRRORGUARD_BIN)")
        env = dict(os.environ)
        env.setdefault("RUST_BACKTRACE", "1")
        env.setdefault("NO_COLOR", "1")
        self.proc = ManagedProcess(
            self.name, [MIRRORGUARD_BIN, "run", "--config", self.config_path], self.log_path, env=env
        )
        if wait_ready:
            try:
                self.wait_ready(ready_timeout)
            except BaseException:
                self.proc.stop(signal.SIGKILL, timeout=5.0)
                raise
        else:
            self.wait_admin(ready_timeout)
        return self

    def _check_alive(self):
        if not self.proc.alive():
            raise HarnessError(f"mirrorguard exited with {self.proc.proc.returncode}; log:\n{self.proc.log_text()}")

    def readyz(self) -> int:
        try:
            return http_get(self.admin_url + "/readyz", timeout=1.0)[0]
        except OSError:
            return -1

    def wait_admin(self, timeout: float) -> None:
        def up():
            self._check_alive()
            return http_get(self.admin_url + "/healthz", timeout=1.0)[0] == 200

        wait_until(up, timeout, what="mirrorguard /healthz == 200")

    def wait_ready(self, timeout: float) -> None:
        def ready():
            self._check_alive()
            return self.readyz() == 200

        try:
            wait_until(ready, timeout, interval=0.05, what="mirrorguard /readyz == 200")
        except HarnessError:
            raise
        except TimeoutError as e:
            raise HarnessError(f"{e}; log:\n{self.proc.log_text()}") from e

    def metrics_text(self) -> str:
        status, body = http_get(self.admin_url + "/metrics", timeout=5.0)
        if status != 200:
            raise HarnessError(f"/metrics returned {status}: {body[:500]}")
        return body

    def metrics(self) -> "Metrics":
        return Metrics(parse_prometheus(self.metrics_text()))

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def terminate(self, extra_s: float = 3.0) -> int | None:
        """SIGTERM, then wait up to the grace period plus `extra_s`. Returns the exit code or
        None if the process did not exit in time (it is then killed)."""
        if self.proc is None:
            return None
        if self.exit_code is not None or not self.proc.alive():
            self.exit_code = self.proc.proc.returncode if self.exit_code is None else self.exit_code
            return self.exit_code
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(self.shutdown_grace_ms / 1000 + extra_s)
        if rc is None:
            self.proc.kill_group()
        self.proc.stop(signal.SIGKILL, timeout=1.0)
        self.exit_code = rc
        return rc


# --------------------------------------------------------------------------
# Prometheus text format

_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$")
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def _unescape(v: str) -> str:
    return v.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Parses Prometheus / OpenMetrics text into (name, labels, value) samples.
    Raises on a line it cannot parse, so a malformed exposition fails the test."""
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if not m:
            raise HarnessError(f"/metrics line {lineno} unparsable: {line!r}")
        name, _, labels_s, value_s = m.group(1), m.group(2), m.group(3), m.group(4)
        labels = {}
        if labels_s:
            pos = 0
            while pos < len(labels_s):
                lm = _LABEL_RE.match(labels_s, pos)
                if not lm:
                    raise HarnessError(f"/metrics line {lineno} bad labels: {line!r}")
                labels[lm.group(1)] = _unescape(lm.group(2))
                pos = lm.end()
        value = float(value_s)  # handles NaN, +Inf
        out.append((name, labels, value))
    return out


class Metrics:
    def __init__(self, samples: list[tuple[str, dict[str, str], float]]):
        self.samples = samples

    def names(self) -> set[str]:
        return {n for n, _, _ in self.samples}

    def select(self, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
        return [
            (lb, v) for n, lb, v in self.samples if n == name and all(lb.get(k) == v2 for k, v2 in labels.items())
        ]

    def sum(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels` (0 when none)."""
        return sum(v for _, v in self.select(name, **labels))

    def counter(self, name: str, **labels: str) -> float:
        """Counters may be exposed with or without the OpenMetrics `_total` suffix."""
        return self.sum(name, **labels)


# --------------------------------------------------------------------------
# librdkafka helpers


RDKAFKA_LOG = logging.getLogger("rdkafka")

# Every librdkafka client made through the helpers below, so that the fixtures can
# close them all at teardown (a client left alive keeps reconnecting to dead ports).
_clients: list = []


def _close_client(c) -> None:
    try:
        if isinstance(c, Producer):
            c.purge()
            c.close()
        elif isinstance(c, Consumer):
            c.close()
    except Exception:  # noqa: BLE001 - already closed, or broker gone
        pass


def abandon_client(c) -> None:
    """For a client whose cluster the test kills: closed in a daemon thread nobody waits for
    (a transactional producer's close() aborts its open transaction and never returns once
    its cluster is gone)."""
    _clients.remove(c)
    threading.Thread(target=_close_client, args=(c,), daemon=True, name="abandoned-client").start()


def close_clients(wait_s: float = 15.0) -> None:
    """Closes every client, each in a thread of its own waited for at most `wait_s`: a
    transactional producer's close() aborts its open transaction without a timeout, which
    never returns once its cluster is dead (failover tests kill it on purpose)."""
    while _clients:
        c = _clients.pop()
        closer = threading.Thread(target=_close_client, args=(c,), daemon=True, name="close-client")
        closer.start()
        closer.join(wait_s)
        if closer.is_alive():
            RDKAFKA_LOG.warning("a client did not close within %.0fs (its cluster is gone?); left to "
                                "its daemon thread", wait_s)


def new_producer(bootstrap: str, **conf) -> Producer:
    p = Producer(base_conf(bootstrap, **conf))
    _clients.append(p)
    return p


def new_consumer(bootstrap: str, **conf) -> Consumer:
    c = Consumer(base_conf(bootstrap, **conf))
    _clients.append(c)
    return c


def base_conf(bootstrap: str, **extra) -> dict:
    conf = {
        "bootstrap.servers": bootstrap,
        "logger": RDKAFKA_LOG,
        "broker.address.family": "v4",
        "socket.timeout.ms": 10000,
        "socket.connection.setup.timeout.ms": 5000,
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 500,
        "topic.metadata.refresh.interval.ms": 5000,
    }
    conf.update(extra)
    return conf


def admin(bootstrap: str, **extra) -> AdminClient:
    a = AdminClient(base_conf(bootstrap, **extra))
    _clients.append(a)
    return a


def create_topics(
    bootstrap: str,
    names: list[str],
    partitions: int = 1,
    config: dict | None = None,
    timeout: float = 15.0,
    replication_factor: int = 1,
) -> None:
    a = admin(bootstrap)
    futs = a.create_topics(
        [
            NewTopic(n, num_partitions=partitions, replication_factor=replication_factor, config=config or {})
            for n in names
        ],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    for name, f in futs.items():
        f.result(timeout=timeout)
    # Wait until the topics are visible in Metadata with a leader for each partition.
    def visible():
        md = a.list_topics(timeout=5)
        for n in names:
            t = md.topics.get(n)
            if t is None or t.error is not None or len(t.partitions) != partitions:
                return False
            if any(p.leader < 0 for p in t.partitions.values()):
                return False
        return True

    wait_until(visible, timeout, interval=0.1, what=f"topics {names} visible")


def produce(
    bootstrap: str,
    topic: str,
    records: list[tuple[bytes | None, bytes | None]],
    partition: int = 0,
    timeout: float = 30.0,
    headers: list | None = None,
    producer: Producer | None = None,
    **conf,
) -> list:
    """Produces `records` ((key, value) pairs) to one partition and returns the delivered
    messages in order of delivery. Raises on any delivery error or timeout."""
    own = producer is None
    p = producer or new_producer(bootstrap, **{"message.timeout.ms": int(timeout * 1000), **conf})
    delivered = []
    errors = []

    def cb(err, msg):
        if err is not None:
            errors.append(err)
        else:
            delivered.append(msg)

    for k, v in records:
        while True:
            try:
                p.produce(topic, key=k, value=v, partition=partition, headers=headers, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.1)
    remaining = p.flush(timeout)
    if own:
        if remaining:
            p.purge()
        p.close()
    if errors:
        raise KafkaException(errors[0])
    if remaining:
        raise TimeoutError(f"{remaining} messages still undelivered after {timeout}s")
    if len(delivered) != len(records):
        raise HarnessError(f"{len(delivered)} delivered of {len(records)}")
    return delivered


def consume_assign(
    bootstrap: str,
    topic: str,
    partition: int = 0,
    offset: int = 0,
    count: int = 1,
    timeout: float = 30.0,
    **conf,
) -> list:
    """Consumes exactly `count` messages from one partition with assign() (no group
    membership) starting at `offset`. Raises on a consumer error or timeout."""
    c = new_consumer(
        bootstrap,
        **{
            "group.id": "mg-assign-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "fetch.wait.max.ms": 100,
            **conf,
        },
    )
    try:
        c.assign([TopicPartition(topic, partition, offset)])
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumed {len(out)} of {count} from {topic}-{partition} in {timeout}s")
            for m in c.consume(num_messages=count - len(out), timeout=0.5):
                if m.error():
                    raise KafkaException(m.error())
                out.append(m)
        return out
    finally:
        c.close()


def topic_name(prefix: str = "t") -> str:
    return f"{prefix}-{os.urandom(4).hex()}"


def wait_txn_markers(bootstrap: str, topic: str, partition: int = 0, open_transactions: int = 0,
                     timeout: float = 15.0) -> None:
    """Waits until every transactional producer's last batch in the partition is its
    COMMIT/ABORT marker, except `open_transactions` of them. Apache Kafka answers
    EndTxn before it writes the markers (the coordinator writes them afterwards), so a
    read right after commit/abort may not see them yet; Tansu writes them at once."""
    host, port = bootstrap.split(",")[0].rsplit(":", 1)

    def settled():
        batches, _ = rawkafka.fetch_all_batches(host, int(port), topic, partition)
        last: dict[int, rawkafka.Batch] = {}
        for b in batches:
            if b.is_transactional:
                last[b.producer_id] = b
        return sum(1 for b in last.values() if not b.is_control) == open_transactions

    wait_until(settled, timeout, interval=0.05, what=f"transaction markers in {topic}-{partition}")
