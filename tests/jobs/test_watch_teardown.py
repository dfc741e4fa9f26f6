"""`watch` at the first death: the other ranks' stacks are read before the launcher tears them down.

Measured, not promised: how much a real torchrun teardown leaves depends on the race between the
kernel's exit event (heard at the death) and torchrun's 0.1 s monitor interval. Each run prints
what it got.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from real_jobs import PlantedJob, rank_stuck_at, wait_until

TRAINWATCH = [sys.executable, "-m", "trainwatch.tui.cli"]
pytestmark = pytest.mark.job
READ = re.compile(r"at the first death, (?:stacks of (\d+) of (\d+) other ranks read in (\d+) ms"
                  r"|every other rank had ended too)")


def test_first_death_reads_the_survivors_first(tmp_path):
    """Rank 0 is SIGKILLed while rank 2 sleeps (the straggler) and rank 1 waits on the ring: rank 1
    fails at once on the closed connection, rank 2 lives until torchrun's SIGTERM."""
    out = tmp_path / "watch"
    with PlantedJob(tmp_path / "job", "straggler", nproc=3, deadline=40) as job:
        pids = job.wait_for_ranks()
        wait_until(lambda: rank_stuck_at(job.script, "# stuck in its own work"), 30, "the straggler's sleep")
        watch = subprocess.Popen([*TRAINWATCH, "watch", str(job.pid), "--out", str(out), "--interval", "30"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            time.sleep(2.0)  # the catcher tracks the ranks
            os.kill(pids[0], signal.SIGKILL)
            text, _ = watch.communicate(timeout=60)
        finally:
            if watch.poll() is None:
                watch.kill()
    found = READ.search(text)
    assert found, text
    print(f"\n[teardown] {found.group(0)}")
    assert "crash rank 0" in text and "SIGKILL" in text, text
    if found.group(1) and int(found.group(1)) > 0:  # what was read is in the bundle, labelled
        stacks = list(out.glob("trainwatch-*/ranks/*/stacks.txt"))
        assert any("read at the job's first death" in p.read_text() for p in stacks), text
