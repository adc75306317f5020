"""The suite's own leak check (suite_plugin.py), run on small test files in a pytest of
their own: a test that leaves a process or a listening socket behind fails at teardown
(and the process is killed); what a module-scoped fixture starts belongs to it until the
module ends."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent

LEAKY = '''
import socket, subprocess, pytest

PIDS = []

@pytest.fixture(scope="module")
def module_child():
    p = subprocess.Popen(["sleep", "60"])
    yield p
    p.kill(); p.wait()

def test_leaves_a_process():
    PIDS.append(subprocess.Popen(["sleep", "60"], start_new_session=True).pid)
    with open("{pidfile}", "w") as f:
        f.write(str(PIDS[-1]))

LISTENER = []

def test_leaves_a_listening_socket():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); LISTENER.append(s)

def test_cleans_up_after_itself():
    p = subprocess.Popen(["sleep", "60"]); p.kill(); p.wait()
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); s.close()

def test_module_fixture_process_is_not_a_leak(module_child):
    assert module_child.poll() is None

def test_module_fixture_still_not_a_leak(module_child):
    assert module_child.poll() is None
'''

CONFTEST = 'pytest_plugins = ["suite_plugin"]\n'


def test_leaked_process_and_socket_fail_the_test(tmp_path):
    pidfile = tmp_path / "leaked.pid"
    (tmp_path / "test_leaky.py").write_text(textwrap.dedent(LEAKY.format(pidfile=pidfile)))
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    env.pop("PYTEST_XDIST_WORKER", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", str(tmp_path)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "ERROR at teardown of test_leaves_a_process" in out, out
    assert "sleep 60" in out and "still running" in out, out
    assert "ERROR at teardown of test_leaves_a_listening_socket" in out, out
    assert "still listens on port" in out, out
    for name in ("test_cleans_up_after_itself", "test_module_fixture_process_is_not_a_leak",
                 "test_module_fixture_still_not_a_leak"):
        assert f"PASSED test_leaky.py::{name}" in out, out
    assert "5 passed, 2 errors" in out, out
    # The leaked process was killed by the check.
    pid = int(pidfile.read_text())
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]
