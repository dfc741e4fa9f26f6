"""Merging node snapshots into one view of the job."""

from __future__ import annotations

import pytest

from trainwatch.probes.remote.merge import NodeView, merge_nodes
from trainwatch.probes.snapshot import (
    CollectiveState, Frame, HostInfo, Job, Rank, RankCollective, Snapshot, ThreadStack,
)


def rank(n: int, host: str, pid: int, phase: str = "collective", **kw) -> Rank:
    where = "train.py:40 sync_gradients" if phase == "collective" else "train.py:99 compute_step"
    frames = (Frame("sync_gradients" if phase == "collective" else "compute_step", "/w/train.py", 40),)
    return Rank(rank=n, pid=pid, host=host, state="stuck", phase=phase,
                op="allreduce" if phase == "collective" else None, where=where,
                threads=(ThreadStack("MainThread", 1, frames, is_main=True),), **kw)


def node(host: str, ranks: list[Rank], world: int = 4, **kw) -> Snapshot:
    job = Job(launcher="torchrun", pid=ranks[0].pid - 1 if ranks else 1, host=host, world_size=world,
              local_world_size=len(ranks), nnodes=2, master_addr="10.0.0.1", master_port=29500)
    return Snapshot(job=job, ranks=tuple(ranks), hosts=(HostInfo(name=host),), taken_at=100.0,
                    window_s=1.0, **kw)


def merge(views, **kw):
    return merge_nodes(views, **kw)


def test_two_nodes_one_job():
    a = node("n1", [rank(0, "n1", 100), rank(1, "n1", 101)])
    b = node("n2", [rank(2, "n2", 200), rank(3, "n2", 201, phase="compute")], warnings=("py-spy slow",))
    merged = merge([NodeView("n1", a, local=True), NodeView("n2", b)])
    assert merged.source == "remote"
    assert [(r.rank, r.host) for r in merged.ranks] == [(0, "n1"), (1, "n1"), (2, "n2"), (3, "n2")]
    assert merged.verdict.culprits == (3,)
    assert [g.label for g in merged.groups] == ["0-2", "3"]
    assert merged.groups[1].culprit
    assert [h.name for h in merged.hosts] == ["n1", "n2"]
    assert "n2: py-spy slow" in merged.warnings
    assert merged.job.world_size == 4 and merged.job.host == "n1"


def test_ranks_of_an_unread_node_are_unknown_not_missing():
    a = node("n1", [rank(0, "n1", 100), rank(1, "n1", 101)])
    merged = merge([NodeView("n1", a, local=True), NodeView("n2", error="unreachable (Connection refused)")])
    unread = [r for r in merged.ranks if r.rank in (2, 3)]
    assert [(r.rank, r.host, r.pid, r.state) for r in unread] == [(2, "n2", None, "unknown"), (3, "n2", None, "unknown")]
    assert "n2: unreachable (Connection refused)" in unread[0].detail
    assert not any(r.state == "missing" for r in merged.ranks)
    # ranks 0-1 wait in their collective: ranks 2-3, unread, may be what they wait for (never "no local culprit")
    assert merged.verdict.kind == "straggler" and merged.verdict.culprits == (2, 3), merged.verdict
    assert "ranks 2-3 could not be read, so they may be what they wait for" in merged.verdict.summary
    assert merged.verdict.summary.endswith("; node not read: n2")
    assert HostInfo(name="n2", error="unreachable (Connection refused)") in merged.hosts
    assert any("node n2: unreachable" in n for n in merged.notes)


def test_nodes_reporting_one_hostname_are_told_apart():
    """Containers (and loopback tests) often share a hostname: the node's address labels them."""
    a = node("box", [rank(0, "box", 100)], world=2)
    b = node("box", [rank(1, "box", 200)], world=2)
    merged = merge([NodeView("box", a, local=True), NodeView("127.0.0.1", b)])
    assert [(r.rank, r.host) for r in merged.ranks] == [(0, "box"), (1, "127.0.0.1")]
    assert [h.name for h in merged.hosts] == ["box", "127.0.0.1"]
    assert len({r.key for r in merged.ranks}) == 2


def test_this_node_listed_again_is_not_counted_twice():
    a = node("n1", [rank(0, "n1", 100), rank(1, "n1", 101)], world=2)
    merged = merge([NodeView("n1", a, local=True), NodeView("n1.cluster", a)])
    assert [r.rank for r in merged.ranks] == [0, 1]
    assert any("already seen" in n for n in merged.notes)


