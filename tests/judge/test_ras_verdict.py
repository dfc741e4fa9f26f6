"""NCCL RAS as a collective source: progress across polls, culprits of a stalled communicator, wording."""

from pathlib import Path

import pytest

from trainwatch.probes.judge import ras as ras_judge
from trainwatch.probes.read.collectives import ras_report

FIXTURES = Path(__file__).parents[1] / "fixtures" / "ras"
LOCAL = [4101, 4102, 4103, 4104]  # this node's ranks 0-3 in every synthetic fixture (node 10.0.0.11)
NAMES = {"10.0.0.11": "node11"}  # for observe(); ObservedRas takes pairs


def two_polls(name: str, ext: str = "json", apart: float = 3.0):
    tracker = ras_judge.RasTracker()
    reports = [ras_report.parse((FIXTURES / f"synthetic-{name}-{take}.{ext}").read_text()) for take in "ab"]
    first = tracker.observe(reports[0], 1000.0, "localhost:28028", local_pids=LOCAL, names=NAMES)
    second = tracker.observe(reports[1], 1000.0 + apart, "localhost:28028", local_pids=LOCAL, names=NAMES)
    return first, second


@pytest.mark.parametrize("ext", ["json", "txt"])
def test_counts_that_advance_are_progress_not_a_hang(ext):
    """Take a has a collective in flight (rank 7 one behind): normal. Take b moved on."""
    first, second = two_polls("healthy", ext)
    # One reply: a collective in flight looks like a rank behind; said as such, the verdict uses it
    # only while every local rank waits (judge/verdict.py).
    assert first.first_reply and first.kind == "behind" and "one NCCL RAS reply" in first.finding
    assert second.kind is None and second.culprits == () and not second.first_reply
    assert second.advancing
    assert ras_judge.progress_pids(second, LOCAL) == set(LOCAL)
    assert ras_judge.progress_pids(first, LOCAL) == set()  # nothing to compare with yet


@pytest.mark.parametrize("ext", ["json", "txt"])
def test_a_rank_behind_and_not_moving_is_the_culprit_on_its_node(ext):
    first, second = two_polls("straggler", ext)
    assert first.first_reply and first.culprits == (6,)  # one poll: a collective in flight looks the same
    assert second.kind == "behind" and second.culprits == (6,) and not second.first_reply
    assert second.finding == ("rank 6 (10.0.0.12, pid 5203) is 1 collective behind in communicator 0 "
                              "(all 7 others launched AllReduce #1205)")
    assert second.still_s == 3.0 and not second.advancing
    assert ras_judge.progress_pids(second, LOCAL) == set()


@pytest.mark.parametrize("ext", ["json", "txt"])
def test_different_collectives_are_a_mismatch(ext):
    _, second = two_polls("mismatch", ext)
    assert second.kind == "mismatch" and second.culprits == (2,)
    assert second.finding == ("rank 2 (node11, pid 4103) launched AllGather #4 where the 7 others launched "
                              "AllReduce #1205 in communicator 0")


@pytest.mark.parametrize("ext", ["json", "txt"])
def test_unreachable_then_dead(ext):
    first, second = two_polls("dead", ext)
    assert first.kind is None  # unreachable once: a slow rank can miss one RAS timeout
    assert second.kind == "dead" and second.culprits == (5,)  # RAS's own verdict: at once
    assert "considered dead by NCCL RAS" in second.finding


def test_unreachable_rank_named_from_one_node():
    first, second = two_polls("unreachable", "txt")
    assert first.kind is None
    assert second.kind == "unreachable" and second.culprits == (7,)
    assert second.finding.startswith("rank 7 (10.0.0.12, pid 5204) is unreachable")


def test_old_text_format_names_the_straggler():
    report = ras_report.parse((FIXTURES / "synthetic-old-straggler.txt").read_text())
    tracker = ras_judge.RasTracker()
    tracker.observe(report, 1.0, "x")
    state = tracker.observe(report, 4.0, "x")
    assert state.kind == "behind" and state.culprits == (6,)
    assert "(all 7 others launched #1209)" in state.finding  # one count for every operation type


def test_global_ranks_come_from_the_biggest_communicator():
    """Node 2's own communicator numbers its ranks 0-3; they are global ranks 4-7."""
    _, second = two_polls("straggler")
    node2 = [r for r in second.ranks if r.comm == "0c11d2e3f4a5b607"]
    assert [(r.comm_rank, r.rank) for r in node2] == [(0, 4), (1, 5), (2, 6), (3, 7)]


