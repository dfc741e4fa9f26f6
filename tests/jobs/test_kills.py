"""A kill is a crash of the rank killed, always: under `trainwatch run` + `watch`, a rank SIGKILLs
itself while the others compute, while they wait in the all_reduce, just before it; the alert names
that rank alone with its signal, never a peer that then failed; `open` on what the job left says
the same, from the launcher's log or, with the run directory alone, from the one armed rank that
left no word (its hook hears every end but a SIGKILL's). The killed rank varies, rank 0 included."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from real_jobs import PlantedJob
from watching import TRAINWATCH, Watch

pytestmark = [pytest.mark.job, pytest.mark.slow]


def killed_under_watch(workdir: Path, scenario: str, culprit: int) -> tuple[dict, dict, PlantedJob]:
    prefix = [*TRAINWATCH, "run", "--out", str(workdir / "run"), "--"]
    args = ["--culprit", str(culprit), "--fail-step", "10"]
    with PlantedJob(workdir / "job", scenario, nproc=3, deadline=60, step_s=0.3, prefix=prefix,
                    script_args=args) as job:
        job.wait_for_ranks(steps=0)
        watch = Watch(job.pid, workdir)
        crashed = watch.until(lambda e: e["event"] == "crashed", 60)
        ended = watch.until(lambda e: e["event"] == "job_ended", 60)
        assert watch.finish() == 11  # EXIT_CRASH
    return crashed, ended, job


def opened(*paths: Path) -> dict:
    out = subprocess.run([*TRAINWATCH, "open", *map(str, paths), "--json"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["verdict"]


def test_rank_0_killing_itself_while_the_others_wait_in_the_all_reduce(tmp_path):
    crashed, ended, job = killed_under_watch(tmp_path, "killwait", culprit=0)
    assert crashed["culprits"] == [0] and "rank 0 died: killed by SIGKILL" in crashed["summary"], crashed
    assert "ranks 1-2 then ended too" in crashed["summary"]
    assert "rank 0" in ended["message"] and "SIGKILL" in ended["message"], ended
    with_log = opened(tmp_path / "run", job.log)  # the launcher's log says how
    assert with_log["culprits"] == [0] and "SIGKILL" in with_log["summary"], with_log
    alone = opened(tmp_path / "run")  # the run directory alone: the armed rank that left no word
    assert alone["kind"] == "crashed" and alone["culprits"] == [0], alone
    assert "leaving no word although armed" in alone["summary"]


def test_a_rank_killing_itself_while_the_others_compute(tmp_path):
    crashed, _, _ = killed_under_watch(tmp_path, "killcompute", culprit=1)
    assert crashed["culprits"] == [1] and "killed by SIGKILL" in crashed["summary"], crashed


def test_a_rank_killing_itself_just_before_a_collective(tmp_path):
    crashed, _, job = killed_under_watch(tmp_path, "sigkill", culprit=2)
    assert crashed["culprits"] == [2] and "killed by SIGKILL" in crashed["summary"], crashed
    assert opened(tmp_path / "run", job.log)["culprits"] == [2]
