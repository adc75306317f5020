"""The test bed's port plan (tests/integration/kafka_broker.py), without a broker: every
listener port of every node of a ``KafkaCluster`` is distinct whatever options are given,
including a caller-chosen first port and an OS that hands recently closed ports out again."""

from __future__ import annotations

import itertools

import pytest

import kafka_broker
from kafka_broker import KafkaCluster, listener_ports


def _all_ports(cluster: KafkaCluster) -> list[int]:
    return [p for n in cluster.nodes
            for p in (n.port, n.controller_port, n.sasl_port, n.ssl_port, n.sasl_ssl_port) if p is not None]


@pytest.fixture
def reusing_os(monkeypatch):
    """`_free_ports` as an OS that reuses ports: each call returns distinct ports of a small
    pool, but successive calls overlap (and the pool holds the caller's chosen port 40000)."""
    pool = list(range(40000, 40020))
    start = itertools.count()

    def fake(n: int) -> list[int]:
        s = next(start) * 3
        return [pool[(s + j) % len(pool)] for j in range(n)]

    monkeypatch.setattr(kafka_broker, "_free_ports", fake)
    return pool


@pytest.mark.parametrize("nodes", [1, 3])
@pytest.mark.parametrize("sasl,ssl", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("port", [None, 40000])
def test_every_listener_port_distinct(reusing_os, nodes, sasl, ssl, port):
    plan = listener_ports(nodes, port=port, sasl=sasl, ssl=ssl)
    assert len(plan) == nodes
    used = [p for node in plan for p in node if p is not None]
    assert len(used) == len(set(used)) == nodes * (2 + sasl + ssl + (sasl and ssl)), plan
    assert all((node[2] is not None) == sasl and (node[3] is not None) == ssl
               and (node[4] is not None) == (sasl and ssl) for node in plan), plan
    if port is not None:
        assert plan[0][0] == port


def test_cluster_with_chosen_port_sasl_and_ssl(reusing_os, tmp_path):
    c = KafkaCluster(tmp_path, nodes=3, port=40000, sasl={"alice": "a"}, ssl=object())
    ports = _all_ports(c)
    assert len(ports) == len(set(ports)) == 15, [vars(n) for n in c.nodes]
    assert c.port == 40000 and c.node_ids == [1, 2, 3]
    assert c.sasl_ssl_bootstrap.count(":") == 3


def test_real_ports_with_chosen_port(tmp_path):
    chosen = kafka_broker._free_ports(1)[0]
    c = KafkaCluster(tmp_path, nodes=3, port=chosen, sasl={"alice": "a"}, ssl=object())
    ports = _all_ports(c)
    assert len(ports) == len(set(ports)) == 15 and c.port == chosen
