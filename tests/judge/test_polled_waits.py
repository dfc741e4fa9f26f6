"""A wait that polls on a timer (PyTorch's ``WorkNCCL::wait`` under ``TORCH_NCCL_BLOCKING_WAIT``
or with a timeout: ``while (!isCompleted()) sleep_for(10 ms)``, from PyTorch's source) wakes a
hundred times a second and sleeps in between, however long the collective is stuck: those wake-ups
are its timer's. Counters shaped as a 1 s look at such a thread; the reader's part (the syscall a
real sleeping thread is read in) is tested on a real process in tests/read/test_proc.py."""

from __future__ import annotations

import pytest

from trainwatch.probes.judge.progress import StackWatch
from trainwatch.probes.observed import ThreadCounters

SECOND = 1_000_000_000


def look(n: int, syscall: str | None) -> ThreadCounters:
    """The n-th reading, a second apart: 100 wake-ups and 10 ms on a CPU a second, asleep in ``syscall``."""
    return ThreadCounters(cpu_ticks=n, voluntary=100 * n, involuntary=0, at_ns=n * SECOND,
                          run_ns=n * SECOND // 100, queued_ns=0, syscall=syscall)


def progress(phase: str, syscall: str | None) -> int:
    watch = StackWatch()
    for n in range(4):
        reading = look(n, syscall)
        watch.observe(7, ("same stack",), phase, reading, reading, 1000.0 + n)
    return len(watch.take_signs(7))


@pytest.mark.parametrize("phase", ["collective", "gpu_wait"])
def test_a_collective_that_polls_on_a_timer_is_not_progressing(phase):
    assert progress(phase, "clock_nanosleep") == 0
    assert progress(phase, "nanosleep") == 0


def test_the_same_wake_ups_in_a_blocking_wait_are_answers():
    assert progress("collective", "futex") == 3  # woken by its peers: a collective completing each time
    assert progress("collective", None) == 3


def test_a_python_sleep_loop_keeps_its_wake_ups():
    # time.sleep in the user's loop (phase "sleep") is not a collective polling: a loop that sleeps
    # each step would otherwise read as hung.
    assert progress("sleep", "clock_nanosleep") == 3


def test_a_rank_read_on_a_timer_is_dumped_again_and_sampled_natively():
    watch = StackWatch()
    watch.observe(7, ("same stack",), "lock", look(0, "clock_nanosleep"), look(0, "clock_nanosleep"), 1000.0)
    assert watch.needs_dump(7, look(1, "clock_nanosleep"))  # its wake-ups may be a poll's: look again
    assert not watch.woke(7, look(1, "clock_nanosleep"))  # so a native sample may say which wait it is
    assert not watch.needs_dump(7, look(1, "futex")) and watch.woke(7, look(1, "futex"))


def test_a_rank_last_seen_in_a_collective_has_its_step_read_in_the_next_dump():
    """A lockstep job's ranks wait for each other every step: a healthy rank is caught at its
    all_reduce at two looks running, its wake-ups read on its own ``time.sleep``'s timer (the kernel
    is read just before the dump). Only its step says it went round, so the next dump reads it
    (seen under load: a healthy job called a straggler for one look)."""
    from trainwatch.probes.read.processes.exits import ExitLedger
    from trainwatch.probes.sampling import Sampler

    sampler = Sampler(ExitLedger(root_pid=1))
    for pid, phase in ((7, "collective"), (8, "sleep"), (9, "gpu_wait")):
        sampler.steps.observe(pid, (), {}, look(0, "clock_nanosleep"), 1000.0)  # its step read a round ago
        sampler.watch.observe(pid, ("computing",), "compute", look(0, None), look(0, None), 1000.0)
        sampler.watch.observe(pid, ("waiting",), phase, look(1, "clock_nanosleep"), look(1, "clock_nanosleep"), 1001.0)
        assert not sampler.watch.unclear(pid)  # its stack moved: progress, and nothing unclear yet
    requests = [(pid, False, None, False, look(2, "clock_nanosleep"), None) for pid in (7, 8, 9)]
    due = sampler._steps_due(requests, poll=1, problem=False)
    assert due == {7, 9}  # the sleeping loop's wake-ups already showed progress: no --locals for it
