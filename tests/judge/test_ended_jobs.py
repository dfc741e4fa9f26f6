"""A job that is over: judged where its ranks were when they ended, not by who died first."""

from __future__ import annotations

from trainwatch.probes.judge.judgement import JudgeMemory, judge_job
from trainwatch.probes.observed import UNTOLD, ObservedJob, ObservedRank
from trainwatch.probes.snapshot import CollectiveState, ExitInfo, Job, RankCollective, Verdict

JOB = Job("torchrun", 1, "h", world_size=3)
TERM = ExitInfo(signal="SIGTERM", at=100.0, source="launcher log")


def dead(rank: int, phase: str = "unknown", op: str | None = None, where: str | None = None,
         exit: ExitInfo = TERM) -> ObservedRank:
    return ObservedRank(rank=rank, pid=10 + rank, host="h", seen="exited", phase=phase, op=op, where=where, exit=exit)


def verdict(*ranks: ObservedRank, collectives: CollectiveState | None = None):
    return judge_job(ObservedJob(JOB, ranks, collectives=collectives), JudgeMemory(), now=100.0).verdict


def test_killed_while_two_ranks_waited_and_one_slept_is_a_straggler():
    found = verdict(dead(0, "collective", "all_reduce", "train.py:76 sync"), dead(1, "collective", "all_reduce",
                    "train.py:76 sync"), dead(2, "sleep", "sleep", "train.py:240 train"))
    assert (found.kind, found.culprits) == ("straggler", (2,))
    assert found.summary.endswith("then the job ended (killed by SIGTERM)")


def test_collective_timeouts_are_not_a_cause_the_odd_collective_is():
    timeout = ExitInfo(code=1, reason="collective timeout", at=100.0)
    found = verdict(dead(0, "collective", "all_reduce", "a", timeout), dead(1, "collective", "all_reduce", "a", timeout),
                    dead(2, "collective", "all_gather", "b", timeout))
    assert (found.kind, found.culprits) == ("mismatch", (2,))


def test_an_error_of_its_own_is_still_the_crash():
    found = verdict(dead(0, "collective", "all_reduce", "a"), dead(1, "collective", "all_reduce", "a"),
                    dead(2, "compute", None, "b", ExitInfo(code=1, reason="RuntimeError", message="RuntimeError: x",
                                                           at=99.0)))
    assert (found.kind, found.culprits) == ("crashed", (2,))


def test_a_rank_that_left_nothing_is_the_one_waited_for():
    rows = tuple(RankCollective(rank=n, last_enqueued=5, last_completed=4, op="all_reduce", pending_seq=5,
                                pending_op="all_reduce") for n in (0, 1))
    untold = ExitInfo(reason=UNTOLD)
    found = verdict(dead(0, exit=untold), dead(1, exit=untold), ObservedRank(rank=2, host="h", seen="missing"),
                    collectives=CollectiveState(source="flight-recorder-file", ranks=rows))
    assert (found.kind, found.culprits) == ("straggler", (2,))
    assert "rank 2 is missing while ranks 0-1 wait in all_reduce" in found.summary


def test_stopped_with_no_stacks_blames_nobody():
    found = verdict(dead(0), dead(1), dead(2))
    assert (found.kind, found.culprits) == ("unknown", ())
    assert "none left its stacks" in found.summary and "trainwatch run" in found.summary


def test_a_job_stopped_while_computing_is_stopped_not_crashed():
    """Every rank ended by SIGTERM, none of a cause of its own, none waiting: someone stopped a job
    that was working (issue 40); neither a hang nor a crash of the first rank the signal reached."""
    found = verdict(dead(0, "compute", None, "a"), dead(1, "compute", None, "a"), dead(2, "compute", None, "a"))
    assert (found.kind, found.culprits) == ("healthy", ())
    assert found.summary == "the job ended (killed by SIGTERM) while its ranks made progress: no rank failed"


def test_every_rank_killed_at_one_moment_is_a_stop_said_with_who_stopped_it():
    kill = ExitInfo(signal="SIGKILL", at=100.0)
    ranks = (dead(0, "collective", "all_reduce", "train.py:76 sync", kill),
             dead(1, "collective", "all_reduce", "train.py:76 sync", kill), dead(2, "sleep", "sleep", "t.py:9", kill))
    stopped = judge_job(ObservedJob(Job("torchrun", 1, "h", world_size=3, stopped_by="SIGKILL to the launcher"),
                                    ranks), JudgeMemory(), now=100.0).verdict
    assert (stopped.kind, stopped.culprits) == ("straggler", (2,))
    assert stopped.summary.endswith("then the job was stopped by SIGKILL to the launcher")
    # one rank killed alone is that rank's crash, whatever the others then did
    alone = verdict(dead(0, "collective", "all_reduce", "a"), dead(1, "collective", "all_reduce", "a"),
                    dead(2, "compute", None, "b", ExitInfo(signal="SIGKILL", at=99.0)))
    assert (alone.kind, alone.culprits) == ("crashed", (2,))


