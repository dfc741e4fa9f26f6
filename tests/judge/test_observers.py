"""Progress is what the job did, not what was done to it (issue 40), on hand-made readings.

The counters here are made up, shaped as /proc gives them; the real-process side is
tests/jobs/test_others_looking.py.
"""

from __future__ import annotations

from dataclasses import replace

from trainwatch.probes.judge.judgement import JudgeMemory, JudgeOptions, judge_job
from trainwatch.probes.judge.kernel import from_kernel
from trainwatch.probes.judge.progress import ProgressTracker, StackWatch, paused, quiet_between, wakeups
from trainwatch.probes.observed import FirstLook, ObservedJob, ObservedRank, SharedStill, ThreadCounters
from trainwatch.probes.snapshot import Job, KernelState, LogActivity, Rank

SEC = 1_000_000_000


def counters(at_s: float, woke: int, witnesses: dict[int, int], run_ms: float = 1.0) -> ThreadCounters:
    """A blocked main thread's counters at ``at_s``: ``woke`` voluntary switches, ``witnesses``'
    (tid -> voluntary switches), ``run_ms`` on a CPU in all."""
    return ThreadCounters(cpu_ticks=0, voluntary=woke, involuntary=0, at_ns=int(at_s * SEC),
                          run_ns=int(run_ms * 1e6), queued_ns=0, syscall="futex", others=tuple(witnesses.items()))


def test_a_pause_of_the_whole_process_is_no_wake_up_of_the_main_thread():
    # Three py-spy dumps from another shell: every blocked thread woke twice for each.
    before = counters(0, 100, {11: 5, 12: 7})
    after = counters(2, 106, {11: 11, 12: 13})
    assert paused(before, after) == 12 and wakeups(before, after) < 2
    # An answered wait wakes its waiter alone.
    answered = counters(2, 140, {11: 5, 12: 7})
    assert paused(before, answered) == 0 and wakeups(before, answered) == 40
    # A witness that ended or was never read explains nothing: the old rule stands.
    assert paused(before, counters(2, 106, {13: 9})) == 0


def test_the_sampler_sees_no_progress_in_another_observers_pauses():
    watch = StackWatch()
    stack = ("train.py:10",)
    watch.observe(7, stack, "collective", counters(0, 100, {11: 5}), counters(0.1, 102, {11: 7}), 0.1)
    # between our dumps someone else attached twice: the main thread and its witness each woke 4 times
    watch.observe(7, stack, "collective", counters(2, 106, {11: 11}), counters(2.1, 108, {11: 13}), 2.1)
    assert watch.take_signs(7) == () and watch.unclear(7)
    # an answered wait: the main thread alone woke
    watch.observe(7, stack, "collective", counters(4, 140, {11: 13}), counters(4.1, 142, {11: 15}), 4.1)
    assert watch.take_signs(7) == (4.1,)


def test_quiet_between_two_looks_of_different_processes():
    first = counters(0, 100, {11: 5}, run_ms=10)
    assert quiet_between(first, counters(60, 340, {11: 245}, run_ms=40))  # a minute of py-spy dumps every 0.5 s
    assert not quiet_between(first, counters(60, 340, {11: 5}, run_ms=40))  # the main thread woke on its own
    assert not quiet_between(first, counters(60, 100, {11: 5}, run_ms=9000))  # it ran: 15% of the minute


def test_the_earliest_evidence_of_stillness_is_the_stuck_time_with_its_source():
    progress = ProgressTracker()
    progress.watch(1, 100.0)
    progress.hold_still(1, 40.0, "log", "last output {age} ago")
    progress.hold_still(1, 10.0, "kernel", "asleep in futex() for {age}")
    progress.hold_still(1, 150.0, "collective", "all_reduce #11 pending {age}")  # later than the first look: no bound
    still = progress.still_since(1, 160.0)
    assert still.since == 10.0 and not still.watched_only
    assert still.source == "asleep in futex() for 2 min; last output 2 min ago"
    progress.mark_progress(1, 161.0)  # progress seen: what the job said of before no longer holds
    progress.hold_still(1, 5.0, "log", "last output {age} ago")
    assert progress.still_since(1, 170.0).since == 161.0


