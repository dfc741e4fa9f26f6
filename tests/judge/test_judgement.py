"""The judge's memory across polls: `since`, tie-breaks and the first death, for every caller."""

from __future__ import annotations

from trainwatch.probes.judge.judgement import JudgeMemory, JudgeOptions, judge_job
from trainwatch.probes.observed import ObservedJob, ObservedRank, observed_rank
from trainwatch.probes.remote.merge import NodeView, merge_nodes
from trainwatch.probes.snapshot import ExitInfo, Job, Rank, Snapshot

JOB = Job("torchrun", 1, "h", world_size=2)


def ranks(state: str, places: tuple[str, str]) -> tuple[Rank, ...]:
    return tuple(Rank(rank=n, pid=100 + n, host="h", state=state, phase="collective", op="all_reduce", where=place)
                 for n, place in enumerate(places))


def test_since_holds_while_the_verdict_kind_holds():
    memory = JudgeMemory()
    stuck = ObservedJob(JOB, tuple(map(observed_rank, ranks("stuck", ("a", "a")))))
    first = judge_job(stuck, memory, now=10.0).verdict
    again = judge_job(stuck, memory, now=20.0).verdict
    assert (first.kind, first.since, again.since) == ("hang", 10.0, 10.0)
    healthy = judge_job(ObservedJob(JOB, tuple(map(observed_rank, ranks("running", ("a", "a"))))), memory, 30.0)
    assert (healthy.verdict.kind, healthy.verdict.since) == ("healthy", 30.0)


def test_a_merged_view_remembers_where_ranks_went_and_breaks_the_tie():
    """Both ranks ran through place `a`; then rank 0 waits at `a`, rank 1 at `b`: rank 1 is odd.
    Without the memory of the earlier polls the tie has no culprit."""
    def node(state: str, places: tuple[str, str], at: float) -> list[NodeView]:
        return [NodeView("h", Snapshot(job=JOB, ranks=ranks(state, places), taken_at=at), local=True)]

    memory = JudgeMemory()
    merge_nodes(node("running", ("a", "a"), 1.0), memory=memory)
    remembered = merge_nodes(node("stuck", ("a", "b"), 2.0), memory=memory).verdict
    forgetful = merge_nodes(node("stuck", ("a", "b"), 2.0)).verdict
    assert (remembered.kind, remembered.culprits) == ("mismatch", (1,))
    assert (forgetful.kind, forgetful.culprits) == ("mismatch", ())


def test_the_judge_marks_one_first_death_over_all_ranks_it_is_given():
    """Two nodes each marked their own first death; merged, the earlier one is the first."""
    dead = [ObservedRank(rank=n, pid=100 + n, host=h, seen="exited", exit=ExitInfo(code=1, at=at, first=True))
            for n, h, at in ((0, "a", 5.0), (1, "b", 9.0))]
    judged = judge_job(ObservedJob(JOB, tuple(dead)), JudgeMemory(), now=10.0, options=JudgeOptions())
    assert [r.exit.first for r in judged.ranks] == [True, False]
    assert (judged.verdict.kind, judged.verdict.culprits) == ("crashed", (0,))


def test_a_bundle_rejudged_with_its_sources_memory_keeps_the_tie_break():
    """The live view saw both ranks run through `a`; its dump finds a Flight Recorder state that
    names no culprit: judged again with the live view's memory, rank 1 (at `b`) is still odd."""
    from trainwatch.probes.evidence.bundle import rejudged
    from trainwatch.probes.live import LocalSource
    from trainwatch.probes.snapshot import CollectiveState, RankCollective

    class Live(LocalSource):
        def __init__(self) -> None:  # the live source's memory, without a job to sample
            self.memory = JudgeMemory(familiar={0: frozenset({"a"}), 1: frozenset({"a"})})

    snapshot = Snapshot(job=JOB, ranks=ranks("stuck", ("a", "b")), taken_at=5.0)
    state = CollectiveState("hook", ranks=(RankCollective(rank=0), RankCollective(rank=1)))
    assert Live().remembered_places() == {0: frozenset({"a"}), 1: frozenset({"a"})}
    kept = rejudged(snapshot, {"collectives": state}, Live().remembered_places()).verdict
    alone = rejudged(snapshot, {"collectives": state}).verdict
    assert (kept.kind, kept.culprits, alone.culprits) == ("mismatch", (1,), ())


def test_the_judge_asks_who_holds_a_rank_stuck_on_its_dataloader_and_then_names_it():
    """The judge does no I/O: it asks for the workers of a rank it judged stuck waiting for its
    DataLoader; the caller reads them and asks again, and the answer explains the rank."""
    from dataclasses import replace

    waiting = ObservedRank(rank=1, pid=101, seen="stuck", stuck_for_s=30.0, phase="dataloader",
                           where="train.py:40 main", children=(301, 302))
    working = ObservedRank(rank=0, pid=100, seen="stuck", stuck_for_s=30.0, phase="collective", op="all_reduce")
    first = judge_job(ObservedJob(JOB, (working, waiting)), JudgeMemory(), 10.0, JudgeOptions(window=3.0))
    assert first.read_workers == (101,) and first.ranks[1].detail is None
    told = "DataLoader worker PID 302 is in dataset.py:12 __getitem__"
    again = judge_job(ObservedJob(JOB, (working, replace(waiting, dataloader_worker=told))), JudgeMemory(), 10.0,
                      JudgeOptions(window=3.0))
    assert again.read_workers == () and again.ranks[1].detail == told
    running = replace(waiting, seen="running", stuck_for_s=None)
    assert judge_job(ObservedJob(JOB, (working, running)), JudgeMemory(), 10.0).read_workers == ()
