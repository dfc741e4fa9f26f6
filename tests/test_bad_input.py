"""Bad input: a clear message and a non-zero exit, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def trainwatch(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainwatch.tui.cli", *args], capture_output=True, text=True,
                          timeout=60, env=env)


def assert_clean_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode not in (0, None)
    assert "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def test_no_such_pid():
    proc = trainwatch("snapshot", "999999999")
    assert_clean_error(proc, "no process with PID 999999999")
    assert proc.returncode == 3


def test_not_a_job():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        proc = trainwatch("snapshot", str(sleeper.pid))
        assert_clean_error(proc, "is not a Python training job")
        assert proc.returncode == 4
    finally:
        sleeper.kill()
        sleeper.wait()


def test_permission_denied_says_why_and_what_to_do():
    # Another user's process: drop to `nobody` and look at our own (root's) Python process.
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                               sys.executable, "-m", "trainwatch.tui.cli", "snapshot", str(target.pid)],
                              capture_output=True, text=True, timeout=60, cwd="/")
        if "setpriv" in proc.stderr and proc.returncode == 127:
            pytest.skip("setpriv unavailable")
        assert_clean_error(proc, "permission denied", "uid 0")
        assert proc.returncode == 5
    finally:
        target.kill()
        target.wait()


def test_pyspy_missing():
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        proc = trainwatch("snapshot", str(target.pid), env={**os.environ, "TRAINWATCH_PYSPY": "/nonexistent/py-spy"})
        assert_clean_error(proc, "py-spy is not installed", "pip install py-spy")
        assert proc.returncode == 6
    finally:
        target.kill()
        target.wait()


def test_no_pid_given():
    assert_clean_error(trainwatch("snapshot"), "give a PID")


def test_job_id_from_a_login_node_whose_nodes_cannot_be_reached():
    # No rank of job 4242 here: the named node is asked instead; it is down, and says so.
    proc = trainwatch("snapshot", "--match-job-id", "4242", "--hosts", "127.0.0.1", "--ssh-option", "Port=1",
                      "--remote-timeout", "5")
    assert_clean_error(proc, "no node of the job could be read", "127.0.0.1: unreachable")


def test_job_id_with_no_node_to_ask():
    assert_clean_error(trainwatch("snapshot", "--match-job-id", "4242"), "no job with id 4242")
