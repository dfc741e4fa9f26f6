"""Real NCCL jobs whose ranks took different code paths, recorded on one H200 (4 NCCL ranks on the
GPU, each its own NCCL_HOSTID; ``tests/gpu/record_paths.py``, README in tests/fixtures/h200): the
last rank gathered its loss alone (``mismatch``) or ran out of data into the final barrier
(``uneven``) at step 40; the others went on to the next step's gradient all_reduce. The hosts of
the ranks that never synchronise ran 100+ collectives ahead before they blocked, the watchdogs
timed out 30 s later and aborted every rank. Truth for both: rank 3's code path, a mismatch at #83."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainwatch.probes.evidence.bundle import rejudged
from trainwatch.probes.evidence.postmortem import PostMortemSource
from trainwatch.probes.read.logs.leftovers import read_leftovers
from trainwatch.probes.snapshot import Snapshot

PATHS = Path(__file__).parents[1] / "fixtures" / "h200" / "nccl-paths"
ODD_OP = {"mismatch": "_all_gather_base", "uneven": "barrier"}


@pytest.mark.parametrize("scenario", sorted(ODD_OP))
def test_the_run_directory_is_one_run_and_names_the_rank_on_another_path(scenario):
    """`trainwatch open` of what `trainwatch run` left: one run (the ranks' hosts far apart in their
    numbering is NCCL running ahead, not two runs), the mismatch at #83 and rank 3, and the deaths
    as the watchdog's (SIGABRT through std::terminate: the log says why, not the signal)."""
    snapshot = PostMortemSource([PATHS / scenario / "run"]).snapshot
    verdict = snapshot.verdict
    assert (verdict.kind, verdict.culprits) == ("mismatch", (3,)), verdict
    assert f"rank 3 enqueued {ODD_OP[scenario]} #83 while ranks 0-2 enqueued all_reduce #83" in verdict.summary
    assert "NCCL watchdog timeout" in verdict.summary, verdict
    assert {r.exit.reason for r in snapshot.ranks} == {"NCCL watchdog timeout"}, [r.exit for r in snapshot.ranks]


def test_two_runs_are_still_told_apart_by_when_they_began(tmp_path):
    """The looser bound for NCCL does not merge two runs: rank 0's dump of one run beside ranks 1-3
    of a run begun a minute later is refused as two runs."""
    import pickle
    flight = tmp_path / "flight"
    flight.mkdir()
    for rank in range(4):
        trace = pickle.loads((PATHS / "mismatch" / "run" / "flight" / f"fr_trace_rank_{rank}").read_bytes())
        if rank == 0:
            for entry in trace["entries"]:
                entry["time_created_ns"] += 60 * 10**9
        (flight / f"fr_trace_rank_{rank}").write_bytes(pickle.dumps(trace))
    from trainwatch.probes.read.logs.leftovers import BadLeftovers
    with pytest.raises(BadLeftovers, match="2 different runs"):
        read_leftovers([flight])


@pytest.mark.parametrize("scenario", sorted(ODD_OP))
def test_the_live_snapshot_of_the_hang_says_mismatch(scenario):
    """The snapshot taken 8 s into the hang, judged again with its own Flight Recorder reading:
    rank 3 enqueued another collective at #83 though it trails the others' numbering (their hosts
    ran ahead) — a mismatch, not a straggler."""
    recorded = Snapshot.from_json((PATHS / scenario / "snapshot-during.json").read_text())
    judged = rejudged(recorded, {"collectives": recorded.collectives})
    assert (judged.verdict.kind, judged.verdict.culprits) == ("mismatch", (3,)), judged.verdict


def test_a_kernel_launch_held_by_a_full_queue_is_a_wait_on_the_gpu():
    """Rank 3 of the mismatch, its host past the odd gather: its main thread spins in
    ``sched_yield`` under ``cuLaunchKernel`` (``p.grad /= world``) while the GPU's queue is full
    behind the hung collective. It read "running compute"; it waits on its GPU."""
    from trainwatch.probes.judge.phases import classify

    recorded = Snapshot.from_json((PATHS / "mismatch" / "snapshot-during.json").read_text())
    found = classify(recorded.rank(3).threads)
    assert (found.phase, found.op) == ("gpu_wait", "kernel launch"), found
