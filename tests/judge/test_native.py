"""The automatic native sample: when it is taken, and how one sample serves ranks with the same stack."""

from __future__ import annotations

from trainwatch.probes.judge.native import NativeCache, resolve_natively
from trainwatch.probes.judge.phases import classify, main_thread, stack_signature
from trainwatch.probes.read.processes.procfs import ThreadCounters
from trainwatch.probes.judge.progress import StackWatch
from trainwatch.probes.read.stacks.sampler import StackSample
from trainwatch.probes.snapshot import Frame, ThreadStack

SITE = "/venv/lib/python3.11/site-packages"
COUNTERS = ThreadCounters(cpu_ticks=10, voluntary=5, involuntary=1)


def backward_stack(pid: int, native: bool = False) -> tuple[ThreadStack, ...]:
    frames = [Frame("Tensor.backward", f"{SITE}/torch/_tensor.py", 623), Frame("step", "/w/train.py", 40)]
    if native:
        frames = [Frame("pthread_cond_wait", "libc.so.6", native=True),
                  Frame("c10d::Reducer::finalize_backward", "libtorch_cpu.so", native=True), *frames]
    return (ThreadStack("MainThread", pid, tuple(frames), active=False, is_main=True),)


def test_ranks_with_the_same_python_stack_share_one_native_sample():
    pids = [101, 102, 103]
    tracker, cache, asked = StackWatch(), NativeCache(), []
    samples = {pid: StackSample(pid, backward_stack(pid), COUNTERS, COUNTERS) for pid in pids}
    for pid in pids:  # seen once before with the same stack: unchanged now
        tracker.observe(pid, stack_signature(main_thread(samples[pid].threads)), "compute", COUNTERS, COUNTERS, 1.0)

    def take(wanted: list[int]) -> dict[int, StackSample]:
        asked.extend(wanted)
        return {pid: StackSample(pid, backward_stack(pid, native=True), COUNTERS, COUNTERS) for pid in wanted}

    classified = {pid: classify(s.threads) for pid, s in samples.items()}
    assert {c.phase for c in classified.values()} == {"compute"}  # what the Python stack alone says
    _, resolved = resolve_natively(samples, classified, cache, tracker, 2.0, take)
    assert asked == [101] and cache.taken == 1  # one dump for three ranks
    assert {(c.phase, c.op) for c in resolved.values()} == {("collective", "all_reduce (DDP gradients)")}
    assert resolved[102].detail == "phase from a native sample of PID 101, which has the same Python stack"
    # Next poll, same stacks: all three come from the cache, no new dump.
    _, again = resolve_natively(samples, classified, cache, tracker, 3.0, take)
    assert asked == [101] and again[103].phase == "collective"


def test_a_native_sample_that_could_not_be_had_is_said_and_taken_again_next_poll():
    """py-spy's native dump timed out (symbol loading on a loaded machine): the Python stack's
    "compute" stands, saying that the native stack was not read, and the next poll asks again."""
    from trainwatch.probes.errors import TrainwatchError

    pid, tracker, cache, asked = 7, StackWatch(), NativeCache(), []
    sample = StackSample(pid, backward_stack(pid), COUNTERS, COUNTERS)
    tracker.observe(pid, stack_signature(main_thread(sample.threads)), "compute", COUNTERS, COUNTERS, 1.0)

    def timed_out(wanted: list[int]) -> dict[int, StackSample]:
        asked.extend(wanted)
        return {p: StackSample(p, None, COUNTERS, COUNTERS, error=TrainwatchError("py-spy timed out after 12 s"))
                for p in wanted}

    classified = {pid: classify(sample.threads)}
    _, resolved = resolve_natively({pid: sample}, classified, cache, tracker, 2.0, timed_out)
    assert resolved[pid].phase == "compute"
    assert resolved[pid].detail == "native stack not read: py-spy timed out after 12 s"
    assert cache.taken == 0 and cache.lookup(pid, stack_signature(main_thread(sample.threads))) is None
    resolve_natively({pid: sample}, classified, cache, tracker, 3.0, timed_out)
    assert asked == [pid, pid]


