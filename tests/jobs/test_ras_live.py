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


def test_snapshot_json_carries_ras_judged_across_two_takes(planted):
    """`trainwatch snapshot --json`: two RAS takes, one before and one after the window. RAS (the
    stand-in, fed this job's real PIDs plus a rank 2 on another node) shows rank 1 one AllReduce
    behind in both; the JSON carries RAS's view of all three ranks, and the verdict agrees."""
    import json
    import subprocess
    import sys

    with RasServer([{"text": "", "json": ""}]) as server:
        job = planted("straggler", nproc=2, extra_env={"NCCL_RAS_ADDR": f"127.0.0.1:{server.port}"})
        pids = rank_pids(job)
        members = [(rank, "127.0.0.1", pid) for rank, pid in sorted(pids.items())] + [(2, "10.9.9.9", 777)]
        server.reports = [{"text": "", "json": json_report(members, {0: 9, 1: 8, 2: 9})}]
        time.sleep(6)  # the straggler has been stuck for a while: stuck within one window
        proc = subprocess.run([sys.executable, "-m", "trainwatch.tui.cli", "snapshot", str(job.pid), "--json",
                               "--window", "3"], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    data = json.loads(proc.stdout)
    ras = data["collectives"]["ras"]
    assert ras["format"] == "json" and ras["kind"] == "behind" and ras["culprits"] == [1], ras
    assert {r["pid"] for r in ras["ranks"]} == {pids[0], pids[1], 777}
    assert data["verdict"]["kind"] == "straggler" and data["verdict"]["culprits"] == [1], data["verdict"]
    assert server.queries >= 2