def rank(pid: int, number: int, **kwargs) -> ObservedRank:
    return ObservedRank(rank=number, pid=pid, phase="collective", op="all_reduce", where="train.py:9 step",
                        watched_since=1000.0, **kwargs)


def judged(ranks: list[ObservedRank], now: float = 1004.0):
    evidence = ObservedJob(job=Job(launcher="torchrun", pid=1, host="h", world_size=len(ranks)), ranks=tuple(ranks))
    return judge_job(evidence, JudgeMemory(), now, JudgeOptions(window=3.0))


def test_a_rank_left_untouched_reads_as_stuck_since_the_kernel_says():
    first = FirstLook(at=1000.0, asleep_since=880.0, asleep_in="futex()")
    got = judged([rank(5, 0, first_look=first)])
    (only,) = got.ranks
    assert only.state == "stuck" and only.stuck_for_s == 124.0
    assert only.stuck_source == "asleep in futex() for 2 min"
    assert got.verdict.since == 880.0


def test_without_older_evidence_the_stuck_time_says_it_is_trainwatch_s_own():
    (only,) = judged([rank(5, 0)]).ranks
    assert only.stuck_for_s == 4.0 and only.stuck_source == "since trainwatch first looked"


def test_a_shared_log_is_no_rank_s_last_output():
    shared = LogActivity(age_s=300.0, own=False)
    (only,) = judged([rank(5, 0, log=shared)]).ranks
    assert only.stuck_for_s == 4.0


def test_another_trainwatch_s_stillness_joins_where_the_thread_slept_through():
    other = SharedStill(since=700.0, until=995.0, kinds=(("kernel", 690.0, "asleep in futex() for {age}"),))
    first = FirstLook(at=1000.0, asleep_since=994.5, asleep_in="futex()")  # woken by the other's last dump
    (only,) = judged([rank(5, 0, first_look=first, still_elsewhere=other)]).ranks
    assert only.stuck_for_s == 314.0 and only.stuck_source == "asleep in futex() for 5 min"
    # the thread ran since the other looked: nothing joins
    first = FirstLook(at=1000.0, asleep_since=999.0, asleep_in="futex()")
    (only,) = judged([rank(5, 0, first_look=first, still_elsewhere=other)]).ranks
    assert only.stuck_for_s == 5.0


def test_another_trainwatch_s_stillness_joins_through_onlookers_pauses():
    """py-spy woke the thread every half second since the other trainwatch looked: its counters,
    held against the other's last reading, show only those pauses, and the same stack."""
    other = SharedStill(since=700.0, until=900.0, counters=counters(900, 100, {11: 5}), signature="abc")
    first = FirstLook(at=1000.0, counters=counters(1000, 500, {11: 405}, run_ms=30), signature="abc",
                      asleep_since=999.8, asleep_in="futex()")
    (only,) = judged([rank(5, 0, first_look=first, still_elsewhere=other)]).ranks
    assert only.stuck_for_s == 304.0 and "another trainwatch" in only.stuck_source
    moved = FirstLook(at=1000.0, counters=counters(1000, 500, {11: 405}), signature="def", asleep_since=999.8,
                      asleep_in="one wait")
    (only,) = judged([rank(5, 0, first_look=moved, still_elsewhere=other)]).ranks
    assert only.stuck_for_s == 4.2 and only.stuck_source == "asleep in one wait for 4 s"  # its own sleep only


def test_a_rank_that_moved_bytes_since_the_record_does_not_carry_an_old_wait_into_a_new_one():
    """Recorded on a real gloo job: rank 0 checkpoints for 15 s every 20 steps while ranks 1-2 wait in
    the same barrier. A `snapshot` in checkpoint 1 left its record; one 5 s into checkpoint 3 found
    the same stack, and the 40 steps between woke gloo's threads as often as the main thread: it read
    "stuck ≥ 48 s". The steps' all_reduces moved bytes (/proc/PID/io); pauses from outside move none."""
    other = SharedStill(since=954.6, until=963.2, counters=counters(963.2, 60, {11: 200, 12: 210}), signature="abc",
                        io=81_920)
    first = FirstLook(at=1000.0, counters=counters(1000.0, 142, {11: 299, 12: 317}, run_ms=120), signature="abc",
                      asleep_since=995.0, asleep_in="futex()", io=94_208)
    (only,) = judged([rank(5, 0, first_look=first, still_elsewhere=other)]).ranks
    assert only.stuck_for_s == 9.0 and only.stuck_source == "asleep in futex() for 9 s"
    # Not a byte since (py-spy and gdb woke it, nothing else did): the record joins.
    (only,) = judged([rank(5, 0, first_look=replace(first, io=81_920), still_elsewhere=other)]).ranks
    assert only.stuck_for_s == 49.4 and "another trainwatch" in only.stuck_source


