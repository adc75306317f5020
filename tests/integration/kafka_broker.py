"""Apache Kafka 4.4 brokers for the tests: KRaft, combined mode, on free loopback ports.

``KafkaCluster(work_dir, nodes=1)`` is one combined broker+controller;
``nodes=3`` is three combined nodes with a static three-voter quorum, so one node
can be killed and the other two keep a quorum (multi-broker routing, leader moves).
The jars come from ``.tools/kafka/libs`` (``scripts/install-test-deps.sh`` copies
``org.apache.kafka:kafka_2.13:4.4.0`` and its runtime dependencies there from Maven
Central, as listed in ``tests/kafka/pom.xml``).

Storage is formatted with a cluster id the caller chooses (region tests need known
folds). Settings are the quick-start's, tuned for tests on 2 cores: small heaps and
SerialGC, few threads, replication factors that fit the node count,
``group.initial.rebalance.delay.ms=0``, short broker session and quorum timeouts.
Readiness is a real request: Metadata through librdkafka lists every node.

Every process runs in its own process group (``harness.ManagedProcess``) and is
stopped by pid at the end, pass or fail. A node can be killed (SIGKILL), hung
(SIGSTOP / SIGCONT) and restarted on the same ports and data.

``sasl={"alice": "alice-secret", ...}`` adds a ``SASL_PLAINTEXT`` listener on a port of
its own (``node.sasl_port``, ``cluster.sasl_bootstrap``) with SCRAM-SHA-256, SCRAM-SHA-512
(the users' credentials are written by ``kafka-storage format --add-scram``), PLAIN (the
same users, in the listener's JAAS) and OAUTHBEARER (Kafka's unsecured JWS validator, for
tests only). The PLAINTEXT listener stays (readiness checks, inter-broker traffic).
``ssl=CertAuthority(dir)`` adds an ``SSL`` listener on each node (``.ssl_bootstrap``) with a PEM
keystore and truststore (``ssl.keystore.type=PEM``) made by ``CertAuthority`` with ``openssl`` at
test time (no private key is committed); ``ssl_client_auth="required"`` (the default with
``ssl``) makes it a mutual-TLS listener. PLAINTEXT stays for the inter-broker traffic and the
readiness checks. With both ``sasl=`` and ``ssl=`` a node also gets a ``SASL_SSL`` listener
(``node.sasl_ssl_port``, ``cluster.sasl_ssl_bootstrap``): the same certificates and the same
SASL mechanisms and users, TLS without a client certificate required (SASL authenticates).

Use it from pytest (``conftest.py``: session-scoped ``kafka_cluster`` fixtures),
from the demo and from the benchmark (``python3 tests/integration/kafka_broker.py
--nodes 1`` prints the bootstrap and runs until interrupted).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
import rawkafka  # noqa: E402
from harness import HOST, HarnessError, ManagedProcess, wait_until  # noqa: E402

KAFKA_VERSION = "4.4.0"
KAFKA_HOME = Path(os.environ.get("KAFKA_HOME", harness.ROOT / ".tools" / "kafka"))
KAFKA_LIBS = KAFKA_HOME / "libs"
LOG4J_CONFIG = harness.ROOT / "tests" / "kafka" / "log4j2.properties"
JAVA = os.environ.get("JAVA", shutil.which("java") or "java")

# JVM settings for a test broker: small heap, serial GC (2 cores shared with everything
# else), and the C1 compiler only: a test broker lives seconds and serves little, and C2's
# compilations made up 40% of its start (3.3 -> 2.0 CPU-s to ready, measured on 2 cores).
JVM_OPTS = ["-Xms96m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss512k",
            "-Djava.awt.headless=true"]

# Class-data sharing: the classes a broker (and the storage tool that formats its directory)
# loads at start, archived once by scripts/install-test-deps.sh (tests/integration/
# jvm_archives.py) and mapped by every later JVM: a broker's CPU to ready 1.3 -> 0.8 s, a
# format 0.7 -> 0.4 s, and the suite starts hundreds of them on 2 cores. A missing archive
# only costs the time; one that no longer matches the JDK or the jars is refused by the JVM
# with a warning in the node's log and the node starts without it.
CDS_DIR = Path(os.environ.get("MG_CDS_DIR", harness.ROOT / ".tools" / "cds"))
CDS_DUMP_ENV = "MG_CDS_DUMP"


def cds_opts(kind: str) -> list[str]:
    """The JVM options that map (or, with MG_CDS_DUMP=1, write) the archive of `kind`."""
    archive = CDS_DIR / f"{kind}.jsa"
    if os.environ.get(CDS_DUMP_ENV) == "1":
        return [f"-XX:ArchiveClassesAtExit={archive}"]
    return [f"-XX:SharedArchiveFile={archive}"] if archive.exists() else []


def kafka_available() -> bool:
    return (KAFKA_LIBS / f"kafka_2.13-{KAFKA_VERSION}.jar").exists() and shutil.which(JAVA) is not None


def classpath() -> str:
    if not kafka_available():
        raise HarnessError(f"Apache Kafka {KAFKA_VERSION} not installed in {KAFKA_LIBS} (run scripts/install-test-deps.sh)")
    return str(KAFKA_LIBS / "*")


def _free_ports(n: int) -> list[int]:
    """`n` free ports of this pytest worker's range (`harness.free_port`)."""
    got: list[int] = []
    for _ in range(n):
        got.append(harness.free_port(set(got)))
    return got


