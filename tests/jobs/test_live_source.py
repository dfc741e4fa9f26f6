"""The live source across polls, on a real job: stuck time grows, and outside dumps are not progress."""

from __future__ import annotations

import time

from real_jobs import rank_stuck_at, wait_until
from trainwatch.probes.live import LocalSource
from trainwatch.probes.read.stacks.pyspy import dump_stacks


def stuck_for(source: LocalSource, rank: int) -> float:
    snapshot = source.poll()
    assert snapshot.verdict.kind == "straggler", snapshot.verdict
    return snapshot.rank(rank).stuck_for_s or 0.0


def test_stuck_time_grows_and_a_dump_during_the_hang_is_not_progress(planted):
    job = planted("straggler", nproc=2)
    wait_until(lambda: rank_stuck_at(job.script, "# stuck in its own work"), 60, "rank 1 in its planted sleep")
    source = LocalSource(job.pid, window=1.0, gpu=False)
    try:
        first = stuck_for(source, 0)
        time.sleep(1.5)  # deliberate: the hang must last longer between the two polls
        second = stuck_for(source, 0)
        assert second >= first + 1.0  # the same hang, judged across polls
        # An evidence dump samples every rank (py-spy attaches wake their threads) ...
        with source.paused_judgement():
            for pid in job.rank_pids():
                dump_stacks(pid)
                dump_stacks(pid, native=True)
        third = stuck_for(source, 0)
        assert third >= second, (second, third)  # ... and the hang keeps its age
        # The same dumps outside the pause, as another py-spy would take them, are not progress either:
        # they woke every thread of the rank alike, where an answer wakes only its waiter (issue 40).
        for pid in job.rank_pids():
            dump_stacks(pid)
            dump_stacks(pid, native=True)
        snapshot = source.poll()
        assert snapshot.rank(0).state == "stuck" and snapshot.rank(0).stuck_for_s >= third
    finally:
        source.close()
