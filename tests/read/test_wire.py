"""The node wire format: distinct stacks once, small rank records, full stacks only where asked."""

from __future__ import annotations

import json

import pytest

from trainwatch.probes.remote.wire import WIRE_VERSION, decode_line, encode_line, error_line
from trainwatch.probes.snapshot import (
    ExitInfo, Frame, HostInfo, Job, Rank, RankGpu, Snapshot, SnapshotError, ThreadStack, Verdict,
)

DEEP = tuple(Frame(f"layer{i}", "/w/.venv/lib/python3.11/site-packages/torch/nn/module.py", 100 + i) for i in range(60))
WAIT = (ThreadStack("MainThread", 7, (Frame("all_reduce", "/w/c10d.py", 9),) + DEEP, is_main=True),
        ThreadStack("pin_memory", 8, (Frame("wait", "/usr/lib/python3.11/threading.py", 320),)))
LATE = (ThreadStack("MainThread", 7, (Frame("compute_step", "/w/train.py", 37, native=False),), is_main=True),
        ThreadStack("pin_memory", 8, (Frame("wait", "/usr/lib/python3.11/threading.py", 320),)))


def node_snapshot() -> Snapshot:
    ranks = [Rank(rank=n, pid=100 + n, host="n1", local_rank=n, state="stuck", phase="collective", op="all_reduce",
                  where="c10d.py:9 all_reduce", stuck_for_s=12.5, cpu_pct=0.5, rss_bytes=1 << 30, threads=WAIT,
                  gpu=RankGpu(index=n, util_pct=0.0), step=1204, step_period_s=0.8) for n in range(7)]
    ranks.append(Rank(rank=7, pid=107, host="n1", local_rank=7, state="stuck", phase="compute",
                      where="train.py:37 compute_step", threads=LATE, step=1203, children=(300, 301)))
    ranks.append(Rank(rank=8, pid=None, host="n1", state="exited", exit=ExitInfo(signal="SIGKILL")))
    job = Job(launcher="torchrun", pid=99, host="n1", world_size=9, master_addr="a", master_port=1)
    return Snapshot(job=job, ranks=tuple(ranks), verdict=Verdict("straggler", (7,), "rank 7 ..."),
                    hosts=(HostInfo(name="n1", driver_version="550"),), warnings=("w",), notes=("n",),
                    taken_at=1000.0, window_s=2.0)


def test_round_trip_keeps_every_rank_record_and_shares_one_stack_per_distinct_stack():
    snap = node_snapshot()
    answer = decode_line(encode_line(snap, "n1", full_for=frozenset({3}), seq=5))
    got = answer.snapshot
    assert answer.node == "n1" and answer.seq == 5 and answer.error is None
    assert got.job == snap.job and got.hosts == snap.hosts and got.warnings == ("w",) and got.notes == ("n",)
    assert got.taken_at == 1000.0 and got.window_s == 2.0 and got.verdict.culprits == (7,)
    for mine, theirs in zip(snap.ranks, got.ranks, strict=True):
        assert (mine.rank, mine.pid, mine.state, mine.phase, mine.op, mine.where, mine.step, mine.gpu, mine.exit,
                mine.children, mine.host) == (theirs.rank, theirs.pid, theirs.state, theirs.phase, theirs.op,
                                              theirs.where, theirs.step, theirs.gpu, theirs.exit, theirs.children,
                                              theirs.host)
    # The node's culprit and the rank asked for come with every thread; the others with the main
    # thread of their group's stack, one object shared by the group.
    assert got.rank(7).threads == LATE and got.rank(3).threads == WAIT
    assert [(t.name, t.frames, t.is_main) for t in got.rank(0).threads] == [("MainThread", WAIT[0].frames, True)]
    assert got.rank(0).threads is got.rank(6).threads
    assert got.rank(8).threads == ()


def test_the_wire_is_a_fraction_of_the_public_snapshot_json():
    snap = node_snapshot()
    wire = encode_line(snap, "n1")
    data = json.loads(wire)
    assert len(data["stacks"]) == 2 and data["stacks"][0]["ranks"] == [0, 1, 2, 3, 4, 5, 6]
    assert len(wire) * 4 < len(snap.to_json(indent=None))


def test_error_lines_and_other_versions():
    answer = decode_line(error_line("n2", "no job with master a:1 on n2", 4, seq=3))
    assert (answer.node, answer.error, answer.code, answer.snapshot) == ("n2", "no job with master a:1 on n2", 4, None)
    newer = json.loads(encode_line(node_snapshot(), "n1"))
    newer["v"] = WIRE_VERSION + 1
    with pytest.raises(SnapshotError, match="install the same trainwatch on every node"):
        decode_line(json.dumps(newer))
    with pytest.raises(SnapshotError):
        decode_line(b"not json")
    damaged = json.loads(encode_line(node_snapshot(), "n1"))
    damaged["ranks"][0]["pid"] = "x"
    with pytest.raises(SnapshotError, match="damaged node answer"):
        decode_line(json.dumps(damaged))


