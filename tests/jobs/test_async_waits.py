"""Waits on a peer, whatever their shape: `work.wait()` of an async all_reduce and a pipeline's
isend/irecv `.wait()` (no collective call on the Python stack), blocking send/recv, and process
subgroups with one slow rank. The waiting rank's top Python frame is the user's line (`Work.wait`
is a C++ method); the native frames decide (`c10d::Work::wait`, `gloo ... waitRecv/waitSend`): a c10d
wait is never a lock, and the culprit is the rank that is not waiting."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from real_jobs import PlantedJob, rank_stuck_at, wait_until

pytestmark = [pytest.mark.job]
TRAINWATCH = [sys.executable, "-m", "trainwatch.tui.cli"]


def snapshot(pid: int) -> dict:
    proc = subprocess.run([*TRAINWATCH, "snapshot", str(pid), "--json"], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("scenario, nproc, waits", [
    ("async", 2, "wait in Work.wait (async collective)"),
    ("pipeline", 3, "wait in send"),
    ("sendrecv", 3, "wait in send"),  # blocking send/recv: rank 1 blocks sending to rank 2, rank 0 sending to rank 1
    ("subgroup", 4, "wait in all_reduce"),  # pairs {0,1}, {2,3}: rank 2 waits in its pair's, 0-1 in the world's
])
def test_the_rank_not_waiting_is_the_culprit_and_no_wait_is_a_lock(tmp_path, scenario, nproc, waits):
    with PlantedJob(tmp_path / "job", scenario, nproc=nproc, deadline=60) as job:
        job.wait_for_ranks()
        wait_until(lambda: rank_stuck_at(job.script, "time.sleep(3600)  # the last stage"), 30,
                   "the culprit to stop in its own work")
        data = snapshot(job.pid)
    verdict = data["verdict"]
    culprit = nproc - 1
    assert verdict["kind"] == "straggler" and verdict["culprits"] == [culprit], verdict
    assert f"rank {culprit} is in sleep" in verdict["summary"] and waits.split(" in ")[-1] in verdict["summary"]
    phases = {r["rank"]: r["phase"] for r in data["ranks"]}
    assert "lock" not in phases.values(), phases
    assert all(phases[r] == "collective" for r in range(culprit)), phases


@pytest.mark.parametrize("scenario, kind, culprits", [("straggler", "straggler", [1]), ("healthy", "healthy", [])])
def test_the_thread_that_trains_is_the_one_judged(tmp_path, scenario, kind, culprits):
    """Training in a thread the main thread joins (Ray Train's `TrainingThread`, a framework's
    worker thread): that thread is judged, its stack and its progress; the main thread's join is
    a detail, not a lock."""
    with PlantedJob(tmp_path / "job", scenario, nproc=2, deadline=60, script_args=["--in-thread"]) as job:
        job.wait_for_ranks()
        if scenario == "straggler":
            wait_until(lambda: rank_stuck_at(job.script, "# stuck in its own work"), 30, "the straggler")
        data = snapshot(job.pid)
    verdict = data["verdict"]
    assert verdict["kind"] == kind and verdict["culprits"] == culprits, verdict
    phases = {r["rank"]: r["phase"] for r in data["ranks"]}
    assert "lock" not in phases.values(), phases
    if scenario == "straggler":
        assert phases == {0: "collective", 1: "sleep"}, phases
        assert verdict["summary"].startswith("rank 1 is in sleep at train.py"), verdict
