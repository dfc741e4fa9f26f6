"""The job that never formed: a torchrun job whose rank 2 blocks in ``load_config`` (a read that
never returns) before ``init_process_group``, while ranks 0-1 wait for it in the rendezvous. The
verdict is ``rendezvous``, naming rank 2 and where it is, from the launcher's PID and a rank's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from real_jobs import FRAMEWORK_JOBS, PlantedJob, wait_until

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
            assert "load_config" in summary and "recvfrom()" in summary, summary
            assert "ranks 0-1 wait in init_process_group at late_rank.py:" in summary, summary
