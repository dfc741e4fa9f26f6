"""A job in a crash loop: torchrun `--max-restarts 3` starts the group again each time rank 1 raises
ValueError at the same step. What ended each attempt is history: a snapshot mid-attempt and at a
crash says so (never "healthy"), `watch` alerts the first crash and then the loop, once, and `open`
on the log it left tells the loop too. A job that restarts once and then runs on reads as such."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from real_jobs import PlantedJob
from watching import TRAINWATCH, Watch

pytestmark = [pytest.mark.job, pytest.mark.slow]
RAISED = "rank 1 raised ValueError: bad batch at step 12"


def snapshot(pid: int, window: float) -> dict:
    out = subprocess.run([*TRAINWATCH, "snapshot", str(pid), "--json", "--window", str(window)],
                         capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def crash_loop(tmp_path_factory):
    """(watch events, mid-attempt snapshot, at-crash snapshot, the job): the whole cycle, watched."""
    workdir = tmp_path_factory.mktemp("loop")
    with PlantedJob(workdir / "job", "raiseat", nproc=2, deadline=60, step_s=0.3, max_restarts=3,
                    script_args=["--culprit", "1", "--fail-step", "12"]) as job:
        job.wait_for_ranks(steps=0)
        watch = Watch(job.pid, workdir)
        job.wait_for_log(r"scenario raiseat attempt 1", timeout=90)
        mid = snapshot(job.pid, 1.0)  # attempt 1 is ~4 s from its crash
        job.wait_for_log(r"scenario raiseat attempt 2", timeout=90)
        time.sleep(1.0)
        at_crash = snapshot(job.pid, 6.0)  # its window holds attempt 2's crash (~4 s in)
        watch.until(lambda e: e["event"] == "job_ended", 120)
        watch.finish()
    return watch.events, mid, at_crash, job


def test_a_snapshot_mid_attempt_names_the_loop_not_a_healthy_job(crash_loop):
    _, mid, _, _ = crash_loop
    verdict = mid["verdict"]
    assert verdict["kind"] == "crashed" and verdict["culprits"] == [1], verdict
    assert verdict["summary"].startswith(f"restarted once; attempt 0 ended when {RAISED} at job/train.py:"), verdict
    # what attempt 1 itself reads this early ("runs", or on a loaded machine a first look's "reads …
    # so far") is said beside the loop, never instead of it
    assert "attempt 1 runs" in verdict["summary"] or "attempt 1 reads" in verdict["summary"], verdict
    assert mid["job"]["attempt"] == 1 and mid["job"]["attempts"][0]["rank"] == 1


def test_a_snapshot_at_a_crash_names_the_same_end_again(crash_loop):
    _, _, at_crash, _ = crash_loop
    verdict = at_crash["verdict"]
    assert verdict["kind"] == "crashed" and verdict["culprits"] == [1], verdict
    assert "ValueError: bad batch at step 12" in verdict["summary"] and "restarted" in verdict["summary"], verdict


def test_watch_alerts_the_crash_then_the_loop_once_and_never_a_healthy_job_between(crash_loop):
    events, _, _, _ = crash_loop
    alerts = [e for e in events if e["event"] == "crashed"]
    assert [a["culprits"] for a in alerts] == [[1], [1]], alerts
    assert alerts[1]["summary"].startswith("a crash loop: rank 1 died: exit code 1"), alerts[1]
    # raised once, at the second end; a loaded machine may bring the launcher's news of it after the third
    assert re.search(r"the same end as (the attempt before it \(restarted once\)|each of the 2 attempts before it "
                     r"\(restarted 2 times\))", alerts[1]["summary"]), alerts[1]
    first_crash = next(i for i, e in enumerate(events) if e["event"] == "crash")
    assert not [e for e in events[first_crash:] if e["event"] == "verdict" and e["verdict"] == "healthy"], events
    ended = next(e for e in events if e["event"] == "job_ended")
    assert "restarted 3 times" in ended["message"], ended
    assert len([e for e in events if e["event"] == "crash" and e["culprits"] == [1]]) >= 4  # one per attempt


def test_open_on_the_log_it_left_tells_the_loop(crash_loop):
    _, _, _, job = crash_loop
    out = subprocess.run([*TRAINWATCH, "open", str(job.log), "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    verdict = json.loads(out.stdout)["verdict"]
    assert verdict["kind"] == "crashed" and verdict["culprits"] == [1], verdict
    assert verdict["summary"].startswith("a crash loop: rank 1 died") and "restarted 3 times" in verdict["summary"]


def test_a_job_that_restarts_once_and_then_runs_on_reads_as_such(tmp_path):
    """Until attempt 1 has run twice as long as attempt 0 did, it may end the same way: then it runs on."""
    with PlantedJob(tmp_path / "job", "raiseat", nproc=2, deadline=120, step_s=0.3, max_restarts=2,
                    script_args=["--culprit", "1", "--fail-step", "8", "--fail-attempts", "1"]) as job:
        job.wait_for_log(r"scenario raiseat attempt 1", timeout=90)
        early = snapshot(job.pid, 1.0)
        deadline = time.monotonic() + 80
        later = early
        while later["verdict"]["kind"] != "healthy" and time.monotonic() < deadline:
            time.sleep(2.0)
            later = snapshot(job.pid, 1.0)
    assert early["verdict"]["kind"] == "crashed" and early["verdict"]["culprits"] == [1], early["verdict"]
    verdict = later["verdict"]
    assert verdict["kind"] == "healthy" and verdict["culprits"] == [], verdict
    assert "restarted once; attempt 0 ended when rank 1 raised ValueError: bad batch at step 8" in verdict["summary"]
    assert "it runs on" in verdict["summary"]
