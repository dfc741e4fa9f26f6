"""Every reply NCCL's own RAS formatter wrote (shared/recordings/ras-formatter), read and judged as
its README says: the culprit named, status and errors judged, the broken versions handled."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainwatch.probes.judge import ras as ras_judge
from trainwatch.probes.judge.judgement import JudgeMemory, judge_job
from trainwatch.probes.observed import ObservedJob, ObservedRank, ObservedRas
from trainwatch.probes.read.collectives import ras, ras_report
from trainwatch.probes.snapshot import Job

RECORDINGS = Path(__file__).parents[2].parent / "shared" / "recordings" / "ras-formatter"
LOCAL_PIDS = {1001, 1002}  # ranks 0 and 1 on node 10.0.0.1 (the JSON replies' PIDs; text names only rank 2)
FILES = sorted(p.name for p in RECORDINGS.glob("*") if p.name != "README.md") if RECORDINGS.is_dir() else []
# README: file stem -> the kind a reader should find, always with rank 2 as the culprit.
KINDS = {"behind": "behind", "mismatch": "mismatch", "notstarted": "behind", "unreachable": "unreachable",
         "dead": "dead", "nocomm": "left", "asyncerror": "error", "abort": "abort", "multi": "unreachable"}
SECOND_REPLY_NEEDED = {"unreachable", "multi"}
# Each finding names rank 2: the ranks it holds up make a straggler verdict (a hang names no rank).
VERDICTS = {"behind": "straggler", "mismatch": "mismatch", "unreachable": "straggler", "dead": "straggler",
            "left": "mismatch", "error": "straggler", "abort": "straggler"}

pytestmark = pytest.mark.skipif(not FILES, reason=f"no recordings at {RECORDINGS}")


def read(name: str) -> ras_report.RasReport:
    return ras_report.parse((RECORDINGS / name).read_text())


def stem(name: str) -> str:
    return name.split(".")[0]


@pytest.mark.parametrize("name", FILES)
def test_every_reply_names_rank_2_as_its_readme_says(name):
    tracker = ras_judge.RasTracker()
    report = read(name)
    first = tracker.observe(report, 100.0, "10.0.0.1:28028", local_pids=LOCAL_PIDS)
    second = tracker.observe(report, 102.0, "10.0.0.1:28028", local_pids=LOCAL_PIDS)
    kind = KINDS[stem(name)]
    assert second.kind == kind and second.culprits == (2,), (second.kind, second.finding)
    assert "rank 2 (10.0.0.2, pid 2003)" in second.finding
    if stem(name) in SECOND_REPLY_NEEDED:  # one missed RAS timeout is not enough
        assert first.kind is None
    elif kind in ("dead", "left", "error", "abort"):  # a state, from one reply
        assert first.kind == kind and first.culprits == (2,)
    assert ras_judge.SCOPE in second.notes  # what RAS cannot see is said where a finding leans on it
    from trainwatch.probes.judge.verdict import RAS_VERDICTS
    assert RAS_VERDICTS[kind] == VERDICTS[kind]
    assert not second.advancing and ras_judge.progress_pids(second, LOCAL_PIDS) == set()


@pytest.mark.parametrize("name", [f for f in FILES if stem(f) in ("abort", "asyncerror", "nocomm")])
def test_status_and_errors_are_read_in_both_formats(name):
    [comm] = read(name).comms
    two = next(r for r in comm.ranks if r.rank == 2)
    expected = {"abort": ("ok", None, "abort"), "asyncerror": ("ok", "asynchronous error: remote process error", None),
                "nocomm": ("nocomm", None, None)}[stem(name)]
    assert (two.status, two.error, two.comm_status) == expected
    assert (two.pid, two.host) == (2003, "10.0.0.2")


def test_the_wording_of_each_state():
    def finding(name: str) -> str:
        tracker = ras_judge.RasTracker()
        tracker.observe(read(name), 1.0, "a")
        return tracker.observe(read(name), 3.0, "a").finding

    assert finding("abort.text.v1") == "rank 2 (10.0.0.2, pid 2003) aborted its communicator (communicator 0)"
    assert finding("asyncerror.json.v1") == ("rank 2 (10.0.0.2, pid 2003) reports an NCCL asynchronous error: "
                                             "remote process error (communicator 0)")
    assert finding("nocomm.text.v0") == ("rank 2 (10.0.0.2, pid 2003) answered NCCL RAS but no longer has the "
                                         "communicator (destroyed, or never made) (communicator 0; 2 others still "
                                         "use it)")
    assert finding("notstarted.json.v1") == ("rank 2 (10.0.0.2, pid 2003) has not launched any collective in "
                                             "communicator 0 (all 2 others launched #101)")


def test_nccl_2_28_9_invalid_json_is_repaired_and_said():
    raw = (RECORDINGS / "multi.v2.28.9-1.json.v1").read_text()
    with pytest.raises(ValueError):
        __import__("json").loads(raw)  # NCCL's own bytes really are invalid
    report = ras_report.parse(raw)
    assert len(report.comms) == 2 and report.nccl_version == "2.28.9"
    assert any("invalid JSON" in n and "repaired" in n for n in report.notes), report.notes


@pytest.mark.parametrize("version", ["2.27.7", "2.28.9"])
def test_text_after_missing_ranks_is_not_trusted_on_broken_versions(version):
    report = read(f"multi.v{version}-1.text.v1")
    [comm] = report.comms  # the corrupt second communicator (its row says NOCOMM, 0 ranks) is not read
    assert comm.hash == "0aaa000000000001" and "INCOMPLETE" in comm.problems
    assert [p.pid for p in report.unreachable] == [2003]
    assert any(f"NCCL {version}'s text report is corrupt" in n for n in report.notes), report.notes


def test_the_second_communicator_is_fine_where_nccl_got_it_right():
    report = read("multi.v2.29.7-1.json.v1")
    tracker = ras_judge.RasTracker()
    tracker.observe(report, 1.0, "a")
    state = tracker.observe(report, 3.0, "a")
    assert state.culprits == (2,) and len(state.comms) == 2
    second = [r for r in state.ranks if r.comm == state.comms[1]]
    assert second and all(r.status == "ok" and r.error is None and r.comm_status is None for r in second)
    assert not any(n for n in report.notes if "corrupt" in n)


def test_a_cut_reply_is_never_a_report():
    for name in ("behind.text.v1", "behind.json.v1", "dead.text.v1"):
        raw = (RECORDINGS / name).read_text()
        head = raw[: raw.index("Communicators") + 40] if "Communicators" in raw else raw[: len(raw) // 2]
        with pytest.raises(ras_report.PartialReport):
            ras_report.parse(head)


def test_process_information_not_found_is_kept():
    raw = (RECORDINGS / "behind.text.v1").read_text().replace(
        "Rank 2 has launched up to operation 100 -- GPU 0 managed by process 2003 on node 10.0.0.2",
        "Rank 2 has launched up to operation 100 -- [process information not found]")
    report = ras_report.parse(raw)
    [two] = report.comms[0].ranks
    assert (two.rank, two.pid, dict(two.counts)) == (2, None, {"AllReduce": 100})
    assert report.unnamed == (2,) and any("no process information for rank 2" in n for n in report.notes)
    tracker = ras_judge.RasTracker()
    tracker.observe(report, 1.0, "a")
    state = tracker.observe(report, 3.0, "a")
    assert state.culprits == (2,) and "rank 2 (10.0.0.2" not in state.finding and "pid ?" in state.finding


# -- whose report: what identifies the job in each format -----------------------------------------------
def test_a_text_report_naming_only_the_remote_culprit_is_this_jobs_by_its_summary():
    report = read("behind.text.v1")  # names only pid 2003 on 10.0.0.2
    owner = ras.ownership(report, {31, 32}, world_size=3, local_ranks=2, local_hosts={"10.0.0.1"})
    assert owner.verdict == "ours" and "job summary matches" in owner.note
    assert ras.ownership(report, {31, 32}, world_size=4, local_ranks=2).verdict == "other"
    assert ras.ownership(report, {31, 32}, world_size=3, local_ranks=3).verdict == "other"  # no node runs 3
    unsure = ras.ownership(report, {31, 32})
    assert unsure.verdict == "unsure" and "pid 2003 on 10.0.0.2" in unsure.note


def test_a_process_of_this_node_that_is_not_ours_is_another_job():
    report = read("behind.text.v1")
    owner = ras.ownership(report, {31, 32}, world_size=3, local_ranks=2, local_hosts={"10.0.0.2"})
    assert owner.verdict == "other" and "2003" in owner.note


def test_json_lists_every_rank_so_none_of_ours_is_another_job():
    report = read("behind.json.v1")
    assert ras.ownership(report, LOCAL_PIDS, world_size=3).verdict == "ours"
    assert ras.ownership(report, {31, 32}, world_size=3).verdict == "other"


def test_an_unsure_report_still_names_its_culprit_with_a_caveat():
    report = read("behind.text.v1")
    owner = ras.ownership(report, {31, 32})
    ranks = tuple(ObservedRank(rank=n, pid=31 + n, host="here", seen="stuck", phase="collective", op="all_reduce",
                               where="train.py:9 step") for n in range(2))
    memory = JudgeMemory()
    job = Job(launcher="torchrun", pid=1, host="here")
    for at in (100.0, 103.0):
        evidence = ObservedJob(job, ranks, ras=(ObservedRas("127.0.0.1:28028", at, report, (), owner.note),))
        judged = judge_job(evidence, memory, at)
    assert judged.verdict.kind == "straggler" and judged.verdict.culprits == (2,)
    assert "not matched to this job for sure" in judged.verdict.summary
    assert owner.note in judged.collectives.ras.notes


def test_newer_nccl_timeout_code_and_zeroed_communicators():
    """NCCL 2.30 adds ncclTimeout (8); #2346 can leave a communicator record zeroed in JSON."""
    import json
    data = json.loads((RECORDINGS / "asyncerror.json.v1").read_text())
    data["communicators"][0]["ranks"][2]["status"]["async_error"] = 8
    data["communicators"].append({"hash": "0x0", "secondary_hash": "0x0:0x0", "size": 0, "ranks_count": 0,
                                  "missing_ranks_count": 0, "ranks": [], "missing_ranks": []})
    report = ras_report.parse(json.dumps(data))
    [comm] = report.comms
    assert next(r for r in comm.ranks if r.rank == 2).error == "asynchronous error: timeout"
    assert any("empty communicator record" in n and "#2346" in n for n in report.notes)


