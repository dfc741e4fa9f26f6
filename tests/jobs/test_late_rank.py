"""The job that never formed: a torchrun job whose rank 2 blocks in ``load_config`` (a read that
never returns) before ``init_process_group``, while ranks 0-1 wait for it in the rendezvous. The
verdict is ``rendezvous``, naming rank 2 and where it is, from the launcher's PID and a rank's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from real_jobs import FRAMEWORK_JOBS, PlantedJob, free_port, kill_tree, wait_until

pytestmark = pytest.mark.job
TRAINWATCH = [sys.executable, "-m", "trainwatch.tui.cli"]


def test_the_rank_that_never_joined_is_named_with_its_place(tmp_path):
    with PlantedJob(tmp_path, script=FRAMEWORK_JOBS / "late_rank.py", deadline=60) as job:
        job.wait_for_log(r"\[rank 2\] reading config", timeout=60)

        def judged(pid: int) -> dict | None:
            out = subprocess.run([*TRAINWATCH, "snapshot", str(pid), "--json"], capture_output=True, text=True,
                                 timeout=60)
            assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
            data = json.loads(out.stdout)
            return data if data["verdict"]["kind"] == "rendezvous" else None

        first = wait_until(lambda: judged(job.pid), 40, "a rendezvous verdict from the launcher", interval=1)
        rank0 = next(r["pid"] for r in first["ranks"] if r["rank"] == 0)
        for data in (first, judged(rank0)):
            assert data is not None
            verdict = data["verdict"]
            assert verdict["culprits"] == [2], verdict
            summary = verdict["summary"]
            assert summary.startswith("rank 2 never joined: it is at late_rank.py:"), summary
            assert "load_config" in summary and "recv()" in summary, summary
            assert "ranks 0-1 wait in init_process_group at late_rank.py:" in summary, summary


def test_a_group_started_apart_is_found_through_its_store_and_names_the_rank_not_connected(tmp_path):
    """Three processes started one by one (no launcher; each sets RANK, WORLD_SIZE and MASTER_* in
    os.environ at run time, as a Ray actor does): ranks 0-1 are found through the store rank 0
    serves, the world of 3 from their locals, and rank 2, blocked before it ever connects, is named."""
    for helper in ("_jobkit.py", "late_rank.py"):
        shutil.copy(FRAMEWORK_JOBS / helper, tmp_path / helper)
    port = free_port()
    log = tmp_path / "group.log"
    procs = []
    try:
        with open(log, "wb") as out:
            for number in range(3):
                env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "TW_GROUP": f"{number},3,{port}"}
                procs.append(subprocess.Popen([sys.executable, str(tmp_path / "late_rank.py"), "--deadline", "60"],
                                              cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
                                              start_new_session=True))
        wait_until(lambda: "[rank 2] reading config" in log.read_text(errors="replace"), 60, "rank 2 in load_config")

        def judged() -> dict | None:
            out = subprocess.run([*TRAINWATCH, "snapshot", str(procs[1].pid), "--json"], capture_output=True,
                                 text=True, timeout=60)
            assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
            data = json.loads(out.stdout)
            found = [r for r in data["ranks"] if r["pid"]]
            # under load rank 1 may be read before it reached rank 0's store: then it is found alone
            return data if data["verdict"]["kind"] == "rendezvous" and len(found) == 2 else None

        data = wait_until(judged, 40, "a rendezvous verdict from rank 1", interval=1)
        assert {r["rank"]: r["pid"] for r in data["ranks"] if r["pid"]} == {0: procs[0].pid, 1: procs[1].pid}
        assert data["job"]["world_size"] == 3 and data["job"]["rendezvous"]["host_pid"] == procs[0].pid
        assert data["verdict"]["culprits"] == [2], data["verdict"]
        assert data["verdict"]["summary"].startswith(
            f"rank 2 never joined: no process is connected to the store at 127.0.0.1:{port} as rank 2; "
            "ranks 0-1 wait in init_process_group at late_rank.py:"), data["verdict"]
    finally:
        for proc in procs:
            kill_tree(proc.pid)
            proc.wait()
