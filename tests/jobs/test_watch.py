"""`trainwatch watch` on an armed hang: one bundle per episode, Flight Recorder via the hook."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from real_jobs import PlantedJob
from trainwatch.probes.evidence.watcher import EXIT_CRASH, Episodes
from trainwatch.probes.snapshot import Verdict

TRAINWATCH = [sys.executable, "-m", "trainwatch.tui.cli"]


def test_one_bundle_per_episode():
    episodes = Episodes(hang_after=10)
    hang = Verdict(kind="hang")
    assert not episodes.observe(hang, 100)
    assert episodes.observe(hang, 111)
    assert not episodes.observe(Verdict(kind="mismatch"), 130)  # same episode, other label
    assert not episodes.observe(Verdict(kind="unknown"), 140)  # cannot tell: not over
    assert not episodes.observe(Verdict(kind="healthy"), 145)  # one healthy sample: a flap
    assert not episodes.observe(hang, 150)
    assert not episodes.observe(Verdict(kind="healthy"), 160)
    assert not episodes.observe(Verdict(kind="healthy"), 171)  # healthy for 11 s: over
    assert not episodes.observe(hang, 180)
    assert episodes.observe(hang, 191)


def test_a_hang_older_than_the_first_look_bundles_at_once_unless_it_blames_ranks_not_judged_yet():
    old = Verdict(kind="straggler", since=50.0, culprits=(2, 3))
    assert Episodes(hang_after=10).observe(old, 100)  # hung 50 s before we looked: no need to wait
    episodes = Episodes(hang_after=10)
    assert not episodes.observe(old, 100, unsure=True)  # ranks 2-3 read once (a node's first answer)
    assert not episodes.observe(old, 105, unsure=True)
    assert episodes.observe(dataclasses.replace(old, culprits=(3,)), 106)  # judged: the old hang is bundled
    episodes = Episodes(hang_after=10)
    assert not episodes.observe(old, 100, unsure=True)
    assert episodes.observe(old, 110, unsure=True)  # never judged: bundled after 10 s of our own looking


@pytest.mark.job
@pytest.mark.slow
def test_watch_bundles_an_armed_mismatch_once(tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "watch"
    prefix = [*TRAINWATCH, "run", "--out", str(run_dir), "--"]
    # The launcher reaps late (--monitor-interval 15), so the catcher always sees the exits.
    with PlantedJob(tmp_path / "job", "mismatch", nproc=3, deadline=30, prefix=prefix, monitor_interval=15) as job:
        job.wait_for_ranks()
        result = subprocess.run([*TRAINWATCH, "watch", str(job.pid), "--out", str(out), "--hang-after", "3",
                                 "--interval", "2", "--dump-on", "mismatch,hang"],
                                capture_output=True, text=True, timeout=120)
    # the planted deadline ends the hung ranks with status 124, which watch reports as a crash
    assert result.returncode == EXIT_CRASH, result.stdout + result.stderr
    assert "verdict mismatch" in result.stdout, result.stdout
    bundles = [p for p in out.iterdir() if p.is_dir() and p.name != "crashes"]
    assert len(bundles) == 1, result.stdout
    for rank in range(3):
        trace = bundles[0] / "ranks" / str(rank) / "flight-recorder" / "hook-fr_trace.json"
        assert json.loads(trace.read_text())["entries"], f"rank {rank}"
    assert sum("bundle " in line for line in result.stdout.splitlines()) == 1
