"""Real H200 recordings (``fixtures/h200``, see its README) replayed through the sampler's look and
the one judge: hung NCCL ranks spin in ``cuStreamSynchronize`` and now and then make two voluntary
context switches between two looks, as many as a healthy rank whose step blocks once in a short gloo
all_reduce. Neither's wake-ups are progress (both spun through the gap); the healthy rank's step is.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from recorded import JOB
from trainwatch.probes.judge.judgement import JudgeMemory, JudgeOptions, judge_job
from trainwatch.probes.judge.progress import MIN_WAKEUPS, StackWatch, spun
from trainwatch.probes.judge.verdict import judge
from trainwatch.probes.observed import ObservedJob, ObservedRank, StackSample, ThreadCounters
from trainwatch.probes.read.processes.exits import ExitLedger
from trainwatch.probes.read.stacks.pyspy import parse_dump, parse_locals
from trainwatch.probes.sampling import Sampler
from trainwatch.probes.snapshot import Snapshot

H200 = Path(__file__).parents[1] / "fixtures" / "h200"
LOOK_EVERY = 75  # rows of 20 ms: a look every 1.5 s, as `snapshot` spaces its three samples
HUNG = [773, 774, 775, 776, 777, 778, 779]  # ranks 0-6, behind rank 7 (PID 780) at .item()


def counters(name: str) -> dict[int, list[ThreadCounters]]:
    """Each main thread's recorded counters (every 20 ms for 4 s, no py-spy running)."""
    data = json.loads((H200 / name).read_text())
    assert data["columns"][:7] == ["at_ns", "state", "cpu_ticks", "voluntary", "involuntary", "run_ns", "queued_ns"]
    return {int(pid): [ThreadCounters(cpu_ticks=r[2], voluntary=r[3], involuntary=r[4], at_ns=r[0], run_ns=r[5],
                                      queued_ns=r[6]) for r in rows] for pid, rows in data["rows"].items()}


def gaps(rows: list[ThreadCounters]) -> list[tuple[ThreadCounters, ThreadCounters]]:
    """Every pair of readings 1.5 s apart (each start offset: many looks from one recording)."""
    return [(rows[i], rows[i + LOOK_EVERY]) for i in range(len(rows) - LOOK_EVERY)]


def progress_marks(rows: list[ThreadCounters], pid: int, phase: str) -> int:
    """Looks 1.5 s apart at an unchanging stack, as the sampler takes them: the progress it sees."""
    marks = 0
    for offset in range(LOOK_EVERY):
        watch = StackWatch()
        for n, reading in enumerate(rows[offset::LOOK_EVERY]):
            watch.observe(pid, ("same stack",), phase, reading, reading, 1000.0 + 1.5 * n)
        marks += len(watch.take_signs(pid))
    return marks


def test_hung_ranks_wake_now_and_then_but_spin():
    hang = counters("nccl8-hang-main-thread-schedstat-20ms.json")
    woke = {pid for pid in HUNG if any(b.voluntary - a.voluntary >= MIN_WAKEUPS for a, b in gaps(hang[pid]))}
    assert len(woke) >= 3  # the wake-ups alone (trainwatch before this) would have called these running
    assert all(spun(a, b) for pid in HUNG for a, b in gaps(hang[pid]))
    assert [progress_marks(hang[pid], pid, "gpu_wait") for pid in HUNG] == [0] * 7


def test_without_times_the_wake_ups_alone_count():
    # Counters without times (where nothing says whether the thread slept) keep the old rule: the
    # ranks that woke twice between two looks are taken as running, as trainwatch said before.
    hang = counters("nccl8-hang-main-thread-schedstat-20ms.json")
    bare = {pid: [replace(c, at_ns=None, run_ns=None, queued_ns=None) for c in hang[pid]] for pid in HUNG}
    assert sum(progress_marks(bare[pid], pid, "gpu_wait") > 0 for pid in HUNG) >= 3


def test_the_rank_that_sleeps_in_python_wakes_and_sleeps():
    # Rank 7 loops on time.sleep(1): it blocks and wakes, it does not spin; that is its progress.
    straggler = counters("nccl8-hang-main-thread-schedstat-20ms.json")[780]
    assert not any(spun(a, b) for a, b in gaps(straggler))
    assert progress_marks(straggler, 780, "sleep") > 0


def test_healthy_gpubound_ranks_spin_as_much_and_wake_as_often():
    bound = counters("gpubound-main-thread-schedstat-20ms.json")
    for pid, rows in bound.items():
        assert sum(b.voluntary - a.voluntary >= MIN_WAKEUPS for a, b in gaps(rows)) > len(gaps(rows)) / 2
        assert all(spun(a, b) for a, b in gaps(rows))
        assert progress_marks(rows, pid, "gpu_wait") == 0  # its wake-ups tell nothing...