def test_no_native_sample_for_a_moving_or_waking_rank():
    cache = NativeCache()
    sample = StackSample(7, backward_stack(7), COUNTERS, COUNTERS)
    cls = classify(sample.threads)
    signature = stack_signature(main_thread(sample.threads))
    assert not cache.wanted(7, signature, cls, unchanged=False, woke=False, now=1.0)  # its stack moved
    assert not cache.wanted(7, signature, cls, unchanged=True, woke=True, now=1.0)  # it keeps waking
    assert cache.wanted(7, signature, cls, unchanged=True, woke=False, now=1.0)
    collective = classify((ThreadStack("MainThread", 7, (
        Frame("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 2800),
        Frame("step", "/w/train.py", 44)), is_main=True),))
    assert not cache.wanted(7, signature, collective, unchanged=True, woke=False, now=1.0)  # clear already


def test_completed_collectives_advancing_are_progress():
    from trainwatch.probes.judge.progress import CompletedCollectives
    from trainwatch.probes.snapshot import CollectiveState, RankCollective

    def state(done0: int, done1: int) -> CollectiveState:
        return CollectiveState("hook", (RankCollective(0, last_completed=done0, pending_seq=done0 + 1),
                                        RankCollective(1, last_completed=done1)))
    seen = CompletedCollectives()
    assert seen.advanced(state(543, 543)) == set()  # first sight: nothing to compare with
    assert seen.advanced(state(543, 550)) == {1}  # rank 1 completed more; rank 0 still behind #544
    assert seen.advanced(state(543, 550)) == set()
    assert seen.advanced(None) == set()


def test_a_compute_read_while_the_rank_ran_is_taken_again_once_it_sleeps():
    """Under load a native sample may catch DDP's backward still computing (the rank on a CPU);
    once the rank is found asleep at the same Python line it waits, in its gradient all_reduce:
    the cached "compute" is not used, and the next poll takes another sample."""
    from trainwatch.probes.snapshot import KernelState

    pid, tracker, cache = 7, StackWatch(), NativeCache()
    plain = backward_stack(pid)
    signature = stack_signature(main_thread(plain))
    tracker.observe(pid, signature, "compute", COUNTERS, COUNTERS, 1.0)
    computing = (ThreadStack("MainThread", pid, (Frame("at::native::cpu_kernel", "libtorch_cpu.so", native=True),
                                                 *plain[0].frames), is_main=True),)
    took: list[int] = []

    def take(answer):
        def run(wanted: list[int]) -> dict[int, StackSample]:
            took.extend(wanted)
            return {p: StackSample(p, answer, COUNTERS, COUNTERS) for p in wanted}
        return run

    running = {pid: StackSample(pid, plain, COUNTERS, COUNTERS, kernel=KernelState(letter="R"))}
    _, first = resolve_natively(running, {pid: classify(plain)}, cache, tracker, 2.0, take(computing))
    assert first[pid].phase == "compute" and took == [pid]
    # still on a CPU: the cached "compute" stands, no second dump
    _, same = resolve_natively(running, {pid: classify(plain)}, cache, tracker, 3.0, take(computing))
    assert same[pid].phase == "compute" and took == [pid]
    # asleep now at the same line: not "compute" from the cache; a new sample names the all_reduce
    asleep = {pid: StackSample(pid, plain, COUNTERS, COUNTERS, kernel=KernelState(letter="S"))}
    _, now = resolve_natively(asleep, {pid: classify(plain)}, cache, tracker, 4.0, take(backward_stack(pid, True)))
    assert took == [pid, pid]
    assert (now[pid].phase, now[pid].op) == ("collective", "all_reduce (DDP gradients)")
