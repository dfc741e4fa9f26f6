"""Real GPU recordings (one H100, NCCL 2.28, torch 2.11; see ../shared/recordings/h100/README.md)
replayed through the same steps the live view takes: classify each plain sample, decide ambiguous
ranks from a native sample, judge progress from the main thread's counters, then the verdict.

Measured during the recorded hangs: main thread voluntary context switches +0 and CPU at 100%
(``fixtures/h100/pyspy/*-counters.txt`` and the README). The healthy ``gpubound`` ranks do a gloo
all_reduce every step (about 1 step/s), so their main threads block and wake each second: that is
what tells them from a hang, since their Python stack is the same in every sample.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from trainwatch.probes.judge.gpuwait import collective_timeout_s
from trainwatch.probes.judge.native import NativeCache, resolve_natively
from trainwatch.probes.judge.phases import classify, main_thread, stack_signature
from trainwatch.probes.judge.progress import ProgressTracker
from trainwatch.probes.judge.verdict import judge
from trainwatch.probes.read.procfs import ThreadCounters
from trainwatch.probes.read.pyspy import parse_dump
from trainwatch.probes.read.sampler import StackSample
from trainwatch.probes.snapshot import Job, LogActivity, Rank

PYSPY = Path(__file__).parents[1] / "fixtures" / "h100" / "pyspy"
WINDOW = 3.0
SPACING = WINDOW / 2  # three samples over the window, as `snapshot` takes them


def load(name: str, pid: int) -> tuple:
    return tuple(parse_dump(json.loads((PYSPY / f"{name}.json").read_text()), pid))


def replay(prefix: str, pid: int, wakeups_per_sample: int, native: bool = True) -> Rank:
    """One rank through three plain samples (+ the recorded native one when asked for)."""
    tracker, cache = ProgressTracker(), NativeCache()
    native_threads = load(f"{prefix}-native", pid)
    now = 1000.0
    for i in (1, 2, 3):
        now += SPACING
        counters = ThreadCounters(cpu_ticks=150 * i, voluntary=40 + wakeups_per_sample * i, involuntary=3)
        sample = StackSample(pid, load(f"{prefix}-{i}", pid), counters, counters)

        def take(pids: list[int]) -> dict[int, StackSample]:
            return {p: StackSample(p, native_threads if native else None, counters, counters) for p in pids}

        samples, classes = resolve_natively({pid: sample}, {pid: classify(sample.threads)}, cache, tracker, now, take)
        tracker.observe(pid, stack_signature(main_thread(samples[pid].threads)), classes[pid].phase,
                        samples[pid].before, samples[pid].after, now)
    cls = classes[pid]
    idle = tracker.idle_for(pid, now)
    stuck = idle >= tracker.threshold(pid, WINDOW) * 0.95 and tracker.observed_for(pid, now) >= WINDOW * 0.95
    return Rank(rank=0, pid=pid, state="stuck" if stuck else "running", phase=cls.phase, op=cls.op,
                where=cls.where, user_frame=cls.user_frame, stuck_for_s=round(idle, 1) if stuck else None,
                threads=samples[pid].threads)


HANGS = [  # (recording, pid, op shown, where)
    ("nccl_item-pid557", 557, "item()", "gpujob.py:100 main"),
    ("nccl_sync-pid564", 564, "synchronize", "gpujob.py:97 main"),
    ("nccl_wait-pid554", 554, "synchronize", "gpujob.py:95 main"),
    ("nccl_ddp", 485, "item()", "ddpjob.py:27 main"),
    ("nccl_trainer", 484, "item()", "masking_utils.py:755 find_packed_sequence_indices"),
]


@pytest.mark.parametrize("prefix,pid,op,where", HANGS, ids=[h[0] for h in HANGS])
def test_nccl_hangs_are_not_called_hang_on_first_attach_without_evidence(prefix, pid, op, where):
    # 3 s of waiting on the GPU and no collective state: a long GPU step would look the same.
    rank = replay(prefix, pid, wakeups_per_sample=0)
    assert (rank.state, rank.phase, rank.op, rank.where) == ("stuck", "gpu_wait", op, where)
    verdict = judge([rank], Job("torchrun", 1, "h"))
    assert verdict.kind == "unknown"
    assert verdict.summary == (f"rank 0 waits on its GPU ({op}) at {where} for 3 s; no collective state yet: "
                               "not called a hang before 120 s (the floor for a GPU wait)")


@pytest.mark.parametrize("prefix,pid,op,where", HANGS, ids=[h[0] for h in HANGS])
def test_nccl_hangs_judged_hang_once_the_bound_passes(prefix, pid, op, where):
    rank = replace(replay(prefix, pid, wakeups_per_sample=0), stuck_for_s=125.0)  # the live view, 2 min on
    verdict = judge([rank], Job("torchrun", 1, "h"))
    assert verdict.kind == "hang"
    assert verdict.summary.startswith(f"rank 0 waits on its GPU ({op}) at {where} for 125s+: no local culprit")
    assert verdict.summary.endswith("; waited past 120 s (the floor for a GPU wait) with no sign of progress")


@pytest.mark.parametrize("prefix,pid,op,where", HANGS, ids=[h[0] for h in HANGS])
def test_nccl_hangs_judged_hang_at_once_when_the_log_went_silent(prefix, pid, op, where):
    silent = LogActivity(age_s=19 * 60, every_s=10.0, longest_s=12.0)
    rank = replace(replay(prefix, pid, wakeups_per_sample=0), log=silent)
    verdict = judge([rank], Job("torchrun", 1, "h"))
    assert verdict.kind == "hang"
    assert verdict.summary.endswith("; last output 19 min ago; it wrote every 10 s: its log went silent")


def test_a_progress_bar_gives_the_rhythm_on_first_attach():
    stalled = LogActivity(age_s=19 * 60, bar_s=8.02)  # " 12%|█▏ | 120/1000 [16:02<1:57:36,  8.02s/it]"
    rank = replace(replay("nccl_trainer", 484, wakeups_per_sample=0), log=stalled)
    verdict = judge([rank], Job("torchrun", 1, "h"))
    assert verdict.kind == "hang"
    assert verdict.summary.endswith("; last output 19 min ago; its progress bar ran at 8.02 s/it: its log went silent")
    mid_step = replace(rank, log=LogActivity(age_s=6.0, bar_s=8.02))  # a healthy 8 s step, 6 s in
    assert judge([mid_step], Job("torchrun", 1, "h")).kind == "unknown"


def test_log_age_alone_is_shown_but_is_no_evidence():
    # On first attach the log's rhythm is not known yet: a job may print once every 20 minutes.
    rank = replace(replay("nccl_item-pid557", 557, wakeups_per_sample=0), log=LogActivity(age_s=19 * 60, own=False))
    verdict = judge([rank], Job("torchrun", 1, "h"))
    assert verdict.kind == "unknown"
    assert verdict.summary.endswith("(the floor for a GPU wait); last output 19 min ago (a shared log)")


def test_a_log_still_growing_at_its_rhythm_is_no_evidence():
    rank = replace(replay("nccl_item-pid557", 557, wakeups_per_sample=0),
                   log=LogActivity(age_s=20.0, every_s=10.0, longest_s=12.0))
    assert judge([rank], Job("torchrun", 1, "h")).kind == "unknown"


def test_the_jobs_own_timeout_and_rhythm_set_the_bound():
    rank = replay("nccl_item-pid557", 557, wakeups_per_sample=0)
    short = replace(rank, stuck_for_s=61.0, collective_timeout_s=collective_timeout_s({"DEEPSPEED_TIMEOUT": "1"}))
    verdict = judge([short], Job("torchrun", 1, "h"))
    assert verdict.kind == "hang" and "waited past 60 s (the job's collective timeout)" in verdict.summary
    slow = replace(rank, stuck_for_s=125.0, step_period_s=50.0)  # 50 s steps: 3 steps before a hang
    verdict = judge([slow], Job("torchrun", 1, "h"))
    assert verdict.kind == "unknown" and "not called a hang before 150 s (3 of its 50 s steps)" in verdict.summary


def test_trainer_hang_keeps_the_users_own_frame():
    rank = replay("nccl_trainer", 484, wakeups_per_sample=0)
    assert rank.user_frame == "ddpjob.py:42 main"  # the user's trainer.train() call, under transformers


@pytest.mark.parametrize("prefix,pid", [("nccl_item-pid557", 557), ("nccl_ddp", 485), ("nccl_trainer", 484)])
def test_without_native_frames_the_spin_looks_like_work(prefix, pid):
    # What trainwatch 0.1.0 said: without the native sample the 100% CPU counts as compute.
    rank = replay(prefix, pid, wakeups_per_sample=0, native=False)
    assert (rank.state, rank.phase) == ("running", "compute")


def test_nccl_barrier_stays_a_collective_hang_without_native_sample():
    rank = replay("nccl_barrier-pid555", 555, wakeups_per_sample=0)
    assert (rank.state, rank.phase, rank.op, rank.native) == ("stuck", "collective", "barrier", False)
    assert not any(f.native for t in rank.threads for f in t.frames)  # clear from Python: no native sample
    assert judge([rank], Job("torchrun", 1, "h")).kind == "hang"


def test_gpubound_job_stays_healthy():
    ranks = [replay(f"gpubound-pid{pid}", pid, wakeups_per_sample=4) for pid in (558, 559)]
    ranks = [Rank(**{**r.__dict__, "rank": i}) for i, r in enumerate(ranks)]
    assert [r.phase for r in ranks] == ["gpu_wait", "gpu_wait"]  # a sync point, seen each time...
    assert [r.state for r in ranks] == ["running", "running"]  # ...but it blocks and wakes every step
    assert judge(ranks, Job("torchrun", 1, "h")).kind == "healthy"


def test_counters_in_the_recordings_are_a_spin():
    for name in ("nccl_ddp", "nccl_trainer"):
        text = (PYSPY / f"{name}-counters.txt").read_text()
        assert "voluntary +0" in text and "cpu ticks +20" in text


def test_nccl_item_hang_with_its_flight_recorder_names_the_pending_all_reduce():
    # The Flight Recorder dump taken through the hook during the same recorded hang.
    from trainwatch.probes.judge import flightrec
    fr = Path(__file__).parents[1] / "fixtures" / "fr" / "h100" / "hook-dump_nccl_trace_json-hung.json"
    state = flightrec.analyze({0: flightrec.load_trace(fr.read_bytes())})
    (row,) = state.ranks
    rank = replay("nccl_item-pid557", 557, wakeups_per_sample=0)
    verdict = judge([rank], Job("torchrun", 1, "h"), state, now=row.pending_since + 27.4)
    assert verdict.kind == "hang"
    assert verdict.summary.startswith(
        "rank 0 waits on its GPU (item()) at gpujob.py:100 main behind all_reduce #544 (pending 27 s) for")
    assert "no collective state" not in verdict.summary  # the pending collective says why it waits


def _moved_on(threads: tuple) -> tuple:
    """The recorded gpubound stack once the GPU work is done: out of ``synchronize`` (gpujob.py:73),
    back in ``main`` at gpujob.py:75, the step's next line."""
    out = []
    for thread in threads:
        if thread.is_main:
            frames = tuple(replace(f, line=75) if f.function == "main" else f
                           for f in thread.frames if f.function != "synchronize")
            thread = replace(thread, frames=frames)
        out.append(thread)
    return tuple(out)


