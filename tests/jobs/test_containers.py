"""A job in a container, read from its host: real torchrun gloo jobs started as a container runtime
starts them (``unshare --pid --fork --mount-proc``: a PID namespace of their own, PID 1 their
torchrun; their working folder a tmpfs only the container sees, the script in it).

From the host, ``trainwatch snapshot <torchrun's host PID>`` must judge the job as it is judged
from inside (alive while their processes live: a hung job once read "healthy, job finished"),
each rank shown with its PID in the container beside its host PID.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from real_jobs import PlantedJob, rank_stuck_at, wait_until

pytestmark = [pytest.mark.job, pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                                  reason="needs root and unshare (namespaces)")]

TRAINWATCH = str(Path(sys.executable).parent / "trainwatch")
# The container's start: its own PID and mount namespaces and /proc; its working folder a tmpfs holding
# the script (the host's copy is another file), then torchrun as the container's PID 1.
CONTAINER = ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c",
             'code=$(cat train.py) && mount -t tmpfs none "$PWD" && cd "$PWD" && printf "%s\\n" "$code" > train.py '
             '&& exec "$@"', "container"]


def snapshot(*args: str, cwd: str | None = None) -> tuple[int, dict]:
    done = subprocess.run([TRAINWATCH, "snapshot", *args, "--json"], capture_output=True, text=True, timeout=120,
                          cwd=cwd)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.fixture(scope="module")
def fifo_job(tmp_path_factory):
    """Rank 2 blocked opening a FIFO nobody writes (the issue's shape); ranks 0-1 wait for it in all_reduce."""
    job = PlantedJob(tmp_path_factory.mktemp("ctr-fifo"), "fifo", nproc=3, deadline=150, prefix=CONTAINER).start()
    try:
        job.wait_for_log(r"rank 2/3 pid \d+ scenario fifo")
        wait_until(lambda: rank_stuck_at(job.script, "fifo.read()") or rank_stuck_at(job.script, "with open(path)"),
                   60, "rank 2 to block on its FIFO")
        yield job
    finally:
        job.stop()


def test_a_hung_job_in_a_container_is_judged_from_its_host(fifo_job):
    torchrun = fifo_job.rank_pids() and _torchrun(fifo_job.pid)
    code, data = snapshot(str(fifo_job.pid), "--window", "2")  # the PID of `unshare`, above the container
    assert code == 0
    assert data["job"]["pid"] == torchrun
    ranks = {r["rank"]: r for r in data["ranks"]}
    assert sorted(ranks) == [0, 1, 2]
    assert all(r["state"] in ("stuck", "running") for r in ranks.values()), data["ranks"]  # alive: never "exited"
    assert data["verdict"]["kind"] == "straggler" and data["verdict"]["culprits"] == [2], data["verdict"]
    assert "FIFO" in data["verdict"]["summary"], data["verdict"]
    for number, rank in ranks.items():
        # its PID in the container (torchrun is 1 there), beside the host PID the table shows
        assert rank["container_pid"] is not None and rank["container_pid"] < 20 and rank["pid"] > 20, rank
        main = next(t for t in rank["threads"] if t["is_main"])
        assert main["tid"] == rank["pid"]  # py-spy's thread IDs (the container's) mapped to the host's
    assert ranks[2]["where"].startswith("train.py:"), ranks[2]


def test_the_same_job_read_from_inside_its_container_says_the_same(fifo_job):
    torchrun = _torchrun(fifo_job.pid)
    enter = ["nsenter", "-t", str(torchrun), "-p", "-m", f"--wd={fifo_job.workdir}"]
    done = subprocess.run([*enter, TRAINWATCH, "snapshot", "1", "--json", "--window", "2"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["job"]["pid"] == 1
    assert data["verdict"]["kind"] == "straggler" and data["verdict"]["culprits"] == [2], data["verdict"]
    assert all(r["container_pid"] is None for r in data["ranks"])  # inside, its PIDs are the ones it has


def test_a_healthy_job_in_a_container_is_healthy_from_its_host(tmp_path):
    job = PlantedJob(tmp_path / "ctr-healthy", "healthy", nproc=2, deadline=90, prefix=CONTAINER).start()
    try:
        job.wait_for_ranks()
        code, data = snapshot(str(job.pid), "--window", "2")
        assert code == 0
        assert data["verdict"]["kind"] == "healthy", data["verdict"]
        assert "making progress" in data["verdict"]["summary"]
        assert [r["state"] for r in data["ranks"]] == ["running", "running"], data["ranks"]
        table = subprocess.run([TRAINWATCH, "snapshot", str(job.pid), "--wide"], capture_output=True, text=True,
                               timeout=120, env={**os.environ, "COLUMNS": "160"})
        pids = {r["pid"]: r["container_pid"] for r in data["ranks"]}
        for pid, inner in pids.items():
            assert f"{pid} ({inner})" in table.stdout, table.stdout  # the host PID, then the container's
    finally:
        job.stop()


def _torchrun(root: int) -> int:
    """torchrun's host PID: the container's PID 1, below `unshare`."""
    for child in Path(f"/proc/{root}/task/{root}/children").read_text().split():
        if "torch.distributed.run" in Path(f"/proc/{child}/cmdline").read_text():
            return int(child)
    raise AssertionError("no torchrun below unshare")