def _pick_ports(n: int, taken: set[int]) -> list[int]:
    """`n` free loopback ports, distinct from one another and from `taken` (which grows by
    them): the OS may hand a port it gave an earlier call out again once that socket closed."""
    got: list[int] = []
    for _ in range(100):
        for p in _free_ports(n - len(got)):
            if p not in taken:
                taken.add(p)
                got.append(p)
        if len(got) == n:
            return got
    raise HarnessError(f"no {n} distinct free ports outside {sorted(taken)}")


def listener_ports(nodes: int, port: int | None = None, sasl: bool = False,
                   ssl: bool = False) -> list[tuple[int, int, int | None, int | None, int | None]]:
    """Each node's (client, controller, SASL_PLAINTEXT, SSL, SASL_SSL) ports, every one of
    every node distinct; `port` is the first node's client port (chosen by the caller), the
    listeners a cluster does not have are None."""
    taken: set[int] = set() if port is None else {port}
    client = ([port] + _pick_ports(nodes - 1, taken)) if port is not None else _pick_ports(nodes, taken)
    controller = _pick_ports(nodes, taken)
    none: list[int | None] = [None] * nodes
    sasl_ports = _pick_ports(nodes, taken) if sasl else none
    ssl_ports = _pick_ports(nodes, taken) if ssl else none
    sasl_ssl_ports = _pick_ports(nodes, taken) if sasl and ssl else none
    return list(zip(client, controller, sasl_ports, ssl_ports, sasl_ssl_ports))