def kernel_rank(number: int, letter: str, stuck_for_s: float | None, tracer_since: float | None = None,
                phase: str = "collective") -> Rank:
    kernel = KernelState(letter=letter, tracer="gdb (PID 9)" if letter == "t" else None, tracer_since=tracer_since)
    return Rank(rank=number, pid=100 + number, state="stuck", phase=phase, stuck_for_s=stuck_for_s, kernel=kernel)


def test_a_debugger_that_attached_to_a_hung_job_is_not_its_culprit():
    waits = lambda ranks: "wait in all_reduce"  # noqa: E731
    now = 1000.0
    # ranks 1-2 have waited 5 minutes; gdb started a second ago on rank 0, which waited with them
    ranks = [kernel_rank(0, "t", 3.0, tracer_since=999.0), kernel_rank(1, "S", 300.0), kernel_rank(2, "S", 300.0)]
    assert from_kernel(ranks, waits, now=now) is None  # the stacks judge it, as before gdb came
    # gdb holds rank 0 since before the others stopped: it holds them up
    ranks = [kernel_rank(0, "t", 3.0, tracer_since=600.0), kernel_rank(1, "S", 300.0), kernel_rank(2, "S", 300.0)]
    verdict = from_kernel(ranks, waits, now=now)
    assert verdict.kind == "straggler" and verdict.culprits == (0,)
    assert verdict.summary.startswith("rank 0 is held by gdb (PID 9)")


def test_a_rank_held_a_moment_that_nothing_waits_on_is_no_hang():
    ranks = [kernel_rank(0, "t", None, tracer_since=999.0), kernel_rank(1, "S", None), kernel_rank(2, "S", None)]
    ranks = [r if r.rank == 0 else Rank(rank=r.rank, pid=r.pid, state="running", kernel=r.kernel) for r in ranks]
    ranks[0] = Rank(rank=0, pid=100, state="running", kernel=ranks[0].kernel)
    assert from_kernel(ranks, lambda r: "", now=1000.0) is None


def test_a_rank_a_py_spy_dump_holds_is_no_culprit():
    """Another trainwatch's or a person's py-spy holds a rank for milliseconds: a look, not a hold."""
    held = Rank(rank=0, pid=100, state="stuck", phase="collective", stuck_for_s=3.0,
                kernel=KernelState(letter="t", tracer="py-spy (PID 77)", tracer_since=999.9))
    ranks = [held, kernel_rank(1, "S", 3.0), kernel_rank(2, "S", 3.0)]
    assert from_kernel(ranks, lambda r: "wait in all_reduce", now=1000.0) is None


def test_a_dataloader_s_own_worker_checks_are_no_progress():
    """A rank waiting for its next batch wakes every 5 s to check its workers (a millisecond or so of
    CPU): a look whose gap spans two such checks (under load) read it as running while its worker
    hung. A batch that came wakes it far more often."""
    from trainwatch.probes.judge.progress import status_checks_only

    before = counters(0, 100, {11: 1}, run_ms=500)
    checks = counters(11, 103, {11: 1}, run_ms=506)  # 11 s: three wake-ups, 6 ms
    assert status_checks_only(before, checks)
    batches = counters(11, 140, {11: 1}, run_ms=900)  # 11 s of batches: 40 wake-ups, 400 ms
    assert not status_checks_only(before, batches)
    watch = StackWatch()
    for after, moved in ((checks, False), (batches, True)):
        watch.observe(7, ("same",), "dataloader", before, before, 1.0)
        watch.take_signs(7)
        watch.observe(7, ("same",), "dataloader", after, after, 12.0)
        assert bool(watch.take_signs(7)) is moved, after
        watch = StackWatch()
