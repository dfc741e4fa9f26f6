"""A restarted job's attempts as history (no jobs): read from a real torchrun log, then judged."""

from __future__ import annotations

from pathlib import Path

from trainwatch.probes.judge.restarts import with_restarts
from trainwatch.probes.judge.verdict import judge
from trainwatch.probes.read.logs.attempts import attempt_ends
from trainwatch.probes.snapshot import AttemptEnd, ExitInfo, Job, Rank, Verdict

LOG = Path(__file__).parents[1] / "fixtures" / "logs" / "torchrun-2.13-max-restarts-rank2-raises.log"


def raised(attempt: int, at: float, rank: int = 2) -> AttemptEnd:
    return AttemptEnd(attempt, rank, ExitInfo(code=1, at=at, reason="ValueError", message="ValueError: bad batch",
                                              frame="job/train.py:40 train"), started_at=at - 10.0)


def killed(attempt: int, at: float, rank: int) -> AttemptEnd:
    return AttemptEnd(attempt, rank, ExitInfo(signal="SIGKILL", at=at), started_at=at - 10.0)


def running(n: int = 3) -> list[Rank]:
    return [Rank(rank=r, pid=100 + r, state="running", phase="compute", where="train.py:9 step") for r in range(n)]


def test_each_attempts_end_is_read_from_torchruns_log():
    """torch 2.13, `--max-restarts 2`: rank 2 raised at step 5 in each of 3 attempts."""
    ends = attempt_ends(LOG.read_text().splitlines())
    assert [(e.attempt, e.rank, e.exit.code, e.exit.reason) for e in ends] == [
        (0, 2, 1, "ValueError"), (1, 2, 1, "ValueError"), (2, 2, 1, "ValueError")]
    assert all(e.exit.message == "ValueError: bad batch at step 5" and e.exit.frame.endswith(":308 train")
               for e in ends)
    assert ends[1].started_at == ends[0].exit.at and ends[0].exit.at < ends[1].exit.at < ends[2].exit.at


def test_between_crashes_the_same_end_is_a_crash_loop_not_a_healthy_job():
    job = Job("torchrun", 1, "h", attempt=2, attempts=(raised(0, 100.0), raised(1, 115.0)))
    verdict = judge(running(), job, now=120.0)
    assert verdict.kind == "crashed" and verdict.culprits == (2,), verdict
    assert verdict.summary.startswith("a crash loop: restarted 2 times; each attempt ended when rank 2 raised "
                                      "ValueError: bad batch at job/train.py:40 train; attempt 2 runs (3 ranks "
                                      "making progress)"), verdict.summary


def test_different_ends_are_each_named_and_the_last_is_the_culprit():
    job = Job("torchrun", 1, "h", attempt=2, attempts=(raised(0, 100.0), killed(1, 115.0, rank=1)))
    verdict = judge(running(), job, now=120.0)
    assert verdict.kind == "crashed" and verdict.culprits == (1,), verdict
    assert ("restarted 2 times: attempt 0 ended when rank 2 raised ValueError: bad batch at job/train.py:40 train; "
            "attempt 1 when rank 1 was killed by SIGKILL") in verdict.summary


def test_an_attempt_that_outlived_the_ones_before_runs_on():
    job = Job("torchrun", 1, "h", attempt=1, attempts=(raised(0, 100.0),))
    verdict = judge(running(), job, now=100.0 + 25.0)  # attempt 0 lasted 10 s; attempt 1 has run 25 s
    assert verdict.kind == "healthy" and verdict.summary.startswith("3 ranks making progress; restarted once; "
                                                                     "attempt 0 ended when rank 2 raised"), verdict
    assert "it runs on" in verdict.summary


def test_the_same_crash_again_and_a_new_one_after_a_restart():
    job = Job("torchrun", 1, "h", attempt=1, attempts=(raised(0, 100.0),))
    again = [*running(2), Rank(rank=2, pid=102, state="exited",
                               exit=ExitInfo(code=1, at=112.0, reason="ValueError", message="ValueError: bad batch",
                                             frame="job/train.py:40 train"))]
    verdict = judge(again, job, now=113.0)
    assert verdict.summary.startswith("a crash loop: rank 2 died") and verdict.summary.endswith(
        "the same end as the attempt before it (restarted once)"), verdict
    other = [*running(2), Rank(rank=2, pid=102, state="exited", exit=ExitInfo(signal="SIGSEGV", at=112.0))]
    verdict = judge(other, job, now=113.0)
    assert verdict.summary.startswith("rank 2 died: killed by SIGSEGV") and "before it: restarted once" in verdict.summary