def gpubound_ranks() -> list[ObservedRank]:
    """The healthy gpubound job's two ranks as the sampler sees them: their real ``py-spy dump
    --locals`` (the same stack, in ``synchronize``, at step 12 then 14), between readings of their
    recorded counters 1.5 s apart."""
    dumps = {int(pid): runs for pid, runs in json.loads((H200 / "gpubound-pyspy-locals.json").read_text()).items()}
    readings = counters("gpubound-main-thread-schedstat-20ms.json")
    sampler = Sampler(ExitLedger(root_pid=1))
    pids = sorted(dumps)
    for n in range(2):
        now = 1000.0 + 1.5 * n
        samples = {}
        for pid, rows in zip(pids, readings.values()):
            before, after = rows[LOOK_EVERY * n], rows[LOOK_EVERY * n + 1]
            samples[pid] = StackSample(pid, tuple(parse_dump(dumps[pid][n], pid)), before, after,
                                       ints=parse_locals(dumps[pid][n], pid), at=now)
        sampler.absorb(samples, now, lambda wanted: {}, resolve=False)
    out = []
    for rank, pid in enumerate(pids):
        cls = sampler.classes[pid]
        out.append(ObservedRank(rank=rank, pid=pid, host="h", phase=cls.phase, op=cls.op, where=cls.where,
                                user_frame=cls.user_frame, threads=sampler.stacks[pid],
                                progress_seen=sampler.watch.take_signs(pid), watched_since=1000.0))
    return out


def test_healthy_gpubound_job_is_healthy_by_its_steps():
    ranks = gpubound_ranks()
    assert [r.where for r in ranks] == ["gpujob.py:73 main"] * 2  # the same line in every dump
    assert [len(r.progress_seen) for r in ranks] == [1, 1]  # ...its step went 12 -> 14
    # judged at the second look, over the 1.5 s the two looks span (as `snapshot --window 1.5`)
    result = judge_job(ObservedJob(JOB, tuple(ranks), None), JudgeMemory(), 1001.5, JudgeOptions(window=1.5))
    assert [r.state for r in result.ranks] == ["running", "running"]
    assert result.verdict.kind == "healthy"


@pytest.mark.parametrize("name,expected", [("nccl8-hang-live-polls.json", "straggler [7]"),
                                           ("nccl8-healthy-live-polls.json", "healthy []"),
                                           ("gpubound-live-polls.json", "healthy []")])
def test_what_trainwatch_said_live_on_the_h200(name, expected):
    # Every poll of the live view (window 3 s, then one a second) on the H200, with this rule.
    verdicts = json.loads((H200 / name).read_text())["verdicts"]
    assert len(verdicts) >= 8
    assert {f"{v['kind']} {v['culprits']}" for v in verdicts} == {expected}


def test_a_rank_seen_moving_in_the_very_wait_is_no_culprit():
    # The snapshot that went wrong at issue 26's end, its ranks as judged then: 1, 2, 4 and 5 taken
    # as running at the .item() wait where 0, 3 and 6 were stuck. Having reached that wait, they are
    # not what holds the others up: only rank 7 (asleep in Python) is named.
    snap = Snapshot.from_json((H200 / "nccl8-one-gpu-snapshot-wrong-culprits.json").read_text())
    assert snap.verdict.culprits == (1, 2, 4, 5, 7)  # what was said then
    assert {r.rank for r in snap.ranks if r.state == "running" and r.phase == "gpu_wait"} == {1, 2, 4, 5}
    verdict = judge(snap.ranks, snap.job, now=snap.taken_at)
    assert (verdict.kind, verdict.culprits) == ("straggler", (7,))
    assert verdict.summary == ("rank 7 is in sleep at nccl_hang.py:32 <module> while ranks 0,3,6 wait on their GPU "
                               "(item()) at nccl_hang.py:34 <module> (ranks 1-2,4-5 at the same wait show progress)")


def test_with_nobody_elsewhere_a_wait_some_pass_is_not_a_hang():
    # The gpubound job under the wake-up rule alone: rank 1 taken as stuck at the synchronize where
    # rank 0 was seen moving. No culprit: nobody is elsewhere.
    judged = judge_job(ObservedJob(JOB, tuple(gpubound_ranks()), None), JudgeMemory(), 1001.5, JudgeOptions(window=1.5))
    running, moving = judged.ranks
    verdict = judge((running, replace(moving, state="stuck")))
    assert (verdict.kind, verdict.culprits) == ("unknown", ())
    assert verdict.summary == ("rank 1 waits on its GPU (synchronize) at gpujob.py:73 main with no sign of progress, "
                               "while rank 0 at the same wait shows some: not called a hang")