# -- NCCL 2.27's text, judged as fully as the JSON --------------------------------------------------------
def at_2_27_7(raw: str) -> str:
    """A 2.29.7 text reply as NCCL 2.27.7 writes it: client_support.cc at both tags differs, for these
    sections, only in the version line and the timings' precision (%.2fs, not %.3fs)."""
    import re
    raw = re.sub(r"NCCL version 2\.\d+\.\d+", "NCCL version 2.27.7", raw)
    return re.sub(r"\((\d+\.\d\d)\ds\)", r"(\1s)", raw)


ONE_REPLY = ["behind", "mismatch", "notstarted", "dead", "nocomm", "asyncerror", "abort"]  # unreachable: two, always


def one_reply_verdict(report: ras_report.RasReport, states: tuple[str, str]):
    """Ranks 0-1 of this node (not in the text: it names only the outlier) in all_reduce, as read."""
    ranks = tuple(ObservedRank(rank=n, pid=31 + n, host="here", seen=state, phase="collective", op="all_reduce",
                               where="train.py:9 step", stuck_for_s=30.0 if state == "stuck" else None)
                  for n, state in enumerate(states))
    evidence = ObservedJob(Job(launcher="torchrun", pid=1, host="here"), ranks,
                           ras=(ObservedRas("127.0.0.1:28028", 100.0, report),))
    return judge_job(evidence, JudgeMemory(), 100.0).verdict


