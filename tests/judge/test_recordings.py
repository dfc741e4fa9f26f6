"""Real GPU recordings (one H100, NCCL 2.28, torch 2.11; see ../shared/recordings/h100/README.md)
replayed through the same steps the live view takes: classify each plain sample, decide ambiguous
ranks from a native sample, judge progress from the main thread's counters, then the verdict.

Measured during the recorded hangs: main thread voluntary context switches +0 and CPU at 100%
(``fixtures/h100/pyspy/*-counters.txt`` and the README). The healthy ``gpubound`` ranks do a gloo
all_reduce every step (about 1 step/s), so their main threads block and wake each second: that is
what tells them from a hang, since their Python stack is the same in every sample.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recorded import JudgeMemory, judged, observe, replay
from trainwatch.probes.read.flightrec import analyze, load_trace

PYSPY = Path(__file__).parents[1] / "fixtures" / "h100" / "pyspy"


HANGS = [  # (recording, pid, op shown, where)
    ("nccl_item-pid557", 557, "item()", "gpujob.py:100 main"),
    ("nccl_sync-pid564", 564, "synchronize", "gpujob.py:97 main"),
    ("nccl_wait-pid554", 554, "synchronize", "gpujob.py:95 main"),
    ("nccl_ddp", 485, "item()", "ddpjob.py:27 main"),
    ("nccl_trainer", 484, "item()", "masking_utils.py:755 find_packed_sequence_indices"),
]


@pytest.mark.parametrize("prefix,pid,op,where", HANGS, ids=[h[0] for h in HANGS])
def test_nccl_hangs_judged_hang_with_rank_in_gpu_wait(prefix, pid, op, where):
    memory = JudgeMemory()
    result = judged(memory, [observe(memory, prefix, pid, wakeups_per_sample=0)])
    (rank,), verdict = result.ranks, result.verdict
    assert (rank.state, rank.phase, rank.op, rank.where) == ("stuck", "gpu_wait", op, where)
    assert verdict.kind == "hang"
    assert verdict.summary.startswith(f"rank 0 waits on its GPU ({op}) at {where} for")


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
    result = judged(memory, [observe(memory, "nccl_barrier-pid555", 555, wakeups_per_sample=0)])
    (rank,) = result.ranks
    assert (rank.state, rank.phase, rank.op, rank.native) == ("stuck", "collective", "barrier", False)
    assert not any(f.native for t in rank.threads for f in t.frames)  # clear from Python: no native sample
    assert result.verdict.kind == "hang"


def test_gpubound_job_stays_healthy():
    memory = JudgeMemory()
    result = judged(memory, [observe(memory, f"gpubound-pid{pid}", pid, wakeups_per_sample=4, rank=i)
                             for i, pid in enumerate((558, 559))])
    ranks = result.ranks
    assert [r.phase for r in ranks] == ["gpu_wait", "gpu_wait"]  # a sync point, seen each time...
    assert [r.state for r in ranks] == ["running", "running"]  # ...but it blocks and wakes every step
    assert result.verdict.kind == "healthy"


def test_counters_in_the_recordings_are_a_spin():
    for name in ("nccl_ddp", "nccl_trainer"):
        text = (PYSPY / f"{name}-counters.txt").read_text()
        assert "voluntary +0" in text and "cpu ticks +20" in text


def test_nccl_item_hang_with_its_flight_recorder_names_the_pending_all_reduce():
    # The Flight Recorder dump taken through the hook during the same recorded hang.
    fr = Path(__file__).parents[1] / "fixtures" / "fr" / "h100" / "hook-dump_nccl_trace_json-hung.json"
    state = analyze({0: load_trace(fr.read_bytes())})
    (row,) = state.ranks
    memory = JudgeMemory()
    evidence = observe(memory, "nccl_item-pid557", 557, wakeups_per_sample=0)
    verdict = judged(memory, [evidence], state, now=row.pending_since + 27.4).verdict
    assert verdict.kind == "hang"
    assert verdict.summary.startswith(
        "rank 0 waits on its GPU (item()) at gpujob.py:100 main behind all_reduce #544 (pending 27 s) for")
    assert "no collective state" not in verdict.summary  # the pending collective says why it waits