def test_every_rank_field_survives_the_wire():
    """Every field of Rank, set to a value that is not its default, comes back equal: the wire's
    field list is Rank's own, so a new fact cannot be dropped on the way (the log's growth and the
    collective timeout once were, and the same node then merged to another verdict)."""
    import dataclasses

    from trainwatch.probes.snapshot import KernelState, LogActivity, PeerProcess

    full = Rank(rank=3, pid=103, host="n2", local_rank=1, state="stuck", phase="collective", op="all_reduce",
                where="c10d.py:9 all_reduce", user_frame="train.py:5 step", stuck_for_s=42.0,
                stuck_source="asleep in futex() for 42 s", cpu_pct=3.5,
                rss_bytes=1 << 30, threads=WAIT, gpu=RankGpu(index=1, util_pct=99.0), exit=ExitInfo(code=1, reason="x"),
                children=(301,), log_path="/job/log", detail="d", dataloader_worker="DataLoader worker PID 301 is in x",
                waits_for="its DataLoader worker PID 301, in x", step=7, step_period_s=0.5, step_held_s=9.1, native=True,
                log=LogActivity(age_s=30.0, every_s=1.0, longest_s=2.0, own=False, bar_s=0.5), longest_quiet_s=4.0,
                collective_timeout_s=600.0, kernel=KernelState(letter="S", wchan="do_wait", syscall="wait4",
                                                               target="child PID 9", target_kind="child",
                                                               peers=(PeerProcess(9, "git push", 3.0),),
                                                               peers_known=True),
                log_tail=("── error ──", "RuntimeError: x", "── last output ──", "step 7"), container_pid=7,
                scheduler="n2-pod is Pending: 0/8 nodes are available")
    defaults = Rank(rank=None)
    unset = [f.name for f in dataclasses.fields(Rank) if getattr(full, f.name) == getattr(defaults, f.name)]
    assert unset == [], f"set these in the test too: {unset}"
    snap = Snapshot(job=Job(launcher="torchrun", pid=1, host="n1"), ranks=(full,), verdict=Verdict("straggler", (3,)))
    got = decode_line(encode_line(snap, "n1")).snapshot.rank(3)
    assert got == full

    # Merging reads every rank back as evidence and judges it into a rank again (built without
    # __init__, for speed): the same records as __init__ builds, every field there.
    from trainwatch.probes.observed import ObservedRank, observed_rank

    evidence = observed_rank(full)
    by_init = ObservedRank(seen=full.state, **{f.name: getattr(full, f.name) for f in dataclasses.fields(ObservedRank)
                                               if f.name in {g.name for g in dataclasses.fields(Rank)}})
    assert evidence == by_init and hash(evidence) == hash(by_init)
    assert all(hasattr(evidence, f.name) for f in dataclasses.fields(ObservedRank))
    assert evidence.as_rank(full.state, full.stuck_for_s, full.stuck_source) == full
    assert dataclasses.replace(evidence, host="n3").host == "n3"


def test_log_tails_travel_for_the_culprits_and_the_ranks_asked_for_only():
    """A tail is up to 30 lines: every rank's on every poll would swamp a thousand nodes' wire."""
    tail = ("── last output ──", "step 7")
    ranks = tuple(Rank(rank=n, pid=100 + n, host="n2", log_path="/job/log", log_tail=tail) for n in range(3))
    snap = Snapshot(job=Job(launcher="torchrun", pid=1, host="n2"), ranks=ranks, verdict=Verdict("straggler", (2,)))
    got = decode_line(encode_line(snap, "n2", full_for=frozenset({0}))).snapshot
    assert [got.rank(n).log_tail for n in range(3)] == [tail, None, tail]


def test_no_line_is_a_whole_number_of_sruns_pieces():
    """A piece of exactly srun's size is joined with the next (srun cut it): a line that long is
    given one more byte, so it is never held back waiting for a piece that does not come."""
    from trainwatch.probes.remote.wire import SRUN_PIECE, whole

    assert whole("x" * SRUN_PIECE) == "x" * SRUN_PIECE + " " and whole("x" * 2 * SRUN_PIECE).endswith(" ")
    assert whole("x" * (SRUN_PIECE - 1)) == "x" * (SRUN_PIECE - 1)


def test_a_restarted_jobs_attempts_survive_the_wire():
    from dataclasses import replace

    from trainwatch.probes.snapshot import AttemptEnd, ExitInfo
    snap = node_snapshot()
    ends = (AttemptEnd(0, 7, ExitInfo(code=1, at=90.0, reason="ValueError", message="ValueError: x"), started_at=80.0),)
    snap = replace(snap, job=replace(snap.job, attempt=1, attempt_started_at=95.0, attempts=ends))
    got = decode_line(encode_line(snap, "n1", full_for=frozenset(), seq=1)).snapshot
    assert got.job == snap.job and got.job.attempts[0].exit.message == "ValueError: x"
