"""A launcher waiting for a node that never joins is reported as `rendezvous`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from real_jobs import PLANTED, TORCHRUN, free_port


def test_launcher_waiting_for_a_missing_node(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PLANTED.read_text())
    cmd = [*TORCHRUN, "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "2", "--rdzv-backend", "static",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script), "--deadline", "30"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env={**os.environ, "TORCHELASTIC_MAX_CALLTIME": "30"})
    try:
        time.sleep(4)
        out = subprocess.run([sys.executable, "-m", "trainwatch.tui.cli", "snapshot", str(proc.pid), "--json",
                              "--window", "1"], capture_output=True, text=True, timeout=60)
        data = json.loads(out.stdout)
        assert data["verdict"]["kind"] == "rendezvous", data["verdict"]
        assert "waiting in rendezvous" in data["verdict"]["summary"]
        assert data["job"]["waiting_rendezvous"] is True and data["job"]["world_size"] == 4
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
