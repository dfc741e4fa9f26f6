"""No death goes unreported: `watch --json --on-event` attached from the start of a 3-rank gloo job
whose rank 2 dies and is reaped by torchrun within its 0.1 s monitor interval, before any /proc
look could see its exit status. Each must give a `crashed` alert naming rank 2 and how it died,
and `job_ended` must say the launcher's status and who failed."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from real_jobs import PlantedJob, wait_until
from watching import TRAINWATCH, Watch, rank_pid

pytestmark = [pytest.mark.job, pytest.mark.slow]
CGROUP_V1 = Path("/sys/fs/cgroup/memory")


def crashed_then_ended(watch: Watch) -> tuple[dict, dict]:
    crashed = watch.until(lambda e: e["event"] == "crashed", 60)
    ended = watch.until(lambda e: e["event"] == "job_ended", 60)
    return crashed, ended


def test_a_rank_killed_from_outside_is_named_with_its_signal(tmp_path):
    """SIGKILL from outside (what the OOM killer or a person does), unarmed; torchrun reaps at once."""
    with PlantedJob(tmp_path / "job", "healthy", nproc=3, deadline=60) as job:
        job.wait_for_ranks()
        watch = Watch(job.pid, tmp_path)
        time.sleep(1.0)
        os.kill(rank_pid(job, 2), signal.SIGKILL)
        crashed, ended = crashed_then_ended(watch)
        watch.finish()
    assert crashed["culprits"] == [2] and "SIGKILL" in crashed["summary"], crashed
    assert crashed["message"], crashed  # the alert says what happened, also in its message
    assert "launcher exited" in ended["message"] and "rank 2" in ended["message"], ended
    fired = watch.hook_out.read_text()
    assert fired.startswith("crashed 2 ") and "SIGKILL" in fired, fired


def test_a_rank_that_kills_itself_under_trainwatch_run(tmp_path):
    """Armed (`trainwatch run`): the rank SIGKILLs itself (no handler can run); the wrapper records
    the launcher's status, which job_ended reports."""
    run_dir = tmp_path / "run"
    prefix = [*TRAINWATCH, "run", "--out", str(run_dir), "--"]
    with PlantedJob(tmp_path / "job", "sigkill", nproc=3, deadline=60, step_s=1.0, prefix=prefix) as job:
        job.wait_for_ranks(steps=0)
        watch = Watch(job.pid, tmp_path)
        crashed, ended = crashed_then_ended(watch)
        assert watch.finish() == 11  # EXIT_CRASH
    assert crashed["culprits"] == [2] and "SIGKILL" in crashed["summary"], crashed
    assert "launcher exited exit code 1" in ended["message"] or "launcher exited" in ended["message"], ended
    exit_record = json.loads((run_dir / "launcher-exit.json").read_text())
    assert exit_record["status"] != 0


def test_the_straggler_stays_the_cause_of_the_deaths_its_hang_caused(tmp_path):
    """Armed: rank 2 sits in its own work until ranks 0-1 time out in all_reduce (gloo, 8 s) and die;
    torchrun then SIGTERMs rank 2. The watch's alert after the deaths names rank 2, the cause; it
    said `crashed []`, "no rank's death was seen", though it had printed both deaths itself."""
    run_dir = tmp_path / "run"
    prefix = [*TRAINWATCH, "run", "--out", str(run_dir), "--"]
    with PlantedJob(tmp_path / "job", "straggler", nproc=3, deadline=60, prefix=prefix,
                    script_args=["--timeout", "8"]) as job:
        job.wait_for_ranks(steps=0)
        watch = Watch(job.pid, tmp_path)
        ended = watch.until(lambda e: e["event"] == "job_ended", 90)
        assert watch.finish() == 11  # ranks did die
    deaths = [e for e in watch.events if e["event"] == "crash"]
    assert {tuple(e["culprits"]) for e in deaths} == {(0,), (1,)}, watch.events  # each timeout said
    alerts = [e for e in watch.events if e["event"] in ("problem", "crashed")]
    assert alerts and alerts[-1]["verdict"] == "straggler" and alerts[-1]["culprits"] == [2], alerts
    assert not any("no rank's death was seen" in (e.get("summary") or "") for e in watch.events), watch.events
    assert "launcher exited" in ended["message"], ended
    assert ended["culprits"] == [2], ended  # the cause, not every rank that died of it (it said [0, 1, 2])


def test_without_the_kernels_exit_events_the_launchers_log_names_the_death(tmp_path):
    """As a user who is not root: no exit events; torchrun's own `failed (exitcode: -9) local_rank: 2
    (pid: …)` line in its log names the rank reaped before anyone looked."""
    with PlantedJob(tmp_path / "job", "healthy", nproc=3, deadline=60) as job:
        job.wait_for_ranks()
        watch = Watch(job.pid, tmp_path, env={"TRAINWATCH_EXIT_EVENTS": "0"})
        time.sleep(1.0)
        os.kill(rank_pid(job, 2), signal.SIGKILL)
        crashed, _ = crashed_then_ended(watch)
        watch.finish()
    assert crashed["culprits"] == [2] and "SIGKILL" in crashed["summary"], crashed
    assert "the launcher's log" in crashed["summary"], crashed


def _cgroup_writable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to make a memory cgroup"
    if not (CGROUP_V1 / "memory.limit_in_bytes").exists():
        return "no cgroup v1 memory controller at /sys/fs/cgroup/memory"
    return None


@pytest.mark.skipif(_cgroup_writable() is not None, reason=str(_cgroup_writable()))
def test_a_real_oom_kill_in_a_memory_cgroup(tmp_path):
    """Rank 2 runs in a memory cgroup limited to 256 MiB above what it uses; at step 3 it allocates
    until the kernel's OOM killer kills it. Its cgroup's own count says why."""
    group = CGROUP_V1 / f"trainwatch-test-oom-{os.getpid()}"
    group.mkdir()
    try:
        with PlantedJob(tmp_path / "job", "oom", nproc=3, deadline=60, step_s=1.5) as job:
            job.wait_for_ranks(steps=0)
            culprit = rank_pid(job, 2)
            (group / "memory.limit_in_bytes").write_text(str(256 << 20))
            (group / "cgroup.procs").write_text(str(culprit))  # new allocations are charged here
            watch = Watch(job.pid, tmp_path)
            crashed, ended = crashed_then_ended(watch)
            watch.finish()
        assert crashed["culprits"] == [2], crashed
        assert "killed by the kernel OOM killer: " in crashed["summary"], crashed
        assert "oom_kill 0 -> 1" in crashed["summary"] or "Killed process" in crashed["summary"], crashed
    finally:
        wait_until(lambda: not (group / "cgroup.procs").read_text().strip(), 30, "the cgroup to empty")
        group.rmdir()


def test_a_dataloader_worker_killed(tmp_path):
    """The last rank's DataLoader worker is SIGKILLed: the rank raises and exits; the crash names the
    rank and the worker's signal, from the rank's own words."""
    with PlantedJob(tmp_path / "job", "dataloader", nproc=2, deadline=60) as job:
        job.wait_for_ranks()
        culprit = rank_pid(job, 1)
        workers = wait_until(lambda: psutil.Process(culprit).children(), 30, "the DataLoader worker")
        watch = Watch(job.pid, tmp_path)
        workers[0].kill()
        crashed, _ = crashed_then_ended(watch)
        watch.finish()
    assert crashed["culprits"] == [1], crashed
    assert "DataLoader worker" in crashed["summary"] and "killed by SIGKILL" in crashed["summary"], crashed
