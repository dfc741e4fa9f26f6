"""A launcher waiting for a node that never joins is reported as `rendezvous`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from real_jobs import PLANTED, TORCHRUN, free_port, wait_until


def test_launcher_waiting_for_a_missing_node(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PLANTED.read_text())
    cmd = [*TORCHRUN, "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "2", "--rdzv-backend", "static",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script), "--deadline", "30"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env={**os.environ, "TORCHELASTIC_MAX_CALLTIME": "30"})

    def in_rendezvous() -> dict | None:
        out = subprocess.run([sys.executable, "-m", "trainwatch.tui.cli", "snapshot", str(proc.pid), "--json",
                              "--window", "1"], capture_output=True, text=True, timeout=60)
        data = json.loads(out.stdout) if out.stdout.strip() else None  # none while the launcher starts
        return data if data and data["verdict"]["kind"] == "rendezvous" else None

    try:
        # Until the launcher is in its rendezvous (slow to start under load; it gives up after 30 s).
        data = wait_until(in_rendezvous, 25, "the launcher to wait in rendezvous", interval=0.5)
        assert data["verdict"]["kind"] == "rendezvous", data["verdict"]
        assert "waiting in rendezvous" in data["verdict"]["summary"]
        assert "other nodes have not joined" in data["verdict"]["summary"]  # --nnodes 2
        assert data["job"]["waiting_rendezvous"] is True and data["job"]["world_size"] == 4
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
