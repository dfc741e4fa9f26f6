"""A launcher waiting for a node that never joins is reported as `rendezvous`, naming the node and
the ranks it would run: two torchrun "nodes" on this machine (--nnodes 2, one store), the other
launcher never started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from real_jobs import PLANTED, TORCHRUN, free_port, wait_until

pytestmark = pytest.mark.job


def waiting_launcher(tmp_path, layout: list[str], port: int) -> subprocess.Popen:
    script = tmp_path / "train.py"
    script.write_text(PLANTED.read_text())
    cmd = [*TORCHRUN, "--nnodes", "2", *layout, "--nproc-per-node", "2", str(script), "--deadline", "30"]
    return subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env={**os.environ, "TORCHELASTIC_MAX_CALLTIME": "30"})


def in_rendezvous(pid: int, wanted: str) -> dict | None:
    out = subprocess.run([sys.executable, "-m", "trainwatch.tui.cli", "snapshot", str(pid), "--json",
                          "--window", "1"], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in out.stderr, out.stderr
    data = json.loads(out.stdout) if out.stdout.strip() else None  # none while the launcher starts
    # until the launcher is in its rendezvous and (for a store it serves) has it listening
    return data if data and data["verdict"]["kind"] == "rendezvous" and wanted in data["verdict"]["summary"] else None


def test_node_1_never_started_is_named_from_node_0(tmp_path):
    port = free_port()
    proc = waiting_launcher(tmp_path, ["--node-rank", "0", "--rdzv-backend", "static", "--master-addr", "127.0.0.1",
                                       "--master-port", str(port)], port)
    try:
        # slow to start under load; it gives up after 30 s
        data = wait_until(lambda: in_rendezvous(proc.pid, "node 1"), 25, "the launcher to wait in rendezvous",
                          interval=0.5)
        verdict = data["verdict"]
        assert verdict["culprits"] == [2, 3], verdict
        assert "waiting in rendezvous" in verdict["summary"]
        assert "other nodes have not joined" in verdict["summary"]  # --nnodes 2
        assert (f"node 1 (ranks 2-3) has not connected to its store at 127.0.0.1:{port} (1 of 2 nodes joined)"
                in verdict["summary"]), verdict
        assert data["job"]["waiting_rendezvous"] is True and data["job"]["world_size"] == 4
        assert data["job"]["rendezvous"]["host_pid"] == proc.pid and data["job"]["rendezvous"]["missing_ranks"] == [2, 3]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_node_0_that_serves_the_store_never_started_is_named_from_node_1(tmp_path):
    port = free_port()
    proc = waiting_launcher(tmp_path, ["--node-rank", "1", "--rdzv-backend", "static", "--master-addr", "127.0.0.1",
                                       "--master-port", str(port)], port)
    try:
        data = wait_until(lambda: in_rendezvous(proc.pid, "node 0"), 25, "the launcher to wait in rendezvous",
                          interval=0.5)
        assert data["verdict"]["culprits"] == [0, 1], data["verdict"]
        assert (f"node 0 (ranks 0-1), whose launcher serves the store at 127.0.0.1:{port}, has not started"
                in data["verdict"]["summary"]), data["verdict"]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_c10d_rendezvous_says_how_many_nodes_are_missing(tmp_path):
    """c10d numbers nodes as they join: how many are missing is known, not which."""
    port = free_port()
    proc = waiting_launcher(tmp_path, ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"], port)
    try:
        data = wait_until(lambda: in_rendezvous(proc.pid, "1 of 2 nodes"), 25, "the launcher to wait in rendezvous",
                          interval=0.5)
        assert data["verdict"]["culprits"] == [], data["verdict"]
        assert f"1 of 2 nodes has not connected to its store at 127.0.0.1:{port} (1 joined)" in data["verdict"]["summary"]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
