"""Hangs judged against each job's own rhythm, on real jobs polled like the live view polls them."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from trainwatch.probes.live import LocalSource

pytestmark = [pytest.mark.job, pytest.mark.slow]


def poll_for(source: LocalSource, seconds: float, every: float = 1.0) -> list:
    snapshots, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        snapshots.append(source.poll())
        time.sleep(every)
    return snapshots


def test_slow_steps_are_not_a_hang_once_the_rhythm_is_seen(planted):
    # Every step sleeps 4 s (longer than the 2 s window): healthy, just slow.
    job = planted("healthy", nproc=2, step_s=4.0, deadline=60)
    source = LocalSource(job.pid, window=2.0, gpu=False)
    try:
        warmup = poll_for(source, 9.0)  # two steps: each rank is seen coming out of its long sleep
        later = poll_for(source, 8.0)
    finally:
        source.close()
    assert any(s.verdict.kind == "healthy" for s in warmup)
    assert [s.verdict.kind for s in later] == ["healthy"] * len(later), [s.verdict.summary for s in later]


def test_same_slow_steps_with_a_fixed_threshold_are_called_stuck(planted):
    # Control: --stuck-after 2 ignores the rhythm, so the 4 s sleeps do read as stuck.
    job = planted("healthy", nproc=2, step_s=4.0, deadline=60)
    source = LocalSource(job.pid, window=2.0, gpu=False, stuck_after=2.0)
    try:
        snapshots = poll_for(source, 12.0)
    finally:
        source.close()
    assert any(s.verdict.kind != "healthy" for s in snapshots[3:])


def test_fast_step_hang_is_flagged_within_the_window(planted):
    job = planted("straggler", nproc=3, step_s=0.05, deadline=60, wait=False)
    job.wait_for_ranks()
    source = LocalSource(job.pid, window=2.0, gpu=False)
    try:
        started = time.monotonic()
        first = source.poll()  # the straggler stops at step 3, a fraction of a second after start
        elapsed = time.monotonic() - started
    finally:
        source.close()
    assert (first.verdict.kind, first.verdict.culprits) == ("straggler", (2,)), first.verdict
    assert elapsed < 2.0 + 1.5  # one window plus the sampling itself


def test_cli_stuck_after_overrides_the_threshold(planted):
    job = planted("straggler", nproc=2, deadline=60)
    cmd = [sys.executable, "-m", "trainwatch.tui", "snapshot", str(job.pid), "--json", "--window", "2"]
    default = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout)
    patient = json.loads(subprocess.run(cmd + ["--stuck-after", "120"], capture_output=True, text=True,
                                        timeout=60).stdout)
    assert default["verdict"]["kind"] == "straggler"
    assert [r["state"] for r in default["ranks"]] == ["stuck", "stuck"]
    assert [r["state"] for r in patient["ranks"]] == ["running", "running"]  # 2 s is not 120 s
    bad = subprocess.run(cmd + ["--stuck-after", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "seconds greater than 0" in bad.stderr and "Traceback" not in bad.stderr
