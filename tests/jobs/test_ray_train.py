"""Ray Train: the ranks are Ray actors under raylet, numbered only in Ray Train's own records.

One shared Ray job (starting Ray takes ~15 s on 2 cores): healthy first, then the last worker stops
in its own code while the others wait in DDP's all_reduce. Judged by `trainwatch snapshot` with
default options from the PIDs a user would have: the driver's, a worker's, and `timeout` above them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest

from real_jobs import FRAMEWORK_JOBS, PlantedJob

pytest.importorskip("ray.train.torch")
pytestmark = pytest.mark.job
TRAINWATCH = [sys.executable, "-m", "trainwatch.tui.cli"]


def snapshot(pid: int) -> dict:
    out = subprocess.run([*TRAINWATCH, "snapshot", str(pid), "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def workers(job) -> list[int]:
    """This job's Ray Train workers (another test's Ray cluster may run beside it: its workers are not ours)."""
    def is_worker(proc: psutil.Process) -> bool:
        try:
            return (proc.cmdline() or [""])[0].startswith("ray::RayTrainWorker")
        except psutil.Error:  # exited while listed
            return False

    return sorted(p.pid for p in psutil.Process(job.pid).children(recursive=True) if is_worker(p))


@pytest.fixture(scope="module")
def ray_job(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("ray")
    job = PlantedJob(workdir, script=FRAMEWORK_JOBS / "ray_train_straggler.py", launcher="python", deadline=120,
                     prefix=["timeout", "150"], extra_env={"RAY_DISABLE_USAGE_STATS": "1", "RAY_DEDUP_LOGS": "0"})
    with job:
        job.wait_for_log(r"\[rank 2\] step 10", timeout=90)
        yield job


def test_ray_train_from_the_driver_then_a_straggler_from_any_worker(ray_job):
    driver = next(c.pid for c in psutil.Process(ray_job.pid).children() if "ray_train_straggler" in " ".join(c.cmdline()))
    healthy = snapshot(driver)
    assert healthy["job"]["launcher"] == "ray train" and healthy["job"]["pid"] == driver
    assert sorted(r["rank"] for r in healthy["ranks"]) == [0, 1, 2], healthy["ranks"]
    assert healthy["verdict"]["kind"] == "healthy", healthy["verdict"]
    assert any("rank numbers from Ray Train's worker logs" in n for n in healthy["notes"]), healthy["notes"]
    # the loop runs in Ray's TrainingThread: that is the thread judged
    assert all("train_loop" in (r["where"] or "") or r["phase"] != "unknown" for r in healthy["ranks"])

    (ray_job.workdir / "stall-now").touch()
    ray_job.wait_for_log(r"\[rank 2\] straggling", timeout=60)
    time.sleep(1.0)
    from trainwatch.probes.read.processes.job_watch import JobWatch

    watch = JobWatch(driver)
    watch._family = None  # as after a worker restarts: the job is discovered again from its root
    assert sorted(r.pid for r in watch.current().ranks) == workers(ray_job), "rediscovered from the driver"
    for pid in (driver, workers(ray_job)[0], ray_job.pid):  # the driver, a worker, `timeout` above them
        found = snapshot(pid)
        assert (found["verdict"]["kind"], found["verdict"]["culprits"]) == ("straggler", [2]), (pid, found["verdict"])
        assert "evaluate_forever" in found["verdict"]["summary"] and "all_reduce" in found["verdict"]["summary"]


def test_a_process_that_is_no_ray_worker_is_not_taken_for_one(ray_job):
    """Ray's own helpers (the raylet's other actors) are not ranks."""
    found = snapshot(workers(ray_job)[0])
    assert len(found["ranks"]) == 3 and all(r["pid"] in workers(ray_job) for r in found["ranks"])