def test_replayed_long_gpu_step_is_never_hang():
    """A healthy rank whose host blocks 8 s in ``torch.cuda.synchronize`` every step, spinning as the
    recorded CUDA waits do (voluntary context switches +0, CPU 100%), then moves on; a live view
    polls it every second from first attach, deciding stuck as live.py does."""
    pid, job = 558, Job("torchrun", 1, "h")
    waiting = load("gpubound-pid558-1", pid)
    moving = _moved_on(waiting)
    tracker, now, ticks, seen = ProgressTracker(), 1000.0, 0, []
    for step in range(3):
        for threads in [waiting] * 8 + [moving]:
            now, ticks = now + 1.0, ticks + 100
            counters = ThreadCounters(cpu_ticks=ticks, voluntary=40, involuntary=3)
            cls = classify(threads)
            tracker.observe(pid, stack_signature(main_thread(threads)), cls.phase, counters, counters, now)
            idle = tracker.idle_for(pid, now)
            stuck = idle >= tracker.threshold(pid, WINDOW) * 0.95 and tracker.observed_for(pid, now) >= WINDOW * 0.95
            rank = Rank(rank=0, pid=pid, state="stuck" if stuck else "running", phase=cls.phase, op=cls.op,
                        where=cls.where, stuck_for_s=round(idle, 1) if stuck else None, threads=threads,
                        longest_quiet_s=tracker.longest_gap(pid))
            seen.append((step, cls.phase, judge([rank], job, now=now)))
    assert {phase for _s, phase, _v in seen} == {"gpu_wait", "compute"}
    assert not [v for _s, _p, v in seen if v.kind == "hang"]
    first = [v for s, _p, v in seen if s == 0 and v.kind == "unknown"]  # before its rhythm is known
    assert first and first[-1].summary.startswith("rank 0 waits on its GPU (synchronize) at gpujob.py:73 main for 7 s; "
                                                  "no collective state yet")
    assert all(v.kind == "healthy" for s, _p, v in seen if s > 0)  # then it is seen to come out of it


def test_gpu_waits_at_different_places_are_no_mismatch_without_evidence():
    item = replace(replay("nccl_item-pid557", 557, wakeups_per_sample=0), rank=0)
    sync = replace(replay("nccl_sync-pid564", 564, wakeups_per_sample=0), rank=1)
    verdict = judge([item, sync], Job("torchrun", 1, "h"))
    assert verdict.kind == "unknown"
    assert verdict.summary.startswith("all 2 ranks wait on their GPUs (rank 0 is in a GPU wait (item()) at gpujob.py:100 "
                                      "main; rank 1 is in a GPU wait (synchronize) at gpujob.py:97 main) for 3 s; "
                                      "no collective state yet")
    later = judge([replace(r, stuck_for_s=125.0) for r in (item, sync)], Job("torchrun", 1, "h"))
    assert later.kind == "mismatch" and later.summary.startswith("ranks disagree: rank 0 is in a GPU wait (item())")
    assert later.summary.endswith("waited past 120 s (the floor for a GPU wait) with no sign of progress")