def test_a_healthy_lockstep_job_stopped_after_a_healthy_look_is_a_stop_not_a_hang():
    """A 2-rank job in lockstep (one rank in its step's sleep, the other waiting for it in
    all_reduce: any moment of a healthy step) stopped by SIGTERM to torchrun right after a look
    that found both making progress. Where each last was is no hang no look saw (seen under load:
    "stopped … while the job was stuck: straggler" for a healthy job, 5 of 7 runs)."""
    last = (dead(0, "sleep", "sleep", "train.py:316 train"), dead(1, "collective", "all_reduce", "train.py:78 sync"))
    job = Job("torchrun", 1, "h", world_size=2, stopped_by="SIGTERM to the launcher")
    healthy = Verdict("healthy", (), "2 ranks making progress", since=90.0)
    looked = JudgeMemory(verdict=healthy, alive=healthy)
    stopped = judge_job(ObservedJob(job, last), looked, now=100.0).verdict
    assert (stopped.kind, stopped.culprits) == ("healthy", ()), stopped
    assert stopped.summary == "the job was stopped by SIGTERM to the launcher while its ranks made progress: no rank failed"
    # No look before (files left behind), or a look that saw the hang: the last places are all there is.
    # A look just after the deaths, their ends not yet read ("job finished"), is no look at the job.
    stuck = Verdict("straggler", (0,), "rank 0 …", since=90.0)
    finished = Verdict("healthy", (), "job finished: all 2 ranks exited normally", since=99.0)
    for memory in (JudgeMemory(), JudgeMemory(verdict=stuck, alive=stuck), JudgeMemory(verdict=finished, alive=stuck)):
        hung = judge_job(ObservedJob(job, last), memory, now=100.0).verdict
        assert (hung.kind, hung.culprits) == ("straggler", (0,)), hung
    # Their own end says they waited (a collective timeout): a hang began after the look.
    timeout = ExitInfo(code=1, reason="collective timeout", at=100.0)
    waited = (dead(0, "sleep", "sleep", "train.py:316 train", timeout),
              dead(1, "collective", "all_reduce", "train.py:78 sync", timeout))
    assert judge_job(ObservedJob(JOB, waited), looked, now=100.0).verdict.kind == "straggler"


def test_ranks_timing_out_together_have_no_first_death():
    timeout = ExitInfo(code=1, reason="collective timeout", at=100.0)
    judged = judge_job(ObservedJob(JOB, (dead(0, exit=timeout), dead(1, exit=timeout))), JudgeMemory(), now=100.0)
    assert not any(r.exit.first for r in judged.ranks)


def test_a_rank_that_timed_out_waited_in_its_last_collective_though_gloo_retired_it():
    """gloo retires a collective that timed out as if it had completed: rank 0's record shows #5
    done, yet its own end (a collective timeout) says it waited there; rank 3 left nothing."""
    timeout = ExitInfo(code=1, reason="collective timeout", at=100.0)
    rows = (RankCollective(rank=0, last_enqueued=5, last_completed=5, op="all_reduce"),
            RankCollective(rank=1, last_enqueued=5, last_completed=4, op="all_reduce", pending_seq=5,
                           pending_op="all_reduce"))
    found = verdict(dead(0, exit=timeout), dead(1, exit=timeout), dead(3),
                    collectives=CollectiveState(source="flight-recorder-file", ranks=rows))
    assert (found.kind, found.culprits) == ("straggler", (3,)), found
    assert found.summary.startswith("rank 3 left no record of where it was (killed by SIGTERM) while ranks 0-1 wait "
                                    "in all_reduce")


def test_open_on_dumps_beside_a_log_dir_names_the_rank_that_left_nothing():
    from pathlib import Path

    from trainwatch.probes.evidence.postmortem import PostMortemSource
    folder = Path(__file__).parents[1] / "fixtures" / "dead" / "gloo-2.13-log-dir-straggler"
    found = PostMortemSource([folder]).snapshot.verdict
    assert (found.kind, found.culprits) == ("straggler", (3,)), found
