"""`trainwatch snapshot` against real planted gloo jobs: what a user would read in the JSON."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest

from real_jobs import PlantedJob, wait_until

pytestmark = pytest.mark.job


def snapshot(pid: int, *args: str, timeout: float = 60) -> tuple[int, dict, str]:
    proc = subprocess.run([sys.executable, "-m", "trainwatch.tui.cli", "snapshot", str(pid), "--json", *args],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0 and proc.stdout.strip(), f"rc={proc.returncode}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def by_rank(data: dict) -> dict[int, dict]:
    return {r["rank"]: r for r in data["ranks"]}


def test_healthy_job_is_not_a_false_alarm(planted):
    job = planted("healthy", nproc=3, step_s=0.3)
    rc, data, err = snapshot(job.pid, "--window", "2")
    assert rc == 0, err
    assert data["verdict"]["kind"] == "healthy", data["verdict"]
    assert data["job"]["launcher"] == "torchrun" and data["job"]["world_size"] == 3
    assert sorted(by_rank(data)) == [0, 1, 2]
    assert all(r["state"] == "running" for r in data["ranks"])


def test_slow_steps_spent_in_one_collective_are_not_a_hang(planted):
    # Rank 0 takes 1 s per step (a third of the window); ranks 1-2 wait in the same all_reduce
    # line for most of every step. Still progress, so never stuck.
    job = planted("slowstep", nproc=3)
    rc, data, err = snapshot(job.pid, "--window", "3")
    assert data["verdict"]["kind"] == "healthy", data["verdict"]
    assert [r["state"] for r in data["ranks"]] == ["running"] * 3
    from trainwatch.probes.live import LocalSource
    source = LocalSource(job.pid, window=3.0, gpu=False)
    try:
        kinds = []
        for _ in range(4):  # the live view: one sample per poll, judged across polls
            kinds.append(source.poll().verdict.kind)
            time.sleep(1.0)  # deliberate: time passes between polls, as in the live view
        assert set(kinds) == {"healthy"}, kinds
    finally:
        source.close()


def test_straggler_names_the_rank_and_its_line(planted):
    job = planted("straggler", nproc=3)
    rc, data, err = snapshot(job.pid, "--window", "2")
    assert rc == 0, err
    verdict = data["verdict"]
    assert verdict["kind"] == "straggler" and verdict["culprits"] == [2]
    assert "rank 2" in verdict["summary"] and "train.py" in verdict["summary"]
    ranks = by_rank(data)
    assert ranks[0]["phase"] == "collective" and ranks[0]["op"] == "all_reduce"
    assert ranks[0]["where"].endswith("sync_gradients") and ranks[0]["user_frame"].startswith("train.py:")
    assert ranks[2]["phase"] == "sleep" and ranks[2]["state"] == "stuck" and ranks[2]["stuck_for_s"] >= 1
    assert {g["label"]: g["culprit"] for g in data["groups"]} == {"0-1": False, "2": True}
    main = ranks[2]["threads"][0]
    assert main["frames"][0]["file"].endswith("train.py") and {"function", "file", "line"} <= set(main["frames"][0])


@pytest.fixture(scope="module")
def mismatch(tmp_path_factory):
    """A 3-rank mismatch under `timeout`, as in a batch script (read only: shared)."""
    with PlantedJob(tmp_path_factory.mktemp("mismatch"), "mismatch", nproc=3, prefix=["timeout", "150"],
                    deadline=120) as job:
        job.wait_for_ranks()
        yield job


def test_mismatched_collectives(mismatch):
    rc, data, err = snapshot(mismatch.pid, "--window", "2")
    assert data["verdict"]["kind"] == "mismatch", data["verdict"]
    assert data["verdict"]["culprits"] == [2]
    assert "all_gather" in data["verdict"]["summary"] and "all_reduce" in data["verdict"]["summary"]
    assert by_rank(data)[2]["where"].endswith("sync_metrics")


def test_attach_by_non_python_ancestor(mismatch):
    # `timeout` above torchrun: the job is found beneath it.
    rc, data, err = snapshot(mismatch.pid, "--window", "1")
    assert rc == 0, err
    assert data["job"]["launcher"] == "torchrun" and data["job"]["pid"] != mismatch.pid
    assert data["job"]["pid"] in [p.pid for p in psutil.Process(mismatch.pid).children()]
    assert sorted(by_rank(data)) == [0, 1, 2]


def test_attach_by_rank_pid_finds_the_whole_job(mismatch):
    launcher = psutil.Process(mismatch.pid).children()[0].pid
    rank_pid = mismatch.rank_pids()[1]
    rc, data, err = snapshot(rank_pid, "--window", "0")
    assert rc == 0, err
    assert data["job"]["pid"] == launcher and len(data["ranks"]) == 3
    assert data["verdict"]["kind"] == "unknown"  # one sample cannot judge progress, and says so


def test_uneven_data_rank_leaves_loop_early(planted):
    job = planted("uneven", nproc=3)
    rc, data, err = snapshot(job.pid, "--window", "2")
    assert data["verdict"]["kind"] == "mismatch", data["verdict"]
    assert data["verdict"]["culprits"] == [2]
    assert by_rank(data)[2]["op"] == "barrier" and by_rank(data)[0]["op"] == "all_reduce"


def test_dataloader_stall_is_a_straggler_in_the_dataloader(planted):
    job = planted("dataloader", nproc=2)
    rc, data, err = snapshot(job.pid, "--window", "2")
    assert data["verdict"]["kind"] == "straggler", data["verdict"]
    assert data["verdict"]["culprits"] == [1]
    culprit = by_rank(data)[1]
    assert culprit["phase"] == "dataloader" and culprit["children"], culprit
    assert len(data["ranks"]) == 2  # the DataLoader worker is under its rank, not a rank


def test_lock_deadlock_points_at_the_other_thread(planted):
    job = planted("lock", nproc=2)
    rc, data, err = snapshot(job.pid, "--window", "2")
    assert data["verdict"]["culprits"] == [1], data["verdict"]
    culprit = by_rank(data)[1]
    assert culprit["phase"] == "lock"
    assert "which one of thread 'metrics-writer'" in (culprit["waits_for"] or ""), culprit["waits_for"]
    assert any(t["name"] == "metrics-writer" for t in culprit["threads"])


def test_segfaulted_rank_is_missing_from_no_sample_then_crashed_with_its_signal(tmp_path):
    # A slow launcher monitor keeps the dead rank as a zombie long enough to read its status.
    with PlantedJob(tmp_path, "segfault", nproc=3, monitor_interval=30) as job:
        job.wait_for_ranks()
        wait_for_zombie(job)
        # Reap nothing ourselves: the launcher keeps the zombie; the rank is reported, not lost.
        rc, data, err = snapshot(job.pid, "--window", "0")
        assert sorted(by_rank(data)) == [0, 1, 2]
        rc, data, err = snapshot(job.pid, "--window", "1")
        assert data is not None, err
        assert data["verdict"]["kind"] == "crashed", data["verdict"]
        assert data["verdict"]["culprits"] == [2]
        dead = by_rank(data)[2]
        assert dead["state"] == "exited" and dead["exit"]["signal"] == "SIGSEGV"
        assert "SIGSEGV" in data["verdict"]["summary"]


def test_single_process_without_launcher(tmp_path):
    with PlantedJob(tmp_path, "straggler", launcher="python", nproc=1) as job:
        job.wait_for_ranks()
        rc, data, err = snapshot(job.pid, "--window", "1")
        assert rc == 0, err
        assert data["job"]["launcher"] == "python"
        assert [r["rank"] for r in data["ranks"]] == [0]
        assert data["ranks"][0]["pid"] == job.pid


def wait_for_zombie(job: PlantedJob) -> None:
    """Until the segfaulted rank is a zombie its launcher has not reaped (monitor_interval keeps it)."""
    wait_until(lambda: any(p.status() == psutil.STATUS_ZOMBIE for p in psutil.Process(job.pid).children()),
               30, "the segfaulted rank to be a zombie under its launcher")
