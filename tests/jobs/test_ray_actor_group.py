"""A worker group of plain Ray actors (no Ray Train: how verl and OpenRLHF run their trainers):
three ``@ray.remote`` actors under the raylet, not under the driver, that set MASTER_ADDR,
MASTER_PORT, RANK and WORLD_SIZE in their own ``os.environ`` at run time and call
``init_process_group`` (their /proc/PID/environ holds none of it). trainwatch finds them through
the TCPStore rank 0 serves: every rank's connection to it. One shared Ray job (a Ray cluster takes
30-60 s to start here): healthy first, then rank 2 stops in its own code while ranks 0-1 wait in
all_reduce. Judged by `trainwatch snapshot` from the driver's PID, another actor's and a helper's
that a rank forked (as a DataLoader worker is).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from real_jobs import FRAMEWORK_JOBS, PlantedJob, wait_until

pytest.importorskip("ray")
pytestmark = [pytest.mark.job, pytest.mark.slow]
TRAINWATCH = [sys.executable, "-m", "trainwatch.tui.cli"]


def snapshot(pid: int) -> dict:
    out = subprocess.run([*TRAINWATCH, "snapshot", str(pid), "--json"], capture_output=True, text=True, timeout=90)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    """(job, driver PID, rank -> actor PID)."""
    workdir = tmp_path_factory.mktemp("ray-actors")
    job = PlantedJob(workdir, script=FRAMEWORK_JOBS / "ray_actor_group.py", launcher="python", deadline=150,
                     prefix=["timeout", "180"], extra_env={"RAY_DISABLE_USAGE_STATS": "1", "RAY_DEDUP_LOGS": "0"})
    with job:
        job.wait_for_log(r"\[rank 2\] step 10", timeout=150)
        driver = int((workdir / "driver.pid").read_text())
        rows = [line.split() for line in (workdir / "ranks.txt").read_text().splitlines() if line.strip()]
        actors = {int(row[0]): int(row[1]) for row in rows}
        yield job, driver, actors


def test_a_healthy_group_is_found_whole_from_the_driver(group):
    job, driver, actors = group
    found = snapshot(driver)
    assert found["job"]["launcher"] == "ray actors" and found["job"]["pid"] == driver, found["job"]
    assert {r["rank"]: r["pid"] for r in found["ranks"]} == actors, (found["ranks"], actors)
    assert found["job"]["world_size"] == 3
    assert found["verdict"]["kind"] == "healthy", found["verdict"]
    assert found["job"]["rendezvous"]["host_pid"] == actors[0]  # rank 0 serves the store
    assert any("ranks found through their store" in n for n in found["notes"]), found["notes"]
    assert any("rank numbers from their locals" in n for n in found["notes"]), found["notes"]
    # a synchronous actor trains on its main thread, under Ray's worker loop: that thread is judged
    assert all("run_steps" in (r["where"] or "") for r in found["ranks"]), [r["where"] for r in found["ranks"]]


def test_an_agent_finds_the_group_by_its_stores_address(group):
    """How an agent on another node finds the group (``--match ADDR:PORT``, the store's address):
    the processes connected to it, though no environment holds MASTER_ADDR."""
    from trainwatch.probes.read.processes.discover import find_job, find_job_matching

    _, driver, actors = group
    job = find_job(driver)
    matched = find_job_matching(master=f"{job.master_addr}:{job.master_port}")
    assert {r.rank: r.pid for r in matched.ranks} == actors
    again = find_job(matched.root_pid)  # the PID an agent hands on to its live source
    assert {r.rank: r.pid for r in again.ranks} == actors and again.found_by == "store"


def test_the_straggler_is_named_from_the_driver_and_from_another_actor(group):
    job, driver, actors = group
    (job.workdir / "stall-now").touch()
    job.wait_for_log(r"\[rank 2\] straggling", timeout=60)
    from trainwatch.probes.read.processes.job_watch import JobWatch

    watch = JobWatch(actors[1])
    assert sorted(r.pid for r in watch.current().ranks) == sorted(actors.values())
    assert watch.job.root_pid == driver  # the process that talks to every rank: the driver

    def straggler(pid: int) -> dict | None:
        found = snapshot(pid)
        return found if found["verdict"]["kind"] == "straggler" else None

    helper = int((job.workdir / "helper.pid").read_text())  # forked by rank 1: its copies of rank 1's sockets
    for pid in (driver, actors[0], helper):
        found = wait_until(lambda: straggler(pid), 60, f"a straggler verdict from PID {pid}", interval=1)
        assert found["verdict"]["culprits"] == [2], found["verdict"]
        summary = found["verdict"]["summary"]
        assert "evaluate_forever" in summary and "all_reduce" in summary and "ranks 0-1" in summary, summary
