"""NCCL watchdog timeout lines read into per-rank collective rows: the H100 recording, a synthetic
4-rank mismatch, and the other formats torch's source prints."""

from __future__ import annotations

import random
from datetime import datetime
from pathlib import Path

import pytest

from trainwatch.probes.read.collectives.sources.watchdog import op_name, parse_watchdog, watchdog_state
from trainwatch.probes.judge.collectives import judge_collectives
from trainwatch.probes.snapshot import CollectiveCall, RankCollective

LOGS = Path(__file__).parents[1] / "fixtures" / "logs"
RECORDED = LOGS / "nccl-watchdog-timeout-rank0-output.log"  # one rank's own output, H100, torch 2.x
MISMATCH = LOGS / "synthetic-watchdog-mismatch.log"  # 4 ranks of one torchrun terminal, not recorded


def local(*args: int) -> float:
    """Unix time of a local wall-clock time (the stamps are local time)."""
    return datetime(*args).timestamp()


def timeout_line(rank: int, stamp: str, seq: int, optype: str = "ALLREDUCE", ran_ms: int = 600_000) -> str:
    return (f"[rank{rank}]:[E{stamp}.123456789 ProcessGroupNCCL.cpp:689] [Rank {rank}] Watchdog caught collective "
            f"operation timeout: WorkNCCL(SeqNum={seq}, OpType={optype}, NumelIn=8, NumelOut=8, "
            f"Timeout(ms)=600000) ran for {ran_ms} milliseconds before timing out.")


def test_recorded_h100_timeout():
    rows = parse_watchdog(RECORDED.read_text(), now=local(2026, 11, 22, 12, 30))
    assert list(rows) == [(0, "0")]
    row = rows[(0, "0")]
    assert (row.rank, row.pg, row.pending_seq, row.pending_op) == (0, "0", 861, "all_reduce")
    assert (row.last_enqueued, row.last_completed, row.op, row.sizes) == (861, 860, "all_reduce", "1048576")
    # [E1122 12:18:27.888…]: whole seconds only (the fraction is CLOCK_MONOTONIC's), minus "ran for 45072 milliseconds"
    assert row.pending_since == pytest.approx(local(2026, 11, 22, 12, 18, 27) - 45.072)
    state = judge_collectives(watchdog_state(rows))
    assert state is not None and state.source == "watchdog" and state.divergence is None and state.culprits == ()


def test_synthetic_mismatch_names_rank_2():
    """Ranks 0, 1, 3 wait in _allgather_base #12; rank 2 reached #12 through another code path (all_reduce)."""
    rows = parse_watchdog(MISMATCH.read_text(), now=local(2026, 3, 5, 10))
    assert sorted(rows) == [(0, "0"), (1, "0"), (2, "0"), (3, "0")]
    assert {r.rank: r.pending_op for r in rows.values()} == {
        0: "_allgather_base", 1: "_allgather_base", 2: "all_reduce", 3: "_allgather_base"}
    assert {(r.pending_seq, r.last_enqueued, r.last_completed) for r in rows.values()} == {(12, 12, 11)}
    assert rows[(2, "0")].pending_since == pytest.approx(local(2026, 3, 5, 9, 14, 27) - 600.046)  # E305 is March 5
    state = judge_collectives(watchdog_state(rows))
    assert state is not None and state.source == "watchdog"
    assert state.divergence == "rank 2 enqueued all_reduce #12 while ranks 0-1,3 enqueued _allgather_base #12"
    assert state.culprits == (2,)
    assert {r.rank for r in state.ranks} == {0, 1, 2, 3}


def test_older_torch_without_group_status():
    text = "\n".join([
        "[rank1]:[E ProcessGroupNCCL.cpp:523] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL("
        "SeqNum=668, OpType=ALLREDUCE, NumelIn=52, NumelOut=52, Timeout(ms)=600000) ran for 600097 milliseconds "
        "before timing out.",  # torch 2.2: no date in the stamp
        "[rank0]:[E ProcessGroupNCCL.cpp:537] Some NCCL operations have failed or timed out.",
        "[E ProcessGroupNCCL.cpp:455] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL("
        "OpType=BROADCAST, Timeout(ms)=1800000) ran for 1804406 milliseconds before timing out.",  # 1.x: no SeqNum
    ])
    rows = parse_watchdog(text, now=local(2024, 6, 1))
    assert rows[(1, "0")] == RankCollective(rank=1, pg="0", last_enqueued=668, last_completed=None, op="all_reduce",
                                            sizes="52", pending_seq=668, pending_op="all_reduce",
                                            calls=(CollectiveCall(668, "all_reduce"),))
    assert rows[(3, "0")] == RankCollective(rank=3, pg="0", pending_op="broadcast")  # no sequence number
    assert len(rows) == 2


