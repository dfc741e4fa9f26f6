"""Others look at the same job, and the hang began before anyone did (issue 40): real gloo jobs.

A verdict is about what the job did: another py-spy, a debugger attaching and detaching, or a
second trainwatch must not turn a hung job healthy nor move the blame; and how long a rank has
been stuck is read from the job's own evidence, reaching back before trainwatch first looked.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from real_jobs import PlantedJob, wait_quiet
from watching import Watch

pytestmark = pytest.mark.job

HUNG_FOR_S = 8.0  # how long the job has hung, untouched, before the first test looks
PY_SPY = str(Path(sys.executable).with_name("py-spy"))


def snapshot(pid: int) -> dict:
    proc = subprocess.run([sys.executable, "-m", "trainwatch.tui.cli", "snapshot", str(pid), "--json"],
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def said(data: dict) -> tuple:
    return data["verdict"]["kind"], tuple(data["verdict"]["culprits"])


class Onlookers:
    """What else looks at a job while trainwatch does: ``py-spy dump`` of every rank every half
    second and, given ``gdb_on``, ``gdb -p`` attaching to that rank and detaching every second or so."""

    def __init__(self, pids: list[int], gdb_on: int | None = None) -> None:
        self.pids, self.gdb_on = pids, gdb_on
        self.looks = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._py_spy, daemon=True)]
        if gdb_on is not None:
            self._threads.append(threading.Thread(target=self._gdb, daemon=True))

    def __enter__(self) -> "Onlookers":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _py_spy(self) -> None:
        while not self._stop.is_set():
            for pid in self.pids:
                subprocess.run([PY_SPY, "dump", "--pid", str(pid)], capture_output=True, timeout=20)
                self.looks += 1
            self._stop.wait(0.5)

    def _gdb(self) -> None:
        while not self._stop.is_set():  # -batch detaches as it ends: the rank is left running
            subprocess.run(["gdb", "-p", str(self.gdb_on), "-batch", "-ex", "info threads", "-ex", "shell sleep 0.5"],
                           capture_output=True, timeout=30)
            self.looks += 1
            self._stop.wait(0.5)


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    """A 3-rank straggler job (rank 2 sleeps after 1 s, ranks 0-1 wait in all_reduce), left alone
    until it has hung for ``HUNG_FOR_S``; the tests below read it in file order."""
    with PlantedJob(tmp_path_factory.mktemp("hung"), "straggler", nproc=3, deadline=240,
                    script_args=["--stall-after", "1"]) as job:
        pids = job.wait_for_ranks()
        # Its own line first: a rank waiting for its DataLoader's first batch on a loaded machine uses
        # no CPU either, and seconds of steps may still follow (seen in CI: 3 s).
        job.wait_for_log(r"rank 2 stops at")
        wait_quiet(pids)
        time.sleep(HUNG_FOR_S)
        yield job, pids, time.time() - HUNG_FOR_S


def test_the_stuck_time_reaches_back_before_the_first_look(hung):
    job, _, quiet_at = hung
    data = snapshot(job.pid)
    assert said(data) == ("straggler", (2,)), data["verdict"]
    for rank in data["ranks"]:
        assert rank["state"] == "stuck"
        assert rank["stuck_for_s"] >= data["taken_at"] - quiet_at - 1.0, rank  # not the 3 s trainwatch watched
        assert "asleep in" in rank["stuck_source"], rank  # what says so: the kernel saw its thread asleep
    assert data["verdict"]["since"] <= quiet_at + 1.0  # the hang's, not the first look's


def test_a_second_trainwatch_keeps_what_the_first_established(hung):
    """The first snapshot's dumps woke every thread: the kernel alone would now say seconds. What
    the first trainwatch left in the runtime folder is joined to the second one's look."""
    job, _, quiet_at = hung
    data = snapshot(job.pid)
    assert said(data) == ("straggler", (2,))
    assert min(r["stuck_for_s"] for r in data["ranks"]) >= data["taken_at"] - quiet_at - 1.0, data["ranks"]


async def test_attach_shows_the_stuck_time_from_the_job_s_evidence(hung):
    """The live view on a job hung before it opened: the culprit's state reads stuck for as long as
    the job has been stuck, and its detail says what says so."""
    import io
    import re

    from rich.console import Console

    from trainwatch.probes.live import open_source
    from trainwatch.tui.app import TrainwatchApp

    job, _, quiet_at = hung
    source = open_source(job.pid, window=2.0)
    try:
        app = TrainwatchApp(source, interval=2.0)
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(300):
                if app.snapshot is not None:
                    break
                await pilot.pause(0.1)
            await pilot.pause(0.3)
            console = Console(width=120, file=io.StringIO(), record=True, color_system=None, force_terminal=True)
            console.print(app.screen._compositor.render_update(full=True))
            screen = console.export_text()
    finally:
        source.close()
    assert app.snapshot.verdict.kind == "straggler", app.snapshot.verdict
    shown = [int(m) for m in re.findall(r"stuck ≥(\d+)s", screen)]
    assert shown and min(shown) >= HUNG_FOR_S, screen  # the table: not the 2 s it watched
    assert "stuck ≥" in screen and ("asleep in" in screen or "another trainwatch" in screen), screen  # the detail