def test_unread_ranks_are_never_culprits_but_a_straggler_elsewhere_is():
    a = node("n1", [rank(0, "n1", 100), rank(1, "n1", 101, phase="compute")], world=6)
    b = node("n2", [rank(2, "n2", 200), rank(3, "n2", 201)], world=6)
    merged = merge([NodeView("n1", a, local=True), NodeView("n2", b), NodeView("n3", error="timeout")])
    assert merged.verdict.kind == "straggler" and merged.verdict.culprits == (1,), merged.verdict
    assert "missing" not in merged.verdict.summary and "ranks 4-5" not in merged.verdict.summary
    assert merged.verdict.summary.endswith("node not read: n3")


def test_when_every_node_answered_absent_ranks_are_missing():
    a = node("n1", [rank(0, "n1", 100), rank(1, "n1", 101)], world=3)
    merged = merge([NodeView("n1", a, local=True)])
    assert [(r.rank, r.state) for r in merged.ranks] == [(0, "stuck"), (1, "stuck"), (2, "missing")]
    assert merged.verdict.culprits == (2,)


def test_placeholder_missing_ranks_of_a_node_are_replaced():
    a = node("n1", [rank(0, "n1", 100), Rank(rank=1, state="missing", host="?")], world=2)
    b = node("n2", [rank(1, "n2", 200)], world=2)
    merged = merge([NodeView("n1", a, local=True), NodeView("n2", b)])
    assert [(r.rank, r.state) for r in merged.ranks] == [(0, "stuck"), (1, "stuck")]


def test_two_processes_claiming_one_rank_are_warned_about():
    a = node("n1", [rank(0, "n1", 100)], world=2)
    b = node("n2", [rank(0, "n2", 200)], world=2)
    merged = merge([NodeView("n1", a, local=True), NodeView("n2", b)])
    assert any("rank 0 is reported by more than one process" in w for w in merged.warnings)


def test_stale_node_is_noted():
    a = node("n1", [rank(0, "n1", 100)], world=2)
    b = node("n2", [rank(1, "n2", 200)], world=2)
    merged = merge([NodeView("n1", a, local=True), NodeView("n2", b, stale_s=12.3)])
    assert "node n2: slow to answer; showing its snapshot from 12s ago" in merged.notes


def test_collectives_are_combined():
    # Node n2 judged alone found nothing wrong (and claims a culprit it cannot show): the merged
    # judge finds, across nodes, that rank 1 never reached rank 0's all_reduce #5.
    ca = CollectiveState("flight-recorder-file", ranks=(RankCollective(0, last_enqueued=5, op="all_reduce"),))
    cb = CollectiveState("flight-recorder-file", ranks=(RankCollective(1, last_enqueued=4, op="all_reduce"),),
                         culprits=(0,))
    a = node("n1", [rank(0, "n1", 100)], world=2, collectives=ca)
    b = node("n2", [rank(1, "n2", 200)], world=2, collectives=cb)
    merged = merge([NodeView("n1", a, local=True), NodeView("n2", b)])
    assert [e.rank for e in merged.collectives.ranks] == [0, 1]
    assert merged.collectives.culprits == (1,)
    assert merged.collectives.divergence == "rank 0 enqueued all_reduce #5; rank 1 never reached it (rank 1 at #4)"


def test_merged_snapshot_round_trips_as_json():
    a = node("n1", [rank(0, "n1", 100)], world=3)
    merged = merge([NodeView("n1", a, local=True), NodeView("n2", error="timeout")])
    assert Snapshot.from_json(merged.to_json()) == merged


def test_no_answer_at_all_is_an_error():
    with pytest.raises(ValueError):
        merge([NodeView("n1", error="x")])


