"""A long step where the host waits on asynchronous work is not called a hang on first attach.

The CPU stand-in for a GPU step longer than the window: each rank's step runs on another thread
(as kernels run on a GPU's stream) for 8 s while the host waits in ``torch.futures.Future.wait()``,
as a GPU rank waits at ``loss.item()`` (tui/planted.py ``longstep``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from trainwatch.probes.live import LocalSource

pytestmark = [pytest.mark.job, pytest.mark.slow]


def test_long_step_is_not_a_hang_on_first_attach_nor_later(planted):
    job = planted("longstep", nproc=2, step_s=8.0, deadline=90, wait=False)
    job.wait_for_log(r"^step 1 loss", timeout=60)  # a step just ended: every rank now waits 8 s
    source = LocalSource(job.pid, gpu=False)  # the default window
    try:
        first = source.poll()
        later, end = [], time.monotonic() + 18.0  # two more steps, polled as the live view polls
        while time.monotonic() < end:
            later.append(source.poll())
            time.sleep(1.0)
    finally:
        source.close()
    assert [(r.phase, r.op, r.state) for r in first.ranks] == [("gpu_wait", "Future.wait", "stuck")] * 2, first.ranks
    assert first.verdict.kind == "unknown", first.verdict
    assert first.verdict.summary.startswith("all 2 ranks wait on their GPU (Future.wait) at train.py:")
    assert "no collective state yet: not called a hang before 120 s (the floor for a GPU wait)" in first.verdict.summary
    # torchrun's ranks and the launcher share job.log: its growth is shown, nobody's progress in particular
    assert all(r.log is not None and not r.log.own and r.log.age_s < 8.0 for r in first.ranks), first.ranks
    assert "last output" in first.verdict.summary and "(a shared log)" in first.verdict.summary
    kinds = [s.verdict.kind for s in later]
    assert "hang" not in kinds and "healthy" in kinds, [s.verdict.summary for s in later]


def test_snapshot_command_says_what_is_missing_instead_of_hang(planted):
    job = planted("longstep", nproc=2, step_s=10.0, deadline=90, wait=False)
    job.wait_for_log(r"^step 1 loss", timeout=60)  # the next 10 s: every rank waits
    cmd = [sys.executable, "-m", "trainwatch.tui", "snapshot", str(job.pid), "--json"]  # the default window
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    verdict = json.loads(out.stdout)["verdict"]
    assert verdict["kind"] == "unknown", verdict
    assert "wait on their GPU (Future.wait)" in verdict["summary"] and "no collective state yet" in verdict["summary"]