def test_torch_2_4_status_and_quoted_timeouts():
    """The status line of torch 2.4; the timeout quoted again when the watchdog thread dies, with no
    prefix in what(): read once. A glued torn line still holds its timeout."""
    timeout = ("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=6463, OpType=ALLREDUCE, "
               "NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800017 milliseconds before timing out.")
    text = "\n".join([
        f"    ^^^^^^^^^^^^^^^^^^^^[rank1]:[E1003 18:37:01.832146912 ProcessGroupNCCL.cpp:607] {timeout}",
        "[rank1]:[E1003 18:37:01.833575187 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank 1] Exception (either "
        "an error or timeout) detected by watchdog at work: 6463, last enqueued NCCL work: 6465, last completed NCCL "
        "work: 6462.",
        "[rank1]:[E1003 18:37:01.833621509 ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank 1] Timeout at NCCL "
        "work: 6463, last enqueued NCCL work: 6465, last completed NCCL work: 6462.",
        "[rank1]:[E1003 18:37:01.838048403 ProcessGroupNCCL.cpp:1515] [PG 0 (default_pg) Rank 1] Process group "
        f"watchdog thread terminated with exception: {timeout}",
        "terminate called after throwing an instance of 'c10::DistBackendError'",
        f"  what():  [PG 0 (default_pg) Rank 1] Process group watchdog thread terminated with exception: {timeout}",
    ])
    rows = parse_watchdog(text, now=local(2024, 10, 3, 19))
    assert list(rows) == [(1, "0")]
    row = rows[(1, "0")]
    assert (row.pending_seq, row.pending_op, row.last_enqueued, row.last_completed) == (6463, "all_reduce", 6465, 6462)
    assert row.op is None and row.sizes is None  # #6465's op is not in the lines
    assert row.pending_since == pytest.approx(local(2024, 10, 3, 18, 37, 1) - 1800.017)


def test_subgroup_timeout_is_keyed_by_global_rank_and_group_guid():
    """In a subgroup the message's ranks are ranks within the group, and [Rank N] is cached from the
    first group that logged: the [rankN]: prefix is the global rank. The GUID names the group on every rank."""
    text = "\n".join([
        "[rank5]:[E1122 12:18:27.1 ProcessGroupNCCL.cpp:689] [Rank 5] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=3, OpType=REDUCE_SCATTER, NumelIn=64, NumelOut=16, Timeout(ms)=600000) ran for 600010 "
        "milliseconds before timing out.",
        "[rank5]:[E1122 12:18:27.2 ProcessGroupNCCL.cpp:2303] [PG ID 2 PG GUID 7(tp) Rank 1]  failure detected by "
        "watchdog at work sequence id: 3 PG status: last enqueued work: 3, last completed work: -1",
        timeout_line(5, "1122 12:18:28", 40, "ALLGATHER"),
        "[rank5]:[E1122 12:18:28.2 ProcessGroupNCCL.cpp:2303] [PG ID 0 PG GUID 0(default_pg) Rank 5]  failure "
        "detected by watchdog at work sequence id: 40 PG status: last enqueued work: 40, last completed work: 39",
    ])
    rows = parse_watchdog(text, now=local(2025, 11, 22, 13))
    assert sorted(rows) == [(5, "0"), (5, "7")]
    assert (rows[(5, "7")].pending_op, rows[(5, "7")].last_completed) == ("reduce_scatter", None)  # -1: none yet
    assert rows[(5, "0")].pending_op == "all_gather"
    fixed = ("[rank5]:[E1122 12:18:27.1 ProcessGroupNCCL.cpp:689] [PG GUID 7(tp) Rank 1] Watchdog caught collective "
             "operation timeout: WorkNCCL(SeqNum=3, OpType=SEND, NumelIn=1, NumelOut=1, Timeout(ms)=1) ran for 2 "
             "milliseconds before timing out.")  # the form once WorkNCCL's prefix is no longer cached
    assert list(parse_watchdog(fixed, now=local(2025, 11, 22, 13))) == [(5, "7")]


def test_latest_timeout_per_rank_and_group_and_since():
    earlier = timeout_line(0, "1122 10:00:00", 5)
    later = timeout_line(0, "1122 12:00:00", 9, "_REDUCE_SCATTER_BASE")
    now = local(2025, 11, 22, 12, 5)
    assert parse_watchdog(f"{earlier}\n{later}", now=now)[(0, "0")].pending_seq == 9
    since = local(2025, 11, 22, 11, 50)
    assert parse_watchdog(f"{later}\n{earlier}", since=since, now=now)[(0, "0")].pending_seq == 9
    assert parse_watchdog(earlier, since=since, now=now) == {}
    just_before = timeout_line(0, "1122 11:49:30", 7)  # within a minute of since: kept
    assert parse_watchdog(just_before, since=since, now=now)[(0, "0")].pending_seq == 7
    unstamped = "[Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4, OpType=BARRIER, " \
                "NumelIn=1, NumelOut=1, Timeout(ms)=1000) ran for 1001 milliseconds before timing out."
    assert parse_watchdog(unstamped, since=since, now=now)[(2, "0")].pending_op == "barrier"


