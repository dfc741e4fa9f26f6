"""Real GPU recordings (one H100, NCCL 2.28, torch 2.11; see ../shared/recordings/h100/README.md)
replayed through the same steps the live view takes: classify each plain sample, decide ambiguous
ranks from a native sample, judge progress from the main thread's counters, then the verdict.

Measured during the recorded hangs: main thread voluntary context switches +0 and CPU at 100%
(``fixtures/h100/pyspy/*-counters.txt`` and the README). The healthy ``gpubound`` ranks do a gloo
all_reduce every step (about 1 step/s) and their Python stack is the same in every sample; they
spin in ``synchronize`` through almost all of each step, so their few wake-ups tell nothing either
(measured on an H200: ``test_h200_spin.py``). Their step local, read with ``--locals``, does; these
H100 dumps were taken without it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dataclasses import replace

from recorded import END, JudgeMemory, judged, load, observe, replay
from trainwatch.probes.judge.phases import classify, main_thread, stack_signature
from trainwatch.probes.judge.progress import StackWatch
from trainwatch.probes.observed import ObservedRank
from trainwatch.probes.read.processes.process import collective_timeout_s
from trainwatch.probes.read.processes.procfs import ThreadCounters
from trainwatch.probes.snapshot import LogActivity
from trainwatch.probes.read.collectives.flightrec import load_trace, read_rows

PYSPY = Path(__file__).parents[1] / "fixtures" / "h100" / "pyspy"


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
    memory = JudgeMemory()
    result = judged(memory, [observe(prefix, pid, wakeups_per_sample=0)])
    (rank,), verdict = result.ranks, result.verdict
    assert (rank.state, rank.phase, rank.op, rank.where) == ("stuck", "gpu_wait", op, where)
    assert verdict.kind == "unknown"
    assert verdict.summary == (f"rank 0 waits on its GPU ({op}) at {where} for 3 s; no collective state yet: "
                               "not called a hang before 120 s (the floor for a GPU wait)")


@pytest.mark.parametrize("prefix,pid,op,where", HANGS, ids=[h[0] for h in HANGS])
def test_nccl_hangs_judged_hang_once_the_bound_passes(prefix, pid, op, where):
    memory = JudgeMemory()
    evidence = observe(prefix, pid, wakeups_per_sample=0)
    verdict = judged(memory, [evidence], now=END + 122.0).verdict  # the live view, 2 min on: no progress since
    assert verdict.kind == "hang"
    assert verdict.summary.startswith(f"rank 0 waits on its GPU ({op}) at {where} for 125s+: no local culprit")
    assert verdict.summary.endswith("; waited past 120 s (the floor for a GPU wait) with no sign of progress")


@pytest.mark.parametrize("prefix,pid,op,where", HANGS, ids=[h[0] for h in HANGS])
def test_nccl_hangs_judged_hang_at_once_when_the_log_went_silent(prefix, pid, op, where):
    memory = JudgeMemory()
    silent = LogActivity(age_s=19 * 60, every_s=10.0, longest_s=12.0)
    verdict = judged(memory, [replace(observe(prefix, pid, wakeups_per_sample=0), log=silent)]).verdict
    assert verdict.kind == "hang"
    assert verdict.summary.endswith("; last output 19 min ago; it wrote every 10 s: its log went silent")


def first_attach(log: LogActivity | None = None, prefix: str = "nccl_item-pid557", pid: int = 557, **fields):
    """The recorded hang's rank on first attach with ``log`` (and other evidence ``fields``), judged."""
    memory = JudgeMemory()
    evidence = replace(observe(prefix, pid, wakeups_per_sample=0), log=log, **fields)
    return memory, evidence, judged(memory, [evidence]).verdict


def test_a_progress_bar_gives_the_rhythm_on_first_attach():
    # " 12%|█▏ | 120/1000 [16:02<1:57:36,  8.02s/it]" as the log's last line, 19 minutes ago
    _m, _e, verdict = first_attach(LogActivity(age_s=19 * 60, bar_s=8.02))
    assert verdict.kind == "hang"
    assert verdict.summary.endswith("; last output 19 min ago; its progress bar ran at 8.02 s/it: its log went silent")
    _m, _e, mid_step = first_attach(LogActivity(age_s=6.0, bar_s=8.02))  # a healthy 8 s step, 6 s in
    assert mid_step.kind == "unknown"


def test_log_age_alone_is_shown_but_is_no_evidence():
    # On first attach the log's rhythm is not known yet: a job may print once every 20 minutes.
    _m, _e, verdict = first_attach(LogActivity(age_s=19 * 60, own=False))
    assert verdict.kind == "unknown"
    assert verdict.summary.endswith("(the floor for a GPU wait); last output 19 min ago (a shared log)")


def test_a_log_still_growing_at_its_rhythm_is_no_evidence():
    _m, _e, verdict = first_attach(LogActivity(age_s=20.0, every_s=10.0, longest_s=12.0))
    assert verdict.kind == "unknown"


def test_the_jobs_own_timeout_and_rhythm_set_the_bound():
    memory, evidence, _v = first_attach(collective_timeout_s=collective_timeout_s({"DEEPSPEED_TIMEOUT": "1"}))
    verdict = judged(memory, [evidence], now=END + 58.0).verdict  # 61 s waiting, past its 60 s timeout
    assert verdict.kind == "hang" and "waited past 60 s (the job's collective timeout)" in verdict.summary
    memory, evidence, _v = first_attach(step_period_s=50.0)  # 50 s steps: not even stuck before 3 of them
    assert judged(memory, [evidence], now=END + 122.0).verdict.kind == "healthy"
    verdict = judged(memory, [evidence], now=END + 148.0).verdict
    assert verdict.kind == "hang" and "waited past 150 s (3 of its 50 s steps)" in verdict.summary