def test_describe_lists_each_rank():
    _, second = two_polls("straggler")
    lines = ras_judge.describe(second)
    assert lines[0].startswith("NCCL RAS at localhost:28028 (json, NCCL 2.29.7): 2 communicators")
    assert any(line.startswith("communicator 0 rank 6 (10.0.0.12, pid 5203, GPU 2): ok;") and "AllReduce 1204" in line
               for line in lines), lines


def test_merged_view_names_nodes_and_checks_them_against_each_other():
    merge_ras = ras_judge.across_nodes
    from trainwatch.probes.snapshot import Rank

    _, node11 = two_polls("straggler")
    _, node12 = two_polls("straggler")
    ranks = [Rank(rank=n, pid=(4101 if n < 4 else 5201) + n % 4, host="node11" if n < 4 else "node12",
                  state="stuck", phase="gpu_wait") for n in range(8)]
    merged, notes = merge_ras([("node11", node11), ("node12", node12)], ranks)
    assert notes == []
    assert merged.finding.startswith("rank 6 (node12, pid 5203) is 1 collective behind")
    assert {r.host for r in merged.ranks} == {"node11", "node12"}

    _, dead = two_polls("dead")
    alive = [r if r.rank != 5 else Rank(rank=5, pid=5202, host="node12", state="running") for r in ranks]
    merged, notes = merge_ras([("node11", node11), ("node12", dead)], alive)
    assert merged.kind == "dead" and merged.culprits == (5,)
    assert "NCCL RAS views differ between nodes: node11 names rank 6; node12 names rank 5" in notes
    assert any("rank 5 is dead, but node node12 sees it running" in n for n in notes), notes


# -- the verdict -----------------------------------------------------------------------------------
from trainwatch.probes.judge.verdict import judge  # noqa: E402
from trainwatch.probes.snapshot import CollectiveState, Rank  # noqa: E402


def local_ranks(state="stuck", phase="gpu_wait", op="item()", where="train.py:88 main", odd=None):
    ranks = [Rank(rank=n, pid=4101 + n, host="node11", state=state, phase=phase, op=op, where=where,
                  stuck_for_s=9.0 if state == "stuck" else None) for n in range(4)]
    if odd is not None:
        ranks[odd[0]] = Rank(rank=odd[0], pid=4101 + odd[0], host="node11", state=state, phase="collective",
                             op=odd[1], where=odd[2], stuck_for_s=9.0)
    return ranks


def with_ras(name: str, ext: str = "json") -> CollectiveState:
    return CollectiveState(source="ras", ras=two_polls(name, ext)[1])


def test_verdict_names_the_remote_straggler_and_what_local_ranks_do():
    verdict = judge(local_ranks(), None, with_ras("straggler"))
    assert verdict.kind == "straggler" and verdict.culprits == (6,)
    assert verdict.summary == ("rank 6 (10.0.0.12, pid 5203) is 1 collective behind in communicator 0 "
                               "(all 7 others launched AllReduce #1205) (NCCL RAS); "
                               "local ranks 0-3 wait on their GPU (item()) at train.py:88 main")


def test_without_ras_the_same_ranks_name_no_culprit():
    """What trainwatch says without RAS: ranks blocked on their GPUs, no culprit (and, with no
    collective evidence, not yet a hang: a long GPU step looks the same)."""
    verdict = judge(local_ranks(), None, None)
    assert verdict.kind == "unknown" and verdict.culprits == ()
    assert "no collective state yet: not called a hang before 120 s" in verdict.summary


def test_a_running_job_is_not_judged_by_ras():
    """RAS counts launches: a healthy job is one collective apart all the time."""
    verdict = judge(local_ranks(state="running"), None, with_ras("straggler"))
    assert verdict.kind == "healthy"


def test_dead_remote_rank_is_the_culprit_the_others_wait_for():
    """A rank RAS declared dead holds the others up: a straggler verdict naming it (a hang names none)."""
    verdict = judge(local_ranks(), None, with_ras("dead", "txt"))
    assert verdict.kind == "straggler" and verdict.culprits == (5,)
    assert verdict.summary.startswith("rank 5 (10.0.0.12, pid 5202) is considered dead by NCCL RAS")


def test_local_mismatch_keeps_the_stacks_wording():
    ranks = local_ranks(phase="collective", op="all_reduce", where="train.py:60 step",
                        odd=(2, "all_gather", "train.py:70 gather"))
    stacks = judge(ranks, None, None)
    verdict = judge(ranks, None, with_ras("mismatch"))
    assert stacks.kind == verdict.kind == "mismatch" and verdict.culprits == (2,)
    assert verdict.summary == stacks.summary