def test_a_launcher_starting_the_next_attempt_is_no_rendezvous_to_wait_for():
    job = Job("torchrun", 1, "h", attempt=1, attempts=(raised(0, 100.0),), waiting_rendezvous=True)
    verdict = judge([], job, now=101.0)
    assert verdict.kind == "crashed" and "the launcher is starting attempt 1" in verdict.summary, verdict


def test_no_restarts_no_change():
    verdict = Verdict("healthy", (), "3 ranks making progress")
    assert with_restarts(verdict, running(), Job("torchrun", 1, "h"), 1.0) is verdict


def test_a_merged_view_joins_each_nodes_launcher_records_in_time_order():
    """torchrun's agent on each node logs its own ranks' failures: node 0's rank failed attempt 0,
    node 1's attempt 1; the merged job holds both, numbered back from the attempt running now."""
    from dataclasses import replace as _replace

    from trainwatch.probes.remote.merge import _attempts
    node0 = Job("torchrun", 1, "n0", attempt=2, attempt_started_at=131.0, attempts=(raised(0, 100.0, rank=1),))
    node1 = Job("torchrun", 2, "n1", attempt=2, attempt_started_at=131.5,
                attempts=(_replace(killed(0, 125.0, rank=3)),))
    merged = _attempts([node0, node1])
    assert merged["attempt"] == 2 and merged["attempt_started_at"] == 131.0
    assert [(e.attempt, e.rank) for e in merged["attempts"]] == [(0, 1), (1, 3)]


def test_an_attempt_that_finished_well_is_a_finished_job_with_its_history():
    job = Job("torchrun", 1, "h", attempt=1, attempts=(raised(0, 100.0),))
    done = [Rank(rank=r, pid=100 + r, state="exited", exit=ExitInfo(code=0, at=104.0)) for r in range(3)]
    verdict = judge(done, job, now=105.0)
    assert verdict.kind == "healthy" and verdict.summary.startswith("job finished: all 3 ranks exited normally; "
                                                                     "restarted once; attempt 0 ended when rank 2")


def test_an_attempt_younger_than_the_loop_that_looks_stuck_is_said_after_the_loop():
    job = Job("torchrun", 1, "h", attempt=2, attempts=(raised(0, 100.0), raised(1, 115.0)))
    stuck = [Rank(rank=r, pid=100 + r, state="stuck", phase="collective", op="all_reduce", where="train.py:9 step",
                  stuck_for_s=4.0) for r in range(3)]
    verdict = judge(stuck, job, now=120.0)
    assert verdict.kind == "crashed" and verdict.culprits == (2,), verdict
    assert "attempt 2 reads hang so far (all 3 ranks wait in all_reduce" in verdict.summary
    later = judge(stuck, job, now=115.0 + 60.0)  # outlived: its own verdict stands
    assert later.kind == "hang" and "restarted 2 times" in later.summary


def test_the_launchers_log_is_parsed_again_only_when_a_failure_line_comes(tmp_path):
    from trainwatch.probes.read.logs import attempts
    log = tmp_path / "launcher.log"
    lines = LOG.read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if "failed (exitcode" in line)
    log.write_text("".join(lines[:cut]))
    reader = attempts.AttemptLog()
    assert reader.ends(str(log)) == ()
    calls = []
    real = attempts.attempt_ends
    attempts.attempt_ends = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        with open(log, "a") as out:
            out.write("rank 0 step 20 loss 0.1\n")
        assert reader.ends(str(log)) == () and not calls  # output only: not parsed again
        with open(log, "a") as out:
            out.write("".join(lines[cut:]))
        assert len(reader.ends(str(log))) == 3 and calls == [1]
    finally:
        attempts.attempt_ends = real
