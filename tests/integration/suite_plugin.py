"""How the integration suite runs: on pytest-xdist workers, with a leak check after every
test and the slowest tests listed at the end (loaded by conftest.py).

- **Workers.** `scripts/test.sh` runs the suite on several pytest-xdist workers
  (`--dist loadgroup`). Each worker owns a port range (`harness.port_range`), its own
  temporary directory and its own session clusters (`kafka1`, `kafka3`). Tests that share
  a module-scoped fixture (a SASL or TLS cluster, a module's mirrorguard) are put in one
  xdist group, so that fixture starts once, on one worker; so are the users of `kafka3`
  (three JVMs), so only one worker starts it.
- **Leaks.** After a test's own fixtures are torn down, no process it started may still
  run and no listening socket it opened may still be open: a child process or a listening
  socket of this worker that appeared during the test, or during a function-scoped
  fixture, and is still there fails the test at teardown (and is killed, so the next test
  starts clean). Processes and sockets that appear while a module- or session-scoped
  fixture is set up belong to that fixture until it is finalized.
- **Slowest tests.** The controller adds up setup, call and teardown per test and prints
  the slowest `MG_SLOWEST` (default 15) at the end of every run.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

SLOWEST_DEFAULT = 15


# --------------------------------------------------------------------------
# /proc: this worker's child processes and listening sockets


def _children(root: int) -> set[int]:
    """Live (not zombie) descendants of `root`."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] == "Z":
            continue
        parent[int(entry)] = int(fields[1])
    out: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier and p not in out}
        out |= frontier
    return out


def _listening_inodes() -> dict[int, str]:
    """Socket inode -> "address:port" of every TCP socket in LISTEN state."""
    out: dict[int, str] = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "0A":  # TCP_LISTEN
                continue
            port = int(f[1].rsplit(":", 1)[1], 16)
            out[int(f[9])] = f"port {port}"
    return out


def _sockets_of(pid: int) -> set[int]:
    inodes: set[int] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _own_listeners() -> dict[int, str]:
    """Listening sockets held by this process itself (a test's Python server)."""
    listening = _listening_inodes()
    return {i: listening[i] for i in _sockets_of(os.getpid()) if i in listening}


class _Ledger:
    """Which children and listening sockets belong to a fixture that outlives a test."""

    def __init__(self) -> None:
        self.kept_pids: dict[int, str] = {}  # pid -> fixture name
        self.kept_socks: dict[int, str] = {}  # inode -> fixture name
        self.by_fixture: dict[int, tuple[set[int], set[int]]] = {}  # id(fixturedef) -> (pids, inodes)
        self.reported_socks: set[int] = set()

    def snapshot(self) -> tuple[set[int], set[int]]:
        return _children(os.getpid()), set(_own_listeners())

    def keep(self, fixturedef, before: tuple[set[int], set[int]]) -> None:
        pids, socks = self.snapshot()
        new_pids = pids - before[0] - set(self.kept_pids)
        new_socks = socks - before[1] - set(self.kept_socks)
        for p in new_pids:
            self.kept_pids[p] = fixturedef.argname
        for s in new_socks:
            self.kept_socks[s] = fixturedef.argname
        held = self.by_fixture.setdefault(id(fixturedef), (set(), set()))
        held[0].update(new_pids)
        held[1].update(new_socks)

    def release(self, fixturedef) -> None:
        pids, socks = self.by_fixture.pop(id(fixturedef), (set(), set()))
        for p in pids:
            self.kept_pids.pop(p, None)
        for s in socks:
            self.kept_socks.pop(s, None)

    def leaks(self) -> tuple[list[str], set[int]]:
        problems: list[str] = []
        pids = _children(os.getpid()) - set(self.kept_pids)
        for p in sorted(pids):
            try:
                cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            problems.append(f"process {p} still running: {cmd[:200]}")
        listening = _own_listeners()
        for inode, where in sorted(listening.items()):
            if inode not in self.kept_socks and inode not in self.reported_socks:
                # A socket of this process cannot be closed from here: it is reported
                # once, by the test that left it.
                self.reported_socks.add(inode)
                problems.append(f"this worker still listens on {where}")
        return problems, pids


_LEDGER = _Ledger()


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if fixturedef.scope == "function":
        return (yield)
    before = _LEDGER.snapshot()
    try:
        return (yield)
    finally:
        _LEDGER.keep(fixturedef, before)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_post_finalizer(fixturedef, request):
    try:
        return (yield)
    finally:
        if fixturedef.scope != "function":
            _LEDGER.release(fixturedef)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield
    problems, pids = _LEDGER.leaks()
    if problems:
        for p in pids:
            try:
                os.killpg(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                os.kill(p, signal.SIGKILL)
                os.waitpid(p, 0)
            except (ProcessLookupError, ChildProcessError, PermissionError):
                pass
        raise AssertionError("left behind after the test's own teardown:\n  " + "\n  ".join(problems))
    return result


# --------------------------------------------------------------------------
# xdist groups: a module-scoped fixture (or kafka3) starts on one worker only

SHARED_SESSION_GROUPS = {"kafka3": "kafka3"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        group = None
        for name in info.names_closure:
            defs = info.name2fixturedefs.get(name)
            if not defs:
                continue
            if name in SHARED_SESSION_GROUPS:
                group = SHARED_SESSION_GROUPS[name]
                break
            if defs[-1].scope == "module":
                group = item.module.__name__
        if group is not None and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group))


# --------------------------------------------------------------------------
# the slowest tests, setup + call + teardown, printed by the controller

_TOTALS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    _TOTALS[report.nodeid] = _TOTALS.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput") or not _TOTALS:
        return
    n = int(os.environ.get("MG_SLOWEST", SLOWEST_DEFAULT))
    terminalreporter.section(f"slowest {n} tests (setup + call + teardown)")
    for nodeid, secs in sorted(_TOTALS.items(), key=lambda kv: -kv[1])[:n]:
        terminalreporter.write_line(f"{secs:8.1f}s  {nodeid}")