def test_flight_recorder_divergence_wins_over_ras():
    state = CollectiveState(source="hook", divergence="rank 3 never reached all_reduce #9", culprits=(3,),
                            ras=two_polls("straggler")[1])
    verdict = judge(local_ranks(), None, state)
    assert verdict.kind == "mismatch" and verdict.culprits == (3,)
    assert "Flight Recorder" in verdict.summary


def test_snapshot_json_round_trip_and_older_producers():
    from trainwatch.probes.snapshot import Job, Snapshot

    snap = Snapshot(job=Job(launcher="torchrun", pid=1, host="node11"), collectives=with_ras("straggler"))
    again = Snapshot.from_json(snap.to_json())
    assert again == snap and again.collectives.ras.ranks[6].counts[-1].count == 1204
    older = snap.to_dict()
    del older["collectives"]["ras"]  # a producer from before RAS
    assert Snapshot.from_dict(older).collectives.ras is None


def test_through_the_one_judge_advancing_counts_keep_a_gpu_waiting_rank_running():
    """judge_job, as every view calls it: ranks whose stacks never change (blocked at .item() on
    their GPU) are running while RAS sees their counts advance, and stuck once they stop."""
    from trainwatch.probes.judge.judgement import JudgeMemory, JudgeOptions, judge_job
    from trainwatch.probes.observed import ObservedJob, ObservedRank, ObservedRas
    from trainwatch.probes.snapshot import Job

    def report(name, take):
        return ras_report.parse((FIXTURES / f"synthetic-{name}-{take}.json").read_text())

    memory = JudgeMemory()
    ranks = tuple(ObservedRank(rank=n, pid=4101 + n, host="node11", phase="gpu_wait", op="item()",
                               where="train.py:88 main") for n in range(4))
    for pid in (4101, 4102, 4103, 4104):
        memory.progress.watch(pid, 0.0)
    options = JudgeOptions(window=3.0)

    def poll(seen, now):
        return judge_job(ObservedJob(Job("torchrun", 1, "node11"), ranks, None, None, (seen,)), memory, now, options)

    poll(ObservedRas("localhost:28028", 100.0, report("healthy", "a"), tuple(NAMES.items())), 4.0)
    moving = poll(ObservedRas("localhost:28028", 105.0, report("healthy", "b"), tuple(NAMES.items())), 8.0)
    assert {r.state for r in moving.ranks} == {"running"} and moving.verdict.kind == "healthy"
    assert moving.collectives.ras.advancing
    again = poll(ObservedRas("localhost:28028", 105.0, report("healthy", "b"), tuple(NAMES.items())), 12.0)  # no new reply
    assert again.collectives.ras is moving.collectives.ras
    stalled = poll(ObservedRas("localhost:28028", 114.0, report("straggler", "a"), tuple(NAMES.items())), 30.0)
    stalled = poll(ObservedRas("localhost:28028", 117.0, report("straggler", "b"), tuple(NAMES.items())), 40.0)  # past twice its 8 s rhythm
    assert stalled.verdict.kind == "straggler" and stalled.verdict.culprits == (6,), stalled.verdict
    assert stalled.verdict.summary.endswith("(NCCL RAS); local ranks 0-3 wait on their GPU (item()) at train.py:88 main")


def test_a_merged_view_words_ras_finding_in_the_nodes_names_through_the_judge():
    """Two nodes' snapshots, each with the RAS state its own judge made (addresses only): merging is
    putting them together and judging; the finding names the nodes, with no address left in it."""
    from trainwatch.probes.remote.merge import NodeView, merge_nodes
    from trainwatch.probes.snapshot import Job, Snapshot

    _, seen = two_polls("straggler")
    assert "10.0.0.12" in seen.finding and ras_judge.HOST not in seen.finding
    views = []
    for node, first in (("node11", 0), ("node12", 4)):
        ranks = tuple(Rank(rank=n, pid=(4101 if n < 4 else 5201) + n % 4, host=node, state="stuck", phase="gpu_wait")
                      for n in range(first, first + 4))
        job = Job("torchrun", 1, node, world_size=8, local_world_size=4, nnodes=2, master_addr="10.0.0.11",
                  master_port=29500)
        views.append(NodeView(node, Snapshot(job=job, ranks=ranks, collectives=CollectiveState("ras", ras=seen),
                                             taken_at=seen.taken_at, window_s=1.0), local=node == "node11"))
    merged = merge_nodes(views)
    assert merged.collectives.ras.finding.startswith("rank 6 (node12, pid 5203) is 1 collective behind")
    assert "10.0.0.12" not in merged.collectives.ras.finding
    assert merged.verdict.culprits == (6,)
