"""Crash reasons from what real, unarmed torchrun jobs left in their log (gloo, CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest

from real_jobs import PlantedJob
from trainwatch.probes.evidence.crash_catcher import CrashCatcher
from trainwatch.probes.evidence.watcher import Watcher
from trainwatch.probes.live import LocalSource
from trainwatch.probes.read.processes import procfs

pytestmark = pytest.mark.job


def snapshot(pid: int, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "trainwatch.tui.cli", "snapshot", str(pid), "--json", *args],
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0 and proc.stdout.strip(), f"rc={proc.returncode}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def wait_for(condition, timeout: float, what: str, job: PlantedJob) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout}s:\n{job.log.read_text(errors='replace')[-3000:]}")


def test_unarmed_job_crash_reason_comes_from_its_log(tmp_path):
    # torchrun's output goes to one file (> log 2>&1) for the launcher and both ranks; rank 1 raises.
    # A slow launcher monitor keeps the dead ranks as zombies long enough to read their status.
    with PlantedJob(tmp_path, "raise", nproc=2, step_s=0.3, deadline=90, monitor_interval=30) as job:
        catcher = CrashCatcher(job.pid)  # the headless path, unarmed: it must read the log too
        wait_for(lambda: any(r.rank == 1 for r in catcher.tick()) or any(r.rank == 1 for r in catcher.records),
                 60, "rank 1's death was not caught", job)
        record = next(r for r in catcher.records if r.rank == 1)
        assert record.exit.code == 1 and record.exit.reason == "RuntimeError", record
        assert record.exit.message == "RuntimeError: planted failure at step 3"
        assert record.exit.frame and record.exit.frame.endswith(" train"), record.exit
        assert "planted failure at step 3" in record.log_tail and record.log_tail.startswith("── error ──")

        data = snapshot(job.pid, "--window", "1")
        verdict = data["verdict"]
        assert verdict["kind"] == "crashed" and verdict["culprits"] == [1], verdict
        assert "RuntimeError: planted failure at step 3" in verdict["summary"]
        dead = {r["rank"]: r for r in data["ranks"]}[1]
        assert dead["state"] == "exited" and dead["log_path"] == str(job.log)
        assert dead["exit"]["code"] == 1 and dead["exit"]["first"] is True
        assert (dead["exit"]["reason"], dead["exit"]["message"]) == ("RuntimeError", "RuntimeError: planted failure at step 3")


def test_a_rank_kept_alive_by_a_thread_after_raising_is_crashed(tmp_path):
    with PlantedJob(tmp_path, "linger", nproc=2, step_s=0.3, deadline=90) as job:
        job.wait_for_ranks()
        wait_for(lambda: "planted failure at step 3" in job.log.read_text(errors="replace"), 60,
                 "rank 1 did not raise", job)
        culprit_pid = job.rank_pids()[1]
        data = snapshot(job.pid, "--window", "1.5")
        verdict = data["verdict"]
        assert verdict["kind"] == "crashed" and verdict["culprits"] == [1], verdict
        assert verdict["summary"].startswith("rank 1 raised RuntimeError: planted failure at step 3 (main thread exited; "
                                             "kept alive by "), verdict
        assert "'uploader' at train.py:" in verdict["summary"]
        rank1 = {r["rank"]: r for r in data["ranks"]}[1]
        assert rank1["pid"] == culprit_pid and rank1["state"] != "exited" and rank1["phase"] == "exiting"
        assert rank1["exit"]["reason"] == "RuntimeError" and rank1["exit"]["code"] is None
        # judged crashed while its process is still there
        assert psutil.pid_exists(culprit_pid) and procfs.state_letter(culprit_pid) not in (None, "Z")

        # `trainwatch watch` reports it although no rank died
        lines: list[str] = []
        source = LocalSource(job.pid, window=1.0, gpu=False)
        try:
            watcher = Watcher(job.pid, tmp_path / "watch", dump_on=frozenset(), emit=lines.append, source=source)
            watcher._poll()
            watcher._poll()
        finally:
            source.close()
        assert watcher.saw_crash and any("crash rank 1 raised RuntimeError" in line for line in lines), lines