def test_year_rollover_and_unpadded_month():
    """A Dec 31 stamp read on Jan 1 is last year's; c10 prints the month unpadded (E709 is July 9)."""
    new_year = local(2026, 1, 1, 0, 5)
    row = parse_watchdog(timeout_line(0, "1231 23:59:50", 3, ran_ms=1000), now=new_year)[(0, "0")]
    assert row.pending_since == pytest.approx(local(2025, 12, 31, 23, 59, 49))
    row = parse_watchdog(timeout_line(0, "709 17:05:38", 3, ran_ms=0), now=local(2025, 7, 9, 17, 10))[(0, "0")]
    assert row.pending_since == pytest.approx(local(2025, 7, 9, 17, 5, 38))
    row = parse_watchdog(timeout_line(0, "1340 10:00:00", 3), now=new_year)[(0, "0")]  # month 13: no date
    assert row.pending_seq == 3 and row.pending_since is None


@pytest.mark.parametrize("optype, op", [
    ("ALLREDUCE", "all_reduce"), ("_ALLGATHER_BASE", "_allgather_base"), ("ALLGATHER", "all_gather"),
    ("REDUCE_SCATTER", "reduce_scatter"), ("_REDUCE_SCATTER_BASE", "_reduce_scatter_base"), ("BROADCAST", "broadcast"),
    ("ALLTOALL_BASE", "alltoall_base"), ("ALLTOALL", "alltoall"), ("BARRIER", "barrier"), ("SEND", "send"),
    ("RECV", "recv"), ("COALESCED", "coalesced"), ("GATHER", "gather"), ("SCATTER", "scatter"), ("REDUCE", "reduce"),
    ("ALLREDUCE_COALESCED", "allreduce_coalesced"),
])
def test_op_names(optype, op):
    assert op_name(optype) == op


NASTY = [
    "",
    "\n\n\r\n",
    "\x00\xff\ufffd" * 1000,
    bytes(range(256)).decode("latin-1") * 50,
    "Watchdog caught collective operation timeout: " * 10,
    "[rank0]:[E1122 12:18:27.1 ProcessGroupNCCL.cpp:689] [Rank 0] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=861, OpType=ALLRED",  # torn mid-line
    "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, NumelIn=2) ran for 3 milliseconds",
    "[rank99999999999999999999]:[E9999 99:99:99.9 x] [Rank -1] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=99999999999999999999999, OpType=X) ran for 99999999999999999999999 milliseconds",
    "[PG ID 0 PG GUID 0(default_pg) Rank 0]  failure detected by watchdog at work sequence id: 861 PG status: "
    "last enqueued work: garbage",
    timeout_line(0, "1122 12:18:27", 1) * 5_000,  # over a megabyte on one line
    "[" + "9" * 5000 + "]:[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=" + "7" * 5000
    + ", OpType=ALLREDUCE) ran for 1 milliseconds",  # numbers too long for int()
    "x" * 1_000_000 + "\n" + timeout_line(4, "0229 12:00:00", 2),  # Feb 29: a leap year's, last year's or none
]


@pytest.mark.parametrize("text", NASTY, ids=range(len(NASTY)))
def test_garbage_never_raises(text):
    rows = parse_watchdog(text, since=0.0, now=local(2025, 3, 1))
    assert isinstance(rows, dict)
    assert all(isinstance(r, RankCollective) for r in rows.values())
    judge_collectives(watchdog_state(rows))


def test_mangled_logs_never_raise():
    """Real and synthetic lines cut, spliced and sprinkled with junk (seeded, so repeatable)."""
    lines = (RECORDED.read_text() + MISMATCH.read_text()).splitlines()
    junk = ["\x00", "\ufffd", "]", "[", ":", "(", ")", "=", "-1", "99999999999999999999", "\r", "[rank", "Rank ", " "]
    rng = random.Random(7)
    for _ in range(300):
        picked = rng.sample(lines, 12)
        mangled = []
        for line in picked:
            cut = rng.randrange(len(line) + 1)
            mangled.append(line[:cut] + rng.choice(junk) + line[rng.randrange(cut, len(line) + 1):])
        rows = parse_watchdog("\n".join(picked + mangled), since=rng.choice([None, 0.0, 2e9]), now=local(2026, 6, 1))
        assert isinstance(rows, dict)
        judge_collectives(watchdog_state(rows))