@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb not installed")
def test_py_spy_and_gdb_looking_at_a_hung_job_change_nothing(hung):
    job, pids, _ = hung
    with Onlookers(pids, gdb_on=pids[0]) as others:
        seen = [snapshot(job.pid) for _ in range(3)]
    assert others.looks >= 6
    verdicts = [said(data) for data in seen]  # never healthy, never the rank gdb held
    assert verdicts == [("straggler", (2,))] * 3, [(d["verdict"], d["ranks"]) for d in seen]


def how_long(watch: Watch) -> str:
    """What the watch's bundle said of how long each rank had been stuck (for a failure's message)."""
    bundles = [e["bundle"] for e in watch.events if e.get("bundle")]
    summaries = [Path(b) / "summary.md" for b in bundles if (Path(b) / "summary.md").exists()]
    lines = [line for path in summaries for line in path.read_text().splitlines() if "stuck" in line]
    return "\n".join(list(dict.fromkeys(lines))[:12]) or f"no summary.md in {bundles}"


def test_watch_on_a_job_hung_long_ago_bundles_at_once_despite_onlookers(hung, tmp_path):
    """``--hang-after`` counts from when the job stopped (its own evidence), not from when watch
    started: the hang began long before watch did, so the bundle comes well before 40 s of watch's
    own looking."""
    job, pids, _ = hung
    with Onlookers(pids):
        watch = Watch(job.pid, tmp_path, extra_args=("--hang-after", "40"), record=True)
        try:
            started = time.monotonic()
            alert = watch.until(lambda e: e["event"] == "problem", 90)
            took = time.monotonic() - started
        finally:
            watch.stop()
    assert alert["verdict"] == "straggler" and alert["culprits"] == [2], alert
    assert took < 35, (f"bundled after {took:.1f}s: --hang-after counted from watch's start\n{how_long(watch)}\n"
                       f"what the watch judged (tests/bench/recorder):\n{watch.recorded(4000, first=True)}")
    assert not [e for e in watch.events if e.get("verdict") == "healthy"], watch.events


def test_a_healthy_job_under_onlookers_stays_healthy(planted):
    """py-spy dumps pause each rank for milliseconds: the job goes on, and so does its verdict. (A
    debugger holding a rank for seconds while it loads torch's symbols does stall a healthy job:
    "rank 0 is held by gdb" is then the truth.)"""
    job = planted("healthy", nproc=3, step_s=0.05)
    pids = job.rank_pids()
    with Onlookers(pids):
        kinds = [snapshot(job.pid)["verdict"]["kind"] for _ in range(2)]
    assert kinds == ["healthy", "healthy"]


def test_a_new_wait_at_the_same_place_does_not_inherit_an_earlier_snapshot_s_age(tmp_path):
    """Rank 2 pauses 6 s every 10 steps (a routine checkpoint) while ranks 0-1 wait in the same
    all_reduce each time. A snapshot in the first pause leaves its record and ends; one in the second
    pause reads each rank's wait from that pause, not from the first (it read "stuck ≥ 48 s" on a
    15 s pause: gloo's threads, woken by every step in between, looked like pauses from outside)."""
    with PlantedJob(tmp_path, "routine", nproc=3, deadline=90, step_s=0.05) as job:
        job.wait_for_ranks()
        job.wait_for_log(r"routine pause 1 begins")
        first = snapshot(job.pid)
        assert said(first) == ("straggler", (2,)), first["verdict"]
        text = job.wait_for_log(r"routine pause 2 begins")
        began = time.time()  # within the log poll's 0.2 s of the line
        assert "routine pause 3" not in text
        second = snapshot(job.pid)
        assert "routine pause 3" not in job.log.read_text(), "the snapshot outlasted the pause"
        for rank in second["ranks"]:
            if rank["state"] == "stuck":
                assert rank["stuck_for_s"] <= second["taken_at"] - began + 1.0, rank
                assert "another trainwatch" not in (rank["stuck_source"] or ""), rank
        assert any(r["state"] == "stuck" for r in second["ranks"]), second["verdict"]
