"""An mp.spawn job is found and judged; a target left stopped by a dying py-spy is resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from real_jobs import free_port, kill_tree
from trainwatch.probes.read.processes import procfs
from trainwatch.probes.read.stacks.pyspy import _resume_if_we_stopped

SPAWNED = """
import os, sys, threading, time
import torch.distributed as dist
import torch.multiprocessing as mp

def worker(rank, port):
    threading.Timer(60, lambda: os._exit(124)).start()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    import torch
    t = torch.ones(4)
    if rank == 1:
        dist.all_gather([torch.zeros(4), torch.zeros(4)], t)  # only rank 1 goes here
    dist.all_reduce(t)
    print("scenario done", rank, flush=True)

if __name__ == "__main__":
    mp.spawn(worker, args=(int(sys.argv[1]),), nprocs=2)
"""


def test_mp_spawn_job(tmp_path):
    script = tmp_path / "spawned.py"
    script.write_text(SPAWNED)
    proc = subprocess.Popen([sys.executable, str(script), str(free_port())], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 45  # until both ranks reached their collectives (slow under load)
        while True:
            out = subprocess.run([sys.executable, "-m", "trainwatch.tui.cli", "snapshot", str(proc.pid), "--json",
                                  "--window", "1.5"], capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            data = json.loads(out.stdout)
            if data["verdict"]["kind"] == "mismatch" or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert data["job"]["launcher"] == "mp.spawn" and data["job"]["world_size"] == 2
        assert [r["rank"] for r in data["ranks"]] == [0, 1]
        assert data["verdict"]["kind"] == "mismatch" and "all_gather" in data["verdict"]["summary"]
    finally:
        kill_tree(proc.pid)
        proc.wait()


def test_a_target_we_left_stopped_is_resumed_and_one_stopped_before_is_not():
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.3)
        os.kill(target.pid, signal.SIGSTOP)  # as a py-spy killed mid-attach would leave it
        time.sleep(0.2)
        assert procfs.state_letter(target.pid) == "T"
        _resume_if_we_stopped(target.pid, was_stopped=True)  # stopped before we came: leave it
        assert procfs.state_letter(target.pid) == "T"
        _resume_if_we_stopped(target.pid, was_stopped=False)  # our doing: undo it
        time.sleep(0.2)
        assert procfs.state_letter(target.pid) in ("S", "R")
    finally:
        target.kill()
        target.wait()