class CertAuthority:
    """A throwaway CA and the certificates it signs, made with ``openssl`` in ``dir`` at test
    time. ``issue(name)`` returns ``(cert, key)`` paths (RSA 2048, PKCS#8 key, SAN
    IP:127.0.0.1 and DNS:localhost, serverAuth + clientAuth); ``keystore(name)`` is the
    cert and key in one PEM file, as Kafka's ``ssl.keystore.type=PEM`` wants it."""

    def __init__(self, dir: Path, name: str = "mg-test-ca"):
        self.dir = Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.ca = self.dir / f"{name}.pem"
        self.ca_key = self.dir / f"{name}.key"
        self._run(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", self.ca_key,
                   "-out", self.ca, "-days", "2", "-subj", f"/CN={name}",
                   "-addext", "basicConstraints=critical,CA:TRUE",
                   "-addext", "keyUsage=critical,keyCertSign,cRLSign"])

    @staticmethod
    def _run(args: list) -> None:
        r = subprocess.run(["openssl", *[str(a) for a in args]], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise HarnessError(f"openssl {args[0]} failed: {r.stderr}")

    def issue(self, name: str, sans: str = "IP:127.0.0.1,DNS:localhost",
              expired: bool = False) -> tuple[Path, Path]:
        """``expired``: valid from two days ago until yesterday (``openssl ca``, since
        OpenSSL 3.0's ``x509 -req`` cannot backdate)."""
        cert, key, csr = (self.dir / f"{name}.pem", self.dir / f"{name}.key", self.dir / f"{name}.csr")
        ext = self.dir / f"{name}.ext"
        ext.write_text(f"subjectAltName={sans}\nextendedKeyUsage=serverAuth,clientAuth\n"
                       "basicConstraints=CA:FALSE\n")
        self._run(["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", f"/CN={name}"])
        if not expired:
            self._run(["x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.ca_key, "-CAcreateserial",
                       "-out", cert, "-days", "2", "-extfile", ext])
            return cert, key
        db = self.dir / f"{name}.ca-db"
        db.mkdir(exist_ok=True)
        (db / "index.txt").write_text("")
        (db / "serial").write_text(os.urandom(8).hex() + "\n")
        cfg = db / "ca.cnf"
        cfg.write_text(f"[ca]\ndefault_ca = tca\n[tca]\ndatabase = {db}/index.txt\nnew_certs_dir = {db}\n"
                       f"serial = {db}/serial\ndefault_md = sha256\npolicy = any\nunique_subject = no\n"
                       "[any]\ncommonName = supplied\n")
        day = 86400
        stamp = lambda t: time.strftime("%Y%m%d%H%M%SZ", time.gmtime(t))  # noqa: E731
        self._run(["ca", "-batch", "-config", cfg, "-cert", self.ca, "-keyfile", self.ca_key, "-in", csr,
                   "-out", cert, "-notext", "-extfile", ext, "-startdate", stamp(time.time() - 2 * day),
                   "-enddate", stamp(time.time() - day)])
        return cert, key

    def keystore(self, name: str) -> Path:
        cert, key = self.issue(name)
        store = self.dir / f"{name}.keystore.pem"
        store.write_text(key.read_text() + cert.read_text())
        return store


class KafkaNode:
    """One KRaft node in combined mode (broker + controller)."""

    def __init__(self, cluster: "KafkaCluster", node_id: int, port: int, controller_port: int,
                 sasl_port: int | None = None, ssl_port: int | None = None,
                 sasl_ssl_port: int | None = None):
        self.cluster = cluster
        self.sasl_ssl_port = sasl_ssl_port
        self.sasl_port = sasl_port
        self.node_id = node_id
        self.port = port
        self.ssl_port = ssl_port
        self.controller_port = controller_port
        self.name = f"{cluster.name}-n{node_id}"
        self.dir = cluster.work_dir / self.name
        self.data_dir = self.dir / "data"
        self.config_path = self.dir / "server.properties"
        self.log_path = cluster.work_dir / f"{self.name}.log"
        self.proc: ManagedProcess | None = None
        self.paused = False
        # Behind a fault proxy (KafkaCluster's behind_proxy): the PLAINTEXT listener on
        # `port` advertises the proxy's port; DIRECT is everything else's way in.
        self.proxy_port: int | None = None
        self.direct_port: int | None = None

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.direct_port or self.port}"

    @property
    def proxied_bootstrap(self) -> str:
        """The fault proxy's address, which this node advertises to clients that come
        through it (only for a node behind a proxy)."""
        if self.proxy_port is None:
            raise HarnessError(f"{self.name} is not behind a fault proxy")
        return f"{HOST}:{self.proxy_port}"

    @property
    def sasl_bootstrap(self) -> str:
        return f"{HOST}:{self.sasl_port}"

    @property
    def ssl_bootstrap(self) -> str:
        return f"{HOST}:{self.ssl_port}"

    @property
    def sasl_ssl_bootstrap(self) -> str:
        return f"{HOST}:{self.sasl_ssl_port}"

    def write_config(self) -> None:
        c = self.cluster
        n = len(c.nodes)
        rf = min(3, n)
        props = {
            "process.roles": "broker,controller",
            "node.id": self.node_id,
            "controller.quorum.voters": ",".join(f"{x.node_id}@{HOST}:{x.controller_port}" for x in c.nodes),
            "listeners": f"PLAINTEXT://{HOST}:{self.port},CONTROLLER://{HOST}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": self.data_dir,
            "num.partitions": 1,
            "default.replication.factor": 1,
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": 3,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": 1,
            "transaction.state.log.num.partitions": 3,
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": 1,
            "group.initial.rebalance.delay.ms": 0,
            # Few threads: up to four JVMs share 2 cores with the tests.
            "num.network.threads": 2,
            "num.io.threads": 2,
            "background.threads": 2,
            "num.replica.fetchers": 1,
            "num.recovery.threads.per.data.dir": 1,
            "log.cleaner.threads": 1,
            "log.cleaner.dedupe.buffer.size": 8 * 1024 * 1024,
            "log.cleaner.backoff.ms": 1000,
            # Fast failure detection for kill/hang tests.
            "broker.heartbeat.interval.ms": 500,
            "broker.session.timeout.ms": 3000,
            "controller.quorum.election.timeout.ms": 1000,
            "controller.quorum.fetch.timeout.ms": 2000,
            "replica.lag.time.max.ms": 5000,
            "controlled.shutdown.enable": "true",
            "unclean.leader.election.enable": "false",
        }
        if self.proxy_port is not None:
            # Metadata names the address of the listener a request came in on: clients of
            # the proxy are sent back to the proxy, clients of DIRECT (the harness, the
            # inter-broker traffic) never meet its faults.
            props["listeners"] += f",DIRECT://{HOST}:{self.direct_port}"
            props["advertised.listeners"] = (f"PLAINTEXT://{HOST}:{self.proxy_port},"
                                             f"DIRECT://{HOST}:{self.direct_port}")
            props["listener.security.protocol.map"] += ",DIRECT:PLAINTEXT"
            props["inter.broker.listener.name"] = "DIRECT"
        if c.sasl is not None:
            props["listeners"] += f",SASL_PLAINTEXT://{HOST}:{self.sasl_port}"
            props["advertised.listeners"] += f",SASL_PLAINTEXT://{HOST}:{self.sasl_port}"
            props["listener.security.protocol.map"] += ",SASL_PLAINTEXT:SASL_PLAINTEXT"
            props["sasl.enabled.mechanisms"] = "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN,OAUTHBEARER"
            sasl_listeners = ["sasl_plaintext"]
            if c.ssl is not None:
                props["listeners"] += f",SASL_SSL://{HOST}:{self.sasl_ssl_port}"
                props["advertised.listeners"] += f",SASL_SSL://{HOST}:{self.sasl_ssl_port}"
                props["listener.security.protocol.map"] += ",SASL_SSL:SASL_SSL"
                sasl_listeners.append("sasl_ssl")
            for name in sasl_listeners:
                lst = f"listener.name.{name}"
                scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                props[f"{lst}.scram-sha-256.sasl.jaas.config"] = scram
                props[f"{lst}.scram-sha-512.sasl.jaas.config"] = scram
                plain_users = " ".join(f'user_{u}="{p}"' for u, p in c.sasl.items())
                props[f"{lst}.plain.sasl.jaas.config"] = (
                    f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};")
                props[f"{lst}.oauthbearer.sasl.jaas.config"] = (
                    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
                    'unsecuredLoginStringClaim_sub="admin";')
        if c.ssl is not None:
            props["listeners"] += f",SSL://{HOST}:{self.ssl_port}"
            props["advertised.listeners"] += f",SSL://{HOST}:{self.ssl_port}"
            props["listener.security.protocol.map"] += ",SSL:SSL"
            ssl_props = {
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": c.ssl.keystore(self.name),
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": c.ssl.ca,
                "ssl.client.auth": c.ssl_client_auth,
            }
            props.update({f"listener.name.ssl.{k}": v for k, v in ssl_props.items()})
            if c.sasl is not None:
                # SASL_SSL: the same keystore; SASL, not a client certificate, authenticates.
                ssl_props["ssl.client.auth"] = "none"
                props.update({f"listener.name.sasl_ssl.{k}": v for k, v in ssl_props.items()})
        props.update(c.overrides)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(
            "# written by tests/integration/kafka_broker.py\n" + "".join(f"{k}={v}\n" for k, v in props.items())
        )

    def format(self) -> None:
        """Formats the storage directory with the cluster's id (once)."""
        if (self.data_dir / "meta.properties").exists():
            return
        argv = [JAVA, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", *cds_opts("storage-tool"),
                f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
                "-cp", classpath(), "kafka.tools.StorageTool", "format",
                # `=` form: a URL-safe base64 id may start with '-'.
                f"--cluster-id={self.cluster.cluster_id}", "-c", str(self.config_path)]
        for user, password in (self.cluster.sasl or {}).items():
            for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                argv += ["--add-scram", f"{mech}=[name={user},password={password}]"]
        r = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise HarnessError(f"kafka-storage format failed for {self.name}: {r.stdout}\n{r.stderr}")

    def start(self) -> "KafkaNode":
        if self.proc is not None and self.proc.alive():
            return self
        env = dict(os.environ)
        argv = [JAVA, *JVM_OPTS, *cds_opts("broker"), *self.cluster.jvm_opts, f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
                "-cp", classpath(), "kafka.Kafka", self.config_path]
        self.proc = ManagedProcess(self.name, argv, self.log_path, env=env)
        self.paused = False
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def wait_listening(self, timeout: float) -> None:
        def up():
            if not self.alive():
                raise HarnessError(f"{self.name} exited with {self.proc.proc.returncode}:\n{self.proc.log_text(20000)}")
            with rawkafka.Connection(HOST, self.port, timeout=1.0) as c:
                return rawkafka.API_FETCH in rawkafka.api_versions(c)

        wait_until(up, timeout, interval=0.2, what=f"{self.name} answering ApiVersions on {self.port}")

    def kill(self) -> None:
        """SIGKILL: the node dies without a controlled shutdown (data stays for a restart)."""
        if self.proc is not None:
            if self.paused:
                self.resume()
            self.proc.stop(signal.SIGKILL, timeout=10)

    def stop(self, timeout: float = 15.0) -> None:
        """Controlled shutdown (SIGTERM), SIGKILL after `timeout`."""
        if self.proc is not None:
            if self.paused:
                self.resume()
            self.proc.stop(signal.SIGTERM, timeout=timeout)

    def pause(self) -> None:
        """SIGSTOP the JVM: the node hangs with its sockets open (a 'hung' source)."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGSTOP)
            self.paused = True
            harness.wait_stopped(self.proc.pid)

    def resume(self) -> None:
        if self.proc is not None and self.paused:
            try:
                os.killpg(self.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.paused = False

    def restart(self, timeout: float = 60.0) -> "KafkaNode":
        """Starts a stopped or killed node again on the same ports and data."""
        if self.alive():
            self.kill()
        self.start()
        self.wait_listening(timeout)
        return self


class KafkaCluster:
    """``nodes`` combined KRaft nodes (ids ``first_node_id``..) sharing one cluster id."""

    def __init__(
        self,
        work_dir: Path,
        nodes: int = 1,
        cluster_id: str | None = None,
        name: str = "kafka",
        first_node_id: int = 1,
        overrides: dict | None = None,
        jvm_opts: list[str] | None = None,
        port: int | None = None,
        sasl: dict[str, str] | None = None,
        ssl: CertAuthority | None = None,
        ssl_client_auth: str = "required",
        behind_proxy: dict[int, int] | None = None,
    ):
        """`behind_proxy`: node id -> the port of a fault proxy in front of that node's
        PLAINTEXT listener (tests/integration/fault_proxy.py), which the node advertises."""
        self.work_dir = Path(work_dir)
        self.cluster_id = cluster_id or harness.cluster_id()
        self.name = name
        self.overrides = dict(overrides or {})
        self.jvm_opts = list(jvm_opts or [])
        self.sasl = dict(sasl) if sasl is not None else None
        self.ssl = ssl
        self.ssl_client_auth = ssl_client_auth
        self.nodes: list[KafkaNode] = []
        for i, node_ports in enumerate(listener_ports(nodes, port=port, sasl=sasl is not None,
                                                      ssl=ssl is not None)):
            self.nodes.append(KafkaNode(self, first_node_id + i, *node_ports))
        taken = {p for n in self.nodes for p in (n.port, n.controller_port, n.sasl_port, n.ssl_port,
                                                 n.sasl_ssl_port) if p is not None}
        for n in self.nodes:
            if behind_proxy and n.node_id in behind_proxy:
                n.proxy_port = behind_proxy[n.node_id]
                taken.add(n.proxy_port)
                n.direct_port = harness.free_port(exclude=taken)
                taken.add(n.direct_port)

    # -- the interface shared with harness.TansuBroker ----------------------------
    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    @property
    def sasl_bootstrap(self) -> str:
        """The SASL_PLAINTEXT listeners (clusters made with ``sasl=``)."""
        return ",".join(n.sasl_bootstrap for n in self.nodes)

    @property
    def ssl_bootstrap(self) -> str:
        """The nodes' SSL listeners (with ``ssl=``)."""
        return ",".join(n.ssl_bootstrap for n in self.nodes)

    @property
    def sasl_ssl_bootstrap(self) -> str:
        """The nodes' SASL_SSL listeners (with both ``sasl=`` and ``ssl=``)."""
        return ",".join(n.sasl_ssl_bootstrap for n in self.nodes)

    @property
    def port(self) -> int:
        """The first node's port (single-node clusters use it like TansuBroker.port)."""
        return self.nodes[0].port

    @property
    def node_ids(self) -> list[int]:
        return [n.node_id for n in self.nodes]

    @property
    def log_path(self) -> Path:
        return self.nodes[0].log_path

    @property
    def kind(self) -> str:
        return "kafka"

    def node(self, node_id: int) -> KafkaNode:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise KeyError(node_id)

    def start(self, timeout: float = 120.0) -> "KafkaCluster":
        t0 = time.monotonic()
        try:
            for n in self.nodes:
                n.write_config()
                n.format()
            for n in self.nodes:
                n.start()
            for n in self.nodes:
                n.wait_listening(max(5.0, timeout - (time.monotonic() - t0)))
            self.wait_brokers(len(self.nodes), max(5.0, timeout - (time.monotonic() - t0)))
        except BaseException:
            self.stop(graceful=False)
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def wait_brokers(self, count: int, timeout: float = 60.0) -> None:
        """Waits until Metadata (through a live node) lists `count` brokers."""
        def ready():
            for n in self.nodes:
                if not n.alive() or n.paused:
                    continue
                try:
                    with rawkafka.Connection(HOST, n.port, timeout=1.0) as c:
                        md = rawkafka.metadata_v1(c, [])
                    if len(md.brokers) >= count:
                        return True
                except (OSError, rawkafka.ProtocolError):
                    continue
            return False

        wait_until(ready, timeout, interval=0.2, what=f"{self.name}: {count} brokers in Metadata")

    def stop(self, graceful: bool = False) -> None:
        """Stops every node this cluster started (SIGKILL unless `graceful`: test data is
        thrown away, so a controlled shutdown only costs time)."""
        for n in self.nodes:
            if graceful:
                n.stop()
            else:
                n.kill()

    # Single-node conveniences shared with harness.TansuBroker (the first node).
    def pause(self) -> None:
        self.nodes[0].pause()

    def resume(self) -> None:
        self.nodes[0].resume()

    def leader_of(self, topic: str, partition: int = 0) -> int:
        for n in self.nodes:
            if not n.alive() or n.paused:
                continue
            try:
                with rawkafka.Connection(HOST, n.port, timeout=2.0) as c:
                    md = rawkafka.metadata_v1(c, [topic])
                return md.topics[topic][partition]
            except (OSError, rawkafka.ProtocolError, KeyError):
                continue
        raise HarnessError(f"no live node knows the leader of {topic}-{partition}")


def main(argv: list[str]) -> int:
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description="Run Apache Kafka test brokers on loopback until interrupted.")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--cluster-id")
    ap.add_argument("--dir")
    args = ap.parse_args(argv)
    work = Path(args.dir or tempfile.mkdtemp(prefix="mg-kafka-"))
    cluster = KafkaCluster(work, nodes=args.nodes, cluster_id=args.cluster_id)
    cluster.start()
    print(f"bootstrap={cluster.bootstrap} cluster_id={cluster.cluster_id} dir={work} "
          f"started_in={cluster.start_seconds:.1f}s", flush=True)
    # Wait for SIGINT or SIGTERM with both blocked (sigwait needs them blocked)
    # and at their default action: a background job of a non-interactive shell
    # starts with SIGINT ignored, and an ignored signal is discarded, never
    # waited for (the caller's SIGINT would then hang it).
    stop = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    for s in stop:
        signal.signal(s, signal.SIG_DFL)
    try:
        signal.sigwait(stop)
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
