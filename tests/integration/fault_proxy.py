"""A fault proxy between parts of a test topology: Toxiproxy (v2.5.0, installed by
scripts/install-test-deps.sh as .tools/bin/toxiproxy-server) on loopback, driven through its
HTTP API. Each proxy listens on a port of this worker's range and forwards to one upstream;
toxics on it reset connections, add latency or black-hole the traffic until removed.

A broker reached through a proxy must advertise the proxy's port, or its clients would go
around it after their first Metadata: ``KafkaCluster(..., behind_proxy={node_id: port})``
does that on its PLAINTEXT listener and keeps a DIRECT listener (its ``bootstrap``, and the
inter-broker listener) for everything the faults are not meant for.

    fp = fault_proxy                                    # the fixture: one server per test
    p = fp.proxy("src-1", upstream_port=broker_port)    # p.port: where clients connect
    with p.toxic("reset_peer", timeout=0):              # every connection reset at once
        ...
    with p.toxic("timeout", timeout=0):                 # a black hole: nothing passes
        ...
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import harness
from harness import HOST, HarnessError, ManagedProcess

TOXIPROXY_BIN = Path(os.environ.get("TOXIPROXY_BIN", harness.ROOT / ".tools" / "bin" / "toxiproxy-server"))


class Proxy:
    """One proxy of a :class:`FaultProxy` server."""

    def __init__(self, server: "FaultProxy", name: str, port: int, upstream_port: int):
        self.server = server
        self.name = name
        self.port = port
        self.upstream_port = upstream_port
        self._toxics = 0

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def add_toxic(self, kind: str, stream: str = "downstream", toxicity: float = 1.0, **attributes) -> str:
        """Adds a toxic (`kind`: reset_peer, latency, timeout, bandwidth, slicer, limit_data)
        to the traffic towards the client (`downstream`) or the upstream; returns its name."""
        self._toxics += 1
        name = f"{kind}-{stream}-{self._toxics}"
        self.server.api("POST", f"/proxies/{self.name}/toxics", {
            "name": name, "type": kind, "stream": stream, "toxicity": toxicity, "attributes": attributes})
        return name

    def remove_toxic(self, name: str) -> None:
        self.server.api("DELETE", f"/proxies/{self.name}/toxics/{name}")

    @contextlib.contextmanager
    def toxic(self, kind: str, stream: str = "downstream", **attributes):
        """The toxic while the block runs, removed after it (also when it raises)."""
        name = self.add_toxic(kind, stream, **attributes)
        try:
            yield name
        finally:
            self.remove_toxic(name)


class FaultProxy:
    """A Toxiproxy server on loopback (its API on a port of this worker's range)."""

    def __init__(self, work_dir: Path, name: str = "faults"):
        if not TOXIPROXY_BIN.exists():
            raise HarnessError(f"{TOXIPROXY_BIN} missing (bash scripts/install-test-deps.sh)")
        self.api_port = harness.free_port()
        self.proxies: dict[str, Proxy] = {}
        self.process = ManagedProcess(name, [TOXIPROXY_BIN, "-host", HOST, "-port", self.api_port],
                                      Path(work_dir) / f"{name}.log")
        harness.wait_until(self._answers, 15, interval=0.05, what=f"toxiproxy answering on {self.api_port}")

    def _answers(self) -> bool:
        if not self.process.alive():
            raise HarnessError(f"toxiproxy exited:\n{self.process.log_text()[-2000:]}")
        self.api("GET", "/version")
        return True

    def api(self, method: str, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://{HOST}:{self.api_port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raise HarnessError(f"toxiproxy {method} {path}: {e.code} {e.read()[:300]!r}") from e
        return json.loads(raw) if raw.strip().startswith((b"{", b"[")) else raw

    def proxy(self, name: str, upstream_port: int, port: int | None = None) -> Proxy:
        """A proxy listening on `port` (a free one of this worker's range if None) and
        forwarding to `upstream_port` on loopback (which need not listen yet)."""
        port = port or harness.free_port(exclude={self.api_port, upstream_port})
        self.api("POST", "/proxies", {"name": name, "listen": f"{HOST}:{port}",
                                      "upstream": f"{HOST}:{upstream_port}", "enabled": True})
        p = Proxy(self, name, port, upstream_port)
        self.proxies[name] = p
        return p

    def stop(self) -> None:
        self.process.stop()
