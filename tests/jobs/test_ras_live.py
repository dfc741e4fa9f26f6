"""NCCL RAS in the live source, on real gloo jobs whose ranks name a RAS stand-in (NCCL_RAS_ADDR)."""

from __future__ import annotations

import re
import time

from ras_server import RasServer, json_report, takes
from trainwatch.probes.live import LocalSource


def rank_pids(job) -> dict[int, int]:
    """rank -> PID from the planted job's start lines."""
    return {int(r): int(p) for r, p in re.findall(r"rank (\d+)/\d+ pid (\d+)", job.log.read_text())}


def poll_until(source: LocalSource, condition, timeout: float = 40.0):
    deadline = time.monotonic() + timeout
    snapshot = None
    while time.monotonic() < deadline:
        snapshot = source.poll()
        if condition(snapshot):
            return snapshot
        time.sleep(0.3)
    raise AssertionError(f"condition not met within {timeout}s; last: {snapshot and snapshot.verdict}, "
                         f"ras: {snapshot and snapshot.collectives and snapshot.collectives.ras}, notes: "
                         f"{snapshot and snapshot.notes}")


def test_ras_names_the_rank_behind_and_agrees_with_the_stacks(planted):
    """Rank 2 sleeps before its all_reduce; RAS (the stand-in, fed the job's real PIDs) shows it one
    AllReduce behind on two polls in a row. The verdict names it, in the stacks' words."""
    with RasServer([{"text": "", "json": ""}]) as server:
        job = planted("straggler", nproc=3, extra_env={"NCCL_RAS_ADDR": f"127.0.0.1:{server.port}"})
        pids = rank_pids(job)
        members = [(rank, "127.0.0.1", pid) for rank, pid in sorted(pids.items())]
        server.reports = [{"text": "", "json": json_report(members, {0: 5, 1: 5, 2: 4})}]
        source = LocalSource(job.pid, window=1.0, gpu=False)
        try:
            snapshot = poll_until(source, lambda s: s.collectives is not None and s.collectives.ras is not None
                                  and s.collectives.ras.kind == "behind" and s.verdict.kind == "straggler")
        finally:
            source.close()
    ras = snapshot.collectives.ras
    assert ras.culprits == (2,) and snapshot.verdict.culprits == (2,)
    assert f"rank 2 (127.0.0.1, pid {pids[2]}) is 1 collective behind in communicator 0" in ras.finding
    assert snapshot.verdict.summary.startswith("rank 2 is in sleep at train.py"), snapshot.verdict.summary  # the stacks' wording
    assert server.commands[:4] == ["CLIENT PROTOCOL 2", "TIMEOUT 5", "SET FORMAT json", "VERBOSE STATUS"]


def test_counts_advancing_keep_a_healthy_job_healthy_and_another_jobs_service_is_a_note(planted):
    with RasServer(takes("other-job")) as server:
        job = planted("healthy", nproc=2, extra_env={"NCCL_RAS_ADDR": f"127.0.0.1:{server.port}"})
        source = LocalSource(job.pid, window=1.0, gpu=False)
        try:
            snapshot = poll_until(source, lambda s: any("another job" in n for n in s.notes))
        finally:
            source.close()
    assert snapshot.verdict.kind == "healthy" and (snapshot.collectives is None or snapshot.collectives.ras is None)


def test_a_gloo_job_without_ras_reads_as_before(planted):
    """Nothing listens on the RAS port: no RAS state, no note, the stacks' verdict."""
    job = planted("straggler", nproc=2, extra_env={"NCCL_RAS_ADDR": "127.0.0.1:9"})
    source = LocalSource(job.pid, window=1.0, gpu=False)
    try:
        snapshot = poll_until(source, lambda s: s.verdict.kind == "straggler")
        time.sleep(2.5)  # past the RAS interval: a second query was refused too
        snapshot = source.poll()
    finally:
        source.close()
    assert snapshot.verdict.kind == "straggler" and snapshot.verdict.culprits == (1,)
    assert snapshot.collectives is None or snapshot.collectives.ras is None
    assert not any("RAS" in n for n in snapshot.notes), snapshot.notes