def test_a_disagreement_between_nodes_is_found_after_the_merge():
    # Each node sees its own ranks agree; across nodes, ranks 2-3 enqueued all_gather #7 where 0-1 did all_reduce.
    def rows(ranks, op):
        return tuple(RankCollective(r, last_enqueued=7, last_completed=6, op=op, pending_seq=7, pending_op=op)
                     for r in ranks)
    a = node("n1", [rank(0, "n1", 100), rank(1, "n1", 101)], collectives=CollectiveState("hook", rows((0, 1), "all_reduce")))
    b = node("n2", [rank(2, "n2", 200), rank(3, "n2", 201)], collectives=CollectiveState("hook", rows((2, 3), "all_gather")))
    b2 = node("n2", [rank(2, "n2", 200), rank(3, "n2", 201)], collectives=CollectiveState("hook", rows((2, 3), "all_reduce")))
    merged = merge([NodeView("n1", a, local=True), NodeView("n2", b)])
    assert merged.collectives.divergence == ("ranks disagree at #7: ranks 0-1 enqueued all_reduce; "
                                             "ranks 2-3 enqueued all_gather")
    assert merged.verdict.kind == "mismatch" and merged.verdict.culprits == ()  # two against two: no culprit
    agreeing = merge([NodeView("n1", a, local=True), NodeView("n2", b2)])
    assert agreeing.collectives.divergence is None and [r.rank for r in agreeing.collectives.ranks] == [0, 1, 2, 3]


def test_the_judges_warnings_are_made_once_over_the_whole_job():
    """Each node's judge warned about its own ranks ("only this node's ranks", its GPUs); the merged
    view says what the whole job shows, and keeps what each node's readers said."""
    from dataclasses import replace

    from trainwatch.probes.judge.warnings import job_warnings
    from trainwatch.probes.snapshot import RankGpu

    spin = RankGpu(index=0, util_pct=100.0)
    ranks_a = [replace(rank(0, "n1", 100), gpu=spin), replace(rank(1, "n1", 101), gpu=spin)]
    ranks_b = [replace(rank(2, "n2", 200), gpu=spin),
               replace(rank(3, "n2", 201, phase="compute"), gpu=RankGpu(index=1, util_pct=0.0))]
    a, b = node("n1", ranks_a), node("n2", ranks_b)
    a = replace(a, warnings=(*job_warnings(a.job, a.ranks, a.window_s), "NVML slow on n1"))
    b = replace(b, warnings=job_warnings(b.job, b.ranks, b.window_s))
    assert any(w.startswith("job spans 2 nodes") for w in a.warnings + b.warnings)
    merged = merge([NodeView("n1", a, local=True), NodeView("n2", b)])
    assert not any("job spans" in w for w in merged.warnings), merged.warnings
    assert "GPUs of ranks 0-2 spin at 100% in the collective; rank 3's GPU is idle" in merged.warnings
    assert "NVML slow on n1" in merged.warnings
    assert not any(w.startswith("n2: GPU") for w in merged.warnings), merged.warnings


def test_a_size_disagreement_between_nodes_travels_in_each_ranks_calls_over_the_wire():
    """Ranks 0-2 (n1) enqueued all_reduce of [4] as #3, rank 3 (n2) all_reduce of [8]: the same op, so only
    each rank's record of its calls (sent by its node, through the agents' wire) shows who is odd."""
    from trainwatch.probes.read.collectives.flightrec import read_rows
    from trainwatch.probes.remote.wire import decode_line, encode_line

    def trace(size: int) -> dict:
        entries = [{"collective_seq_id": s, "profiling_name": "gloo:all_reduce", "process_group": ["0", ""],
                    "input_sizes": [[size if s == 3 else 4]], "input_dtypes": ["Float"],
                    "state": "completed" if s < 3 else "scheduled"} for s in (1, 2, 3)]
        return {"entries": entries, "pg_status": {"0": {"last_enqueued_collective": 3, "last_completed_collective": 2}}}

    a = node("n1", [rank(n, "n1", 100 + n) for n in range(3)],
             collectives=read_rows({n: trace(4) for n in range(3)}, "hook"))
    b = node("n2", [rank(3, "n2", 200)], collectives=read_rows({3: trace(8)}, "hook"))
    assert a.collectives.divergence is None and b.collectives.divergence is None  # the readers judge nothing
    over_wire = decode_line(encode_line(b, "n2")).snapshot
    assert over_wire.collectives == b.collectives  # every call of every row survives the wire
    for view in (NodeView("n2", b), NodeView("n2", over_wire)):
        merged = merge([NodeView("n1", a, local=True), view])
        assert merged.collectives.divergence == ("rank 3 enqueued all_reduce of [8] #3 while ranks 0-2 enqueued "
                                                 "all_reduce of [4] #3")
        assert merged.collectives.culprits == (3,) and merged.verdict.culprits == (3,)