def test_garbage_keeps_what_it_can():
    rows = parse_watchdog(NASTY[-1], now=local(2025, 3, 1))  # the 1 MB line is skipped, the next line is read
    assert rows[(4, "0")].pending_since is not None  # 2024-02-29
    assert parse_watchdog(NASTY[-2], now=local(2025, 3, 1)) == {}  # one huge line: not torch's
    assert watchdog_state({}) is None


def test_the_feed_reads_the_ranks_logs_and_the_judge_names_the_odd_rank(tmp_path):
    """Through the one feed and the one judge: ranks whose logs hold the watchdog's lines (one log
    for the whole terminal, as torchrun writes it; rank 2 already gone) and that all wait on their
    GPU: the verdict names rank 2 from the watchdog's rows alone."""
    import os
    import time

    from trainwatch.probes.judge.judgement import JudgeMemory, judge_job
    from trainwatch.probes.observed import ObservedJob, ObservedRank
    from trainwatch.probes.read.collectives.collective_feed import CollectiveFeed
    from trainwatch.probes.read.processes.process import JobProcesses, RankProcess
    from trainwatch.probes.snapshot import Job

    log = tmp_path / "train.log"
    log.write_text(MISMATCH.read_text())
    stamp = local(2026, 3, 5, 9, 15)
    os.utime(log, (stamp, stamp))
    procs = tuple(RankProcess(pid=999_000 + r, rank=r, log_path=str(log)) for r in (0, 1, 3))
    job = JobProcesses(launcher="torchrun", root_pid=1, host="h", ranks=procs, started_at=local(2026, 3, 5, 9))
    feed = CollectiveFeed(job)
    try:
        feed.wait(5)
        fields = feed.evidence().fields
    finally:
        feed.close()
    # The reader judges nothing: its rows say what each rank's log said; the judge finds the odd rank.
    assert fields["watchdog"].source == "watchdog" and fields["watchdog"].culprits == ()
    assert {r.rank: r.pending_op for r in fields["watchdog"].ranks}[2] == "all_reduce"
    ranks = tuple(ObservedRank(rank=r, pid=999_000 + r, seen="stuck", phase="gpu_wait", op="item()", stuck_for_s=600.0)
                  for r in (0, 1, 3)) + (ObservedRank(rank=2, seen="missing"),)
    judged = judge_job(ObservedJob(Job("torchrun", 1, "h", world_size=4), ranks, **fields), JudgeMemory(), time.time())
    assert judged.collectives.source == "watchdog" and judged.collectives.culprits == (2,)
    assert 2 in judged.verdict.culprits
    assert judged.verdict.summary == ("rank 2 enqueued all_reduce #12 while ranks 0-1,3 enqueued _allgather_base #12 "
                                      "(NCCL watchdog timeouts in the logs)")


def test_a_growing_log_is_read_from_where_the_last_look_ended(tmp_path):
    """A rank's log gains its timeout line, then its status line in a later write; a log that was
    truncated (a new run) forgets what the old one said."""
    from trainwatch.probes.read.processes.process import JobProcesses, RankProcess
    from trainwatch.probes.read.collectives.sources import FeedOptions
    from trainwatch.probes.read.collectives.sources.watchdog import Source

    log = tmp_path / "rank0.log"
    log.write_text("step 1\n" * 20_000)  # 140 KB of ordinary output
    job = JobProcesses(launcher="torchrun", root_pid=1, host="h",
                       ranks=(RankProcess(pid=999_000, rank=0, log_path=str(log)),))
    source = Source(FeedOptions())
    source.fetch(job)
    assert source.reading(job).value is None
    stamp = datetime.now().strftime("%m%d %H:%M:%S")
    with log.open("a") as out:
        out.write(timeout_line(0, stamp, 861) + "\n")
    source.fetch(job)
    [row] = source.reading(job).value.ranks
    assert (row.pending_seq, row.last_completed) == (861, None)
    with log.open("a") as out:
        out.write(f"[rank0]:[E{stamp}.2 ProcessGroupNCCL.cpp:2303] [PG ID 0 PG GUID 0(default_pg) Rank 0]  failure "
                  "detected by watchdog at work sequence id: 861 PG status: last enqueued work: 861, last completed "
                  "work: 860\n")
    source.fetch(job)
    [row] = source.reading(job).value.ranks
    assert (row.pending_seq, row.last_enqueued, row.last_completed) == (861, 861, 860)
    log.write_text("a new run\n")
    source.fetch(job)
    assert source.reading(job).value is None
