"""NCCL RAS in evidence bundles: the raw reports, the judged state, and the RAS section of summary.md."""

import time

from ras_server import FIXTURES, RasServer, takes
from trainwatch.probes.evidence import bundle
from trainwatch.probes.evidence.summary import render
from trainwatch.probes.read.collectives.collective_feed import CollectiveFeed
from trainwatch.probes.read.processes.process import JobProcesses, RankProcess
from trainwatch.probes.read.collectives.sources import FeedOptions, nccl_ras
from trainwatch.probes.redact import Redactor
from trainwatch.probes.snapshot import Job, Rank, Snapshot, Verdict


def job(port: int | None = None, pids=(4101, 4102), env=None) -> JobProcesses:
    env = env or {"NCCL_RAS_ADDR": f"127.0.0.1:{port}"}
    return JobProcesses(launcher="torchrun", root_pid=1, host="node11",
                        ranks=tuple(RankProcess(pid=pid, rank=i, env=env) for i, pid in enumerate(pids)))


def bundle_ras(ranks: JobProcesses):
    """What a bundle's NCCL RAS source reads: files, notes, where it answered, the evidence."""
    feed = CollectiveFeed(ranks, options=FeedOptions(bundle=True), sources=[nccl_ras.Source])
    try:
        feed.wait(10)
        got = feed.evidence()
    finally:
        feed.close()
    seen = got.fields["ras"]
    return ({k: v.decode() for k, v in got.files.items()}, list(got.notes), list(got.worked.get("ras", ())),
            seen[0] if seen else None)


def stuck_snapshot() -> Snapshot:
    ranks = tuple(Rank(rank=n, pid=4101 + n, host="node11", state="stuck", phase="gpu_wait", op="item()",
                       where="train.py:88 main", stuck_for_s=30.0) for n in range(4))
    return Snapshot(job=Job(launcher="torchrun", pid=1, host="node11"), ranks=ranks,
                    verdict=Verdict("hang", (), "all 4 ranks wait on their GPU: no local culprit"), taken_at=time.time())


def rebundled(snapshot: Snapshot, seen) -> Snapshot:
    return bundle._with_collectives(snapshot, {"ras": (seen,) if seen else ()}, Redactor.from_envs([], [], enabled=True))


def test_bundle_keeps_text_and_json_reports_and_the_judge_names_the_dead_rank():
    with RasServer(takes("dead")) as server:
        files, notes, worked, seen = bundle_ras(job(server.port))
    assert files["host/ras.txt"] == (FIXTURES / "synthetic-dead-a.txt").read_text()
    assert files["host/ras.json"] == (FIXTURES / "synthetic-dead-b.json").read_text()  # the second query
    assert "Process 5202 on node 10.0.0.12" in files["host/ras-summary.txt"]
    assert worked == [f"127.0.0.1:{server.port}"] and notes == []
    judged = rebundled(stuck_snapshot(), seen)  # through the one judge, as bundles are
    assert judged.collectives.ras.kind == "dead" and judged.verdict.kind == "straggler"
    assert judged.verdict.culprits == (5,) and "rank 5 (10.0.0.12, pid 5202)" in judged.verdict.summary


def test_another_jobs_report_is_kept_but_not_judged():
    with RasServer(takes("other-job")) as server:
        files, notes, _, seen = bundle_ras(job(server.port))
    assert "host/ras.txt" in files and seen is None
    assert any("another job" in note for note in notes), notes


def test_no_ras_is_a_note():
    files, notes, worked, seen = bundle_ras(job(9, pids=(4101,)))  # port 9: nothing listens
    assert files == {} and worked == [] and seen is None
    assert notes and notes[0].startswith("NCCL RAS: no NCCL RAS at 127.0.0.1:9")
    _, notes, _, _ = bundle_ras(job(pids=(1,), env={"NCCL_RAS_ENABLE": "0", "NCCL_RAS_ADDR": "127.0.0.1:9"}))
    assert notes == ["NCCL RAS: off in this job (NCCL_RAS_ENABLE=0)"]
    _, notes, _, _ = bundle_ras(job(pids=(1,), env={"NCCL_RAS_ENABLE": "0"}))  # no NCCL in the job at all
    assert notes == []


def test_summary_shows_the_ras_state():
    with RasServer(takes("straggler")) as server:
        _, _, _, seen = bundle_ras(job(server.port))
    snap = rebundled(stuck_snapshot(), seen)
    text = render(snap, [], [], reason=None, redacted=True, sources={})
    assert "### NCCL RAS (every rank of the job, from this node)" in text
    assert "rank 6 (10.0.0.12, pid 5203, GPU 2): ok; Broadcast 1, AllGather 3, AllReduce 1204" in text
    assert "No Flight Recorder trace was obtainable (see below); NCCL RAS answered." in text
    # One look: counts apart is not yet a stall in a running job; with every local rank waiting it is
    # the rank behind, said as resting on one reply.
    assert snap.verdict.kind == "straggler" and snap.verdict.culprits == (6,), snap.verdict
    assert "one NCCL RAS reply" in snap.verdict.summary