def test_gpu_waits_at_different_places_are_no_mismatch_without_evidence():
    memory = JudgeMemory()
    ranks = [observe("nccl_item-pid557", 557, wakeups_per_sample=0, rank=0),
             observe("nccl_sync-pid564", 564, wakeups_per_sample=0, rank=1)]
    verdict = judged(memory, ranks).verdict
    assert verdict.kind == "unknown"
    assert verdict.summary.startswith("all 2 ranks wait on their GPUs (rank 0 is in a GPU wait (item()) at gpujob.py:100 "
                                      "main; rank 1 is in a GPU wait (synchronize) at gpujob.py:97 main) for 3 s; "
                                      "no collective state yet")
    later = judged(memory, ranks, now=END + 122.0).verdict
    assert later.kind == "mismatch" and later.summary.startswith("ranks disagree: rank 0 is in a GPU wait (item())")
    assert later.summary.endswith("waited past 120 s (the floor for a GPU wait) with no sign of progress")


def test_trainer_hang_keeps_the_users_own_frame():
    rank = replay("nccl_trainer", 484, wakeups_per_sample=0)
    assert rank.user_frame == "ddpjob.py:42 main"  # the user's trainer.train() call, under transformers


@pytest.mark.parametrize("prefix,pid", [("nccl_item-pid557", 557), ("nccl_ddp", 485), ("nccl_trainer", 484)])
def test_without_native_frames_the_spin_looks_like_work(prefix, pid):
    # What trainwatch 0.1.0 said: without the native sample the 100% CPU counts as compute.
    rank = replay(prefix, pid, wakeups_per_sample=0, native=False)
    assert (rank.state, rank.phase) == ("running", "compute")


def test_nccl_barrier_stays_a_collective_hang_without_native_sample():
    memory = JudgeMemory()
    result = judged(memory, [observe("nccl_barrier-pid555", 555, wakeups_per_sample=0)])
    (rank,) = result.ranks
    assert (rank.state, rank.phase, rank.op, rank.native) == ("stuck", "collective", "barrier", False)
    assert not any(f.native for t in rank.threads for f in t.frames)  # clear from Python: no native sample
    assert result.verdict.kind == "hang"


def test_gpubound_job_without_its_step_is_neither_healthy_nor_hung():
    # Three dumps at the same line and wake-ups made while spinning: no sign either way. With its
    # step (the H200 replay, test_h200_spin.py) the same job is healthy.
    memory = JudgeMemory()
    result = judged(memory, [observe(f"gpubound-pid{pid}", pid, wakeups_per_sample=4, rank=i)
                             for i, pid in enumerate((558, 559))])
    assert [(r.phase, r.state) for r in result.ranks] == [("gpu_wait", "stuck")] * 2
    assert result.verdict.kind == "unknown"
    assert result.verdict.summary.endswith("no collective state yet: not called a hang before 120 s (the floor for a GPU wait)")


def test_counters_in_the_recordings_are_a_spin():
    for name in ("nccl_ddp", "nccl_trainer"):
        text = (PYSPY / f"{name}-counters.txt").read_text()
        assert "voluntary +0" in text and "cpu ticks +20" in text


def test_nccl_item_hang_with_its_flight_recorder_names_the_pending_all_reduce():
    # The Flight Recorder dump taken through the hook during the same recorded hang.
    fr = Path(__file__).parents[1] / "fixtures" / "fr" / "h100" / "hook-dump_nccl_trace_json-hung.json"
    state = read_rows({0: load_trace(fr.read_bytes())})
    (row,) = state.ranks
    memory = JudgeMemory()
    evidence = observe("nccl_item-pid557", 557, wakeups_per_sample=0)
    verdict = judged(memory, [evidence], state, now=row.pending_since + 27.4).verdict
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
    recorded CUDA waits do (voluntary context switches +0, CPU 100%), then moves on; the live view
    polls it every second from first attach and the one judge decides."""
    pid, memory, watch = 558, JudgeMemory(), StackWatch()  # the sampler's look, the judge's memory
    waiting = load("gpubound-pid558-1", pid)
    moving = _moved_on(waiting)
    now, ticks, seen = 1000.0, 0, []
    for step in range(3):
        for threads in [waiting] * 8 + [moving]:
            now, ticks = now + 1.0, ticks + 100
            counters = ThreadCounters(cpu_ticks=ticks, voluntary=40, involuntary=3)
            cls = classify(threads)
            watch.observe(pid, stack_signature(main_thread(threads)), cls.phase, counters, counters, now)
            evidence = ObservedRank(rank=0, pid=pid, host="h", phase=cls.phase, op=cls.op, where=cls.where,
                                    user_frame=cls.user_frame, threads=threads, progress_seen=watch.take_signs(pid),
                                    watched_since=watch.first_seen(pid))
            seen.append((step, cls.phase, judged(memory, [evidence], now=now).verdict))
    assert {phase for _s, phase, _v in seen} == {"gpu_wait", "compute"}
    assert not [v for _s, _p, v in seen if v.kind == "hang"]
    first = [v for s, _p, v in seen if s == 0 and v.kind == "unknown"]  # before its rhythm is known
    assert first and first[-1].summary.startswith("rank 0 waits on its GPU (synchronize) at gpujob.py:73 main for 7 s; "
                                                  "no collective state yet")
    assert all(v.kind == "healthy" for s, _p, v in seen if s > 0)  # then it is seen to come out of it
