"""A person stopping a job is an end, not a crash of the rank the signal reached first (issue 40).

The usual end of a hang: someone sends SIGTERM to torchrun (or scancel kills every rank at once).
`watch` says who stopped the job and what it was doing, exits with the problem's status (10), and
names no victim as a crash.
"""

from __future__ import annotations

import os
import signal
import sys

import psutil
import pytest

from real_jobs import PlantedJob, rank_stuck_at, wait_until
from watching import Watch

pytestmark = pytest.mark.job
TRAINWATCH = [sys.executable, "-m", "trainwatch.tui.cli"]


def torchrun_of(job: PlantedJob) -> int:
    """The torchrun process of the job (itself, or under `trainwatch run`)."""
    for proc in [psutil.Process(job.pid), *psutil.Process(job.pid).children(recursive=True)]:
        if "torch.distributed.run" in proc.cmdline():
            return proc.pid
    raise AssertionError("no torchrun in the job")


def stop_and_watch_end(job: PlantedJob, watch: Watch, how) -> tuple[int, dict]:
    how(job)
    code = watch.finish(60)
    (ended,) = [e for e in watch.events if e["event"] == "job_ended"]
    return code, ended


def term_launcher(job: PlantedJob) -> None:
    os.kill(torchrun_of(job), signal.SIGTERM)


def kill_every_rank(job: PlantedJob) -> None:
    for pid in job.rank_pids():
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("armed, stop", [(False, "term"), (True, "term"), (False, "kill")])
def test_stopping_a_hung_job_is_no_crash(tmp_path, armed, stop):
    prefix = [*TRAINWATCH, "run", "--out", str(tmp_path / "run"), "--"] if armed else None
    with PlantedJob(tmp_path / "job", "straggler", nproc=2, deadline=90, prefix=prefix) as job:
        job.wait_for_ranks()
        wait_until(lambda: rank_stuck_at(job.script, "# stuck in its own work"), 30, "the straggler's sleep")
        watch = Watch(job.pid, tmp_path, extra_args=("--hang-after", "2", "--dump-on", "none"))
        try:
            alert = watch.until(lambda e: e["event"] == "problem", 60)
            assert alert["verdict"] == "straggler" and alert["culprits"] == [1]
            code, ended = stop_and_watch_end(job, watch, term_launcher if stop == "term" else kill_every_rank)
        finally:
            watch.stop()
    events = [e["event"] for e in watch.events]
    assert "crash" not in events and "crashed" not in events, watch.events
    assert code == 10, watch.events  # the problem seen, not "a rank crashed" (11)
    who = "SIGTERM to the launcher" if stop == "term" else "a signal to every rank (killed by SIGKILL)"
    assert f"stopped by {who}" in ended["message"], ended
    assert "while the job was stuck: straggler: rank 1 is in sleep" in ended["message"], ended
    assert (ended["verdict"], ended["culprits"]) == ("straggler", [1])


def test_stopping_a_healthy_job_is_a_clean_end(tmp_path):
    with PlantedJob(tmp_path / "job", "healthy", nproc=2, deadline=90) as job:
        job.wait_for_ranks()
        watch = Watch(job.pid, tmp_path, record=True)
        try:
            watch.until(lambda e: e["event"] == "verdict" and e["verdict"] == "healthy", 60)
            code, ended = stop_and_watch_end(job, watch, term_launcher)
        finally:
            watch.stop()
    assert code == 0, watch.events
    assert "stopped by SIGTERM to the launcher" in ended["message"] and "made progress" in ended["message"], \
        f"{ended['message']}\nwhat the watch judged (tests/bench/recorder):\n{watch.recorded()}"
    assert not [e for e in watch.events if e["event"] in ("crash", "crashed", "problem")], watch.events


def test_a_brief_stall_then_a_stop_while_healthy_exits_clean(tmp_path):
    """Looks found a problem for a few seconds (rank 1 held by SIGSTOP, then let go), none held past
    --hang-after, the job ran on and was stopped: no problem to report (exit 0, docs/cli.md), and no
    problem event."""
    with PlantedJob(tmp_path / "job", "healthy", nproc=2, deadline=90) as job:
        job.wait_for_ranks()
        watch = Watch(job.pid, tmp_path, extra_args=("--hang-after", "600"))
        try:
            watch.until(lambda e: e["event"] == "verdict" and e["verdict"] == "healthy", 60)
            held = job.rank_pids()[1]
            os.kill(held, signal.SIGSTOP)
            try:
                stall = watch.until(lambda e: e["event"] == "verdict" and e["verdict"] != "healthy", 60)
            finally:
                os.kill(held, signal.SIGCONT)
            watch.until(lambda e: e["event"] == "verdict" and e["verdict"] == "healthy", 60)
            code, ended = stop_and_watch_end(job, watch, term_launcher)
        finally:
            watch.stop()
    assert stall["culprits"] == [1], stall
    assert "made progress" in ended["message"], ended
    assert not [e for e in watch.events if e["event"] in ("problem", "crash", "crashed")], watch.events
    assert code == 0, watch.events
