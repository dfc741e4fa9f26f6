"""NCCL RAS in evidence bundles: the raw reports, and the RAS section of summary.md."""

import time

from ras_server import FIXTURES, RasServer, takes
from trainwatch.probes.evidence import bundle
from trainwatch.probes.evidence.bundle_rank import RankEvidence
from trainwatch.probes.evidence.summary import render
from trainwatch.probes.snapshot import Job, Rank, Snapshot, Verdict


def evidence(port: int, pids=(4101, 4102)) -> list[RankEvidence]:
    return [RankEvidence(rank=i, pid=pid, env={"NCCL_RAS_ADDR": f"127.0.0.1:{port}"}) for i, pid in enumerate(pids)]


def test_bundle_keeps_text_and_json_reports_and_a_state():
    with RasServer(takes("dead")) as server:
        files, notes, worked, state = bundle._ras(evidence(server.port))
    assert files["host/ras.txt"] == (FIXTURES / "synthetic-dead-a.txt").read_text()
    assert files["host/ras.json"] == (FIXTURES / "synthetic-dead-b.json").read_text()  # the second query
    assert "Process 5202 on node 10.0.0.12" in files["host/ras-summary.txt"]
    assert worked == [f"127.0.0.1:{server.port}"] and notes == []
    assert state is not None and state.kind == "dead" and state.culprits == (5,)


def test_another_jobs_report_is_kept_but_not_judged():
    with RasServer(takes("other-job")) as server:
        files, notes, _, state = bundle._ras(evidence(server.port))
    assert "host/ras.txt" in files and state is None
    assert any("another job" in note for note in notes), notes


def test_no_ras_is_a_note():
    files, notes, worked, state = bundle._ras(evidence(9, pids=(4101,)))  # port 9: nothing listens
    assert files == {} and worked == [] and state is None
    assert notes and notes[0].startswith("NCCL RAS: no NCCL RAS at 127.0.0.1:9")
    _, notes, _, _ = bundle._ras([RankEvidence(rank=0, pid=1, env={"NCCL_RAS_ENABLE": "0"})])
    assert notes == ["NCCL RAS: off in this job (NCCL_RAS_ENABLE=0)"]


def test_summary_shows_the_ras_finding():
    with RasServer(takes("straggler")) as server:
        _, _, _, first = bundle._ras(evidence(server.port))
    snap = Snapshot(job=Job(launcher="torchrun", pid=1, host="node11"),
                    ranks=(Rank(rank=0, pid=4101, host="node11", state="stuck", phase="gpu_wait"),),
                    verdict=Verdict("hang", (), "x"), taken_at=time.time())
    snap = bundle._with_collectives(snap, [], bundle.Redactor.from_envs([], [], enabled=True), [], first)
    text = render(snap, [], [], reason=None, redacted=True, sources={})
    assert "### NCCL RAS (every rank of the job, from this node)" in text
    assert "NCCL RAS at 127.0.0.1" in text and "rank 6 (10.0.0.12, pid 5203, GPU 2): ok; Broadcast 1, AllGather 3, AllReduce 1204" in text
    assert "No Flight Recorder trace was obtainable (see below); NCCL RAS answered." in text