@pytest.mark.parametrize("scenario", ONE_REPLY)
@pytest.mark.parametrize("version", ["v1", "v0"])
def test_one_2_27_7_text_reply_names_the_culprit_as_one_json_reply_does(scenario, version):
    """The local ranks wait in all_reduce; one reply names the remote rank 2, from the text as
    from the JSON (a count behind: one reply, told only because every local rank waits)."""
    text = one_reply_verdict(ras_report.parse(at_2_27_7(read_raw(f"{scenario}.text.{version}"))), ("stuck", "stuck"))
    json = one_reply_verdict(read(f"{scenario}.json.v1"), ("stuck", "stuck"))
    assert text.kind == json.kind == VERDICTS[KINDS[scenario]], (text, json)
    assert text.culprits == json.culprits == (2,), (text, json)
    assert "rank 2 (10.0.0.2, pid 2003)" in text.summary and "no local culprit" not in text.summary


def test_one_reply_of_counts_that_differ_is_no_finding_while_local_ranks_run():
    """A running job is a collective apart all the time: one reply's counts say nothing then."""
    report = ras_report.parse(at_2_27_7(read_raw("behind.text.v1")))
    verdict = one_reply_verdict(report, ("stuck", "running"))
    assert verdict.culprits != (2,) and "NCCL RAS" not in verdict.summary, verdict


def read_raw(name: str) -> str:
    return (RECORDINGS / name).read_text()
