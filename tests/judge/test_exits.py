"""One exit record: how a rank ended, who died first, lingering ranks that raised (no jobs started)."""

from __future__ import annotations

import json
from pathlib import Path

from trainwatch.probes.redact import MASK
from trainwatch.probes.evidence.crash_catcher import CrashCatcher
from trainwatch.probes.judge import exits
from trainwatch.probes.judge.exits import abnormal, death, first_to_die
from trainwatch.probes.read.processes.exits import CrashRecord, ExitLedger, read_exit
from trainwatch.probes.judge.phases import classify
from trainwatch.probes.judge.judgement import JudgeMemory, judge_job
from trainwatch.probes.observed import ObservedJob, ObservedRank, observed_rank
from trainwatch.probes.read.logs import crashlog
from trainwatch.probes.read.processes.process import JobProcesses, RankProcess
from trainwatch.probes.read.logs.ranklog import RankLogs
from trainwatch.probes.snapshot import ExitInfo, Frame, Job, Rank, ThreadStack

GONE_PID = 2**22 + 12345  # above the default pid_max: no such process, no kernel log line


def test_first_to_die_orders_one_moment_by_how_telling_each_death_is():
    teardown = ExitInfo(signal="SIGTERM", at=100.0)
    error = ExitInfo(code=1, at=100.4, reason="RuntimeError", message="RuntimeError: boom")
    peer = ExitInfo(code=1, at=100.0, reason="a peer rank closed its connection")
    assert first_to_die([(0, teardown), (1, error)]) == 1  # the launcher's SIGTERM came after the error
    assert first_to_die([(0, peer), (1, error)]) == 1  # rank 0 only lost its peer
    assert first_to_die([(0, ExitInfo(code=1, at=90.0)), (1, ExitInfo(signal="SIGSEGV", at=95.0))]) == 0
    oom = ExitInfo(signal="SIGKILL", at=100.2, reason="killed by the kernel OOM killer")
    assert first_to_die([(0, teardown), (3, oom)]) == 3  # a SIGKILL from the OOM killer is a cause
    assert first_to_die([(0, ExitInfo(code=0, at=1.0)), (1, ExitInfo(at=2.0))]) is None


def test_a_sigkill_before_any_sigterm_is_a_kill_from_outside_not_the_teardown():
    """torchrun tears down with SIGTERM (SIGKILL only after its grace): the rank SIGKILLed first is
    the cause, before peers that lost their connection and the ranks torn down, even when the
    launcher's log gives them all the same second."""
    killed = ExitInfo(signal="SIGKILL", at=100.0, source="launcher log")
    torn = ExitInfo(signal="SIGTERM", at=100.0, source="launcher log")
    peer = ExitInfo(code=1, at=100.1, reason="a peer rank closed its connection")
    assert first_to_die([(0, torn), (1, torn), (2, killed)]) == 2
    assert first_to_die([(0, peer), (2, killed)]) == 2
    late_kill = ExitInfo(signal="SIGKILL", at=130.5)  # a rank that outlived the teardown's 30 s grace
    assert first_to_die([(0, ExitInfo(signal="SIGTERM", at=100.0)), (1, late_kill)]) == 0
    read_late = ExitInfo(signal="SIGKILL", at=100.5, source="launcher log")  # its line follows the SIGTERMs
    assert first_to_die([(0, ExitInfo(signal="SIGTERM", at=100.0)), (1, read_late)]) == 1
    vanished = ExitInfo(at=100.0, reason=exits.VANISHED, message="vanished between 12:00:00 and 12:00:01")
    assert first_to_die([(0, peer), (2, vanished)]) == 2 and abnormal(vanished)
    assert death(2, 812, vanished) == "rank 2 (pid 812) vanished between 12:00:00 and 12:00:01"
    assert exits.describe_exit(killed) == "killed by SIGKILL (from the launcher's log)"


def test_a_rank_reaped_with_no_evidence_is_not_a_crash():
    assert not abnormal(ExitInfo(at=1.0)) and not abnormal(ExitInfo(code=0)) and not abnormal(None)
    assert abnormal(ExitInfo(reason="RuntimeError", message="RuntimeError: x")) and abnormal(ExitInfo(code=2))
    assert abnormal(ExitInfo(signal="SIGTERM"))


def test_describe_names_the_exception_or_the_reason():
    raised = ExitInfo(code=1, reason="RuntimeError", message="RuntimeError: boom", frame="train.py:9 step")
    assert exits.describe_exit(raised) == "exit code 1, RuntimeError: boom, in train.py:9 step"
    assertion = ExitInfo(code=1, reason="CUDA device-side assert",
                         message="torch.AcceleratorError: CUDA error: device-side assert triggered")
    assert exits.describe_exit(assertion) == "exit code 1, CUDA device-side assert"
    segv = ExitInfo(signal="SIGSEGV", reason="segmentation fault", frame="train.py:116 train")
    assert exits.describe_exit(segv) == "killed by SIGSEGV, in train.py:116 train"
    record = CrashRecord(rank=1, pid=42, exit=raised)
    assert death(record.rank, record.pid, record.exit) == "rank 1 (pid 42) died: exit code 1, RuntimeError: boom, in train.py:9 step"


def shared_log(tmp_path: Path, *lines: str) -> tuple[RankLogs, str]:
    log = tmp_path / "job.log"
    log.write_text("\n".join(lines) + "\n")
    logs = RankLogs()
    logs.note_writer(1, str(log))
    logs.note_writer(2, str(log))  # two ranks write here: only prefixed lines are theirs
    return logs, str(log)


def test_read_exit_takes_the_reason_from_the_ranks_own_lines(tmp_path):
    logs, path = shared_log(
        tmp_path, "step 10", "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "/w/train.py", line 30, in train',
        "[rank1]: RuntimeError: cannot reach https://bob:hunter2hunter2@hub.example/x with HF_TOKEN=hf_0123456789abcdef",
        "Traceback (most recent call last):", '  File "/venv/bin/torchrun", line 8, in <module>',
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:")
    proc = RankProcess(pid=GONE_PID, rank=1, local_rank=1, log_path=path)
    record = read_exit(proc, (1, None), now=50.0, logs=logs)
    info = record.exit
    assert (info.code, info.reason, info.frame, info.at) == (1, "RuntimeError", "w/train.py:30 train", 50.0)
    assert info.message.startswith("RuntimeError: cannot reach https://<redacted>@hub.example/x")
    assert "hunter2" not in info.message and "hf_0123" not in info.message and MASK in info.message
    assert "── error ──" in record.log_tail and "RuntimeError: cannot reach" in record.log_tail
    other = read_exit(RankProcess(pid=GONE_PID, rank=0, local_rank=0, log_path=path), (1, None), now=50.0, logs=logs)
    assert other.exit.reason is None  # rank 0 said nothing of its own
    clean = read_exit(proc, (0, None), now=50.0, logs=logs)
    assert clean.exit == ExitInfo(code=0, at=50.0) and not abnormal(clean.exit)
    unseen = read_exit(RankProcess(pid=GONE_PID, rank=0, local_rank=0), None, now=50.0, logs=logs)
    assert not abnormal(unseen.exit)  # reaped with no status and no evidence: taken as a normal exit


def lingering_rank(path: str | None, pid: int = 7001) -> Rank:
    threads = (
        ThreadStack("MainThread", tid=pid, is_main=True, active=False,
                    frames=(Frame("_shutdown", "/usr/lib/python3.11/threading.py", 1590),)),
        ThreadStack("worker", tid=pid + 1, frames=(
            Frame("sleep", "<built-in>", None, native=True), Frame("upload", "/w/train.py", 40),
            Frame("Thread.run", "/usr/lib/python3.11/threading.py", 982))),
    )
    cls = classify(threads)
    return Rank(rank=1, pid=pid, local_rank=1, state="stuck", phase=cls.phase, op=cls.op, where=cls.where,
                detail=cls.detail, threads=threads, log_path=path)


def test_a_lingering_rank_that_raised_is_crashed_while_its_process_lives(tmp_path):
    logs, path = shared_log(tmp_path, "[rank1]: Traceback (most recent call last):",
                            '[rank1]:   File "/w/train.py", line 30, in train', "[rank1]: RuntimeError: boom")
    rank = lingering_rank(path)
    assert rank.phase == "exiting"
    assert rank.detail == "main thread exited; kept alive by non-daemon thread 'worker' at train.py:40 upload"
    ledger = ExitLedger(root_pid=GONE_PID)
    ledger.logs = logs
    waiting = Rank(rank=0, pid=7000, local_rank=0, state="stuck", phase="collective", op="all_reduce",
                   where="train.py:44 sync")
    job = JobProcesses(launcher="torchrun", root_pid=GONE_PID, host="h")
    seen = {7001: RankProcess(pid=7001, rank=1, local_rank=1, log_path=path)}
    judged = judge_all(ledger.ranks([observed_rank(waiting), observed_rank(rank)], job, seen, {}, {}, now=10.0))
    culprit, verdict = judged.ranks[1], judged.verdict
    assert culprit.state == "stuck" and culprit.exit.reason == "RuntimeError" and culprit.exit.first
    assert (verdict.kind, verdict.culprits) == ("crashed", (1,))
    assert verdict.summary == ("rank 1 raised RuntimeError: boom (main thread exited; kept alive by "
                               "non-daemon thread 'worker' at train.py:40 upload)")
    # the same rank with a log that shows no exception is only exiting: a straggler, not a crash
    quiet = ExitLedger(root_pid=GONE_PID)
    judged = judge_all(quiet.ranks([observed_rank(waiting), observed_rank(lingering_rank(None))], job, {}, {}, {},
                                   now=10.0))
    assert judged.ranks[1].exit is None and judged.verdict.kind == "straggler"


def judge_all(ranks: list[ObservedRank]):
    return judge_job(ObservedJob(Job("torchrun", 1, "h"), tuple(ranks)), JudgeMemory(), 10.0)


def test_exiting_phase_from_native_finalize_and_atexit():
    native = [ThreadStack("MainThread", tid=1, is_main=True, frames=(
        Frame("pthread_join", "libc.so.6", None, native=True), Frame("Py_FinalizeEx", "libpython3.11.so", None, native=True)))]
    assert classify(native).phase == "exiting"
    assert classify(native).detail == "main thread exited; the interpreter is shutting down"
    atexit = [ThreadStack("MainThread", tid=1, is_main=True, frames=(
        Frame("join", "/usr/lib/python3.11/threading.py", 1100),
        Frame("_python_exit", "/usr/lib/python3.11/concurrent/futures/thread.py", 31)))]
    assert classify(atexit).phase == "exiting"


def test_saved_crash_records_hold_no_secrets(tmp_path):
    catcher = CrashCatcher(GONE_PID, save_dir=tmp_path)
    info = ExitInfo(code=1, at=1.0, reason="RuntimeError", message="RuntimeError: login --password s3cr3tpass failed")
    record = CrashRecord(rank=1, pid=GONE_PID, exit=info, log_tail="export WANDB_API_KEY=abcdef0123456789\nstep 3",
                         exception="RuntimeError: https://u:pw12345678@host/")
    saved = catcher._save(record)
    text = Path(saved.saved_to).read_text()
    data = json.loads(text)
    assert data["exit"]["reason"] == "RuntimeError" and data["exit"]["code"] == 1
    for secret in ("s3cr3tpass", "abcdef0123456789", "pw12345678"):
        assert secret not in text, secret
    assert saved.exit.message == info.message  # the in-memory record is untouched; bundles redact their own


def test_kernel_oom_kill_names_the_pid(tmp_path):
    from trainwatch.probes.read.logs.kernlog import kernel_fault

    kmsg = tmp_path / "kmsg"
    kmsg.write_text("3,812,99999,-;Out of memory: Killed process 4242 (python) total-vm:9000kB, anon-rss:800kB\n")
    sig, line = kernel_fault(4242, str(kmsg))
    assert sig == "SIGKILL" and line.startswith("Out of memory: Killed process 4242")
    assert kernel_fault(4243, str(kmsg)) is None
    proc = RankProcess(pid=4242, rank=3)
    assert crashlog.classify(line) == exits.OOM_KILLED
    assert first_to_die([(0, ExitInfo(signal="SIGTERM", at=5.0)),
                         (proc.rank, ExitInfo(signal=sig, at=5.1, reason=exits.OOM_KILLED))]) == 3


def test_a_single_node_job_in_rendezvous_is_not_said_to_wait_for_other_nodes():
    from trainwatch.probes.judge.verdict import judge
    one = judge([], Job(launcher="torchrun", pid=7, host="h", nnodes=1, waiting_rendezvous=True))
    two = judge([], Job(launcher="torchrun", pid=7, host="h", nnodes=2, waiting_rendezvous=True))
    assert one.kind == two.kind == "rendezvous"
    assert "other nodes" not in one.summary and "still starting its workers" in one.summary
    assert two.summary.endswith("other nodes have not joined")


def test_the_kernel_log_is_read_once_for_ranks_that_die_together_and_the_last_fault_of_a_pid_wins(tmp_path):
    from trainwatch.probes.read.logs import kernlog

    kmsg = tmp_path / "kmsg-together"
    kmsg.write_text("6,1,1,-;python[4242]: segfault at 0 ip 0 sp 0 error 4 in libc.so\n"
                    "6,2,2,-;traps: python[4242] trap invalid opcode ip:0 sp:0 error:0\n"
                    "6,3,3,-;traps: python[4243] trap divide error ip:0 sp:0 error:0\n")
    assert kernlog.kernel_fault(4242, str(kmsg))[0] == "SIGILL"
    kmsg.write_text("")  # within FRESH_S: the same read answers the rank that died beside it
    assert kernlog.kernel_fault(4243, str(kmsg))[0] == "SIGFPE"


def test_a_week_of_restarts_keeps_the_first_death_and_the_latest_others():
    from trainwatch.probes.evidence.crash_catcher import latest_records

    records = [CrashRecord(rank=n % 8, pid=1000 + n, exit=ExitInfo(code=1, first=n == 3)) for n in range(50)]
    kept = latest_records(records, kept=10)
    assert [r.pid for r in kept] == [1003, *range(1041, 1050)]
    assert latest_records(records[:10], kept=10) == records[:10]


def test_the_ledger_remembers_only_the_latest_restarted_pids(monkeypatch):
    from trainwatch.probes.read.processes import exits as ledger_module

    monkeypatch.setattr(ledger_module, "FORGOTTEN_KEPT", 3)
    ledger = ExitLedger(root_pid=GONE_PID)
    for pid in range(10, 20):
        ledger.forget(pid)
    ledger.adopt([CrashRecord(rank=0, pid=pid, exit=ExitInfo(code=1)) for pid in (15, 19)])
    assert list(ledger._exits) == [15]  # 19 was restarted lately: not shown again; 15's PID may be reused


def test_a_fault_logged_just_after_another_ranks_is_still_seen(tmp_path):
    from trainwatch.probes.read.logs import kernlog

    kmsg = tmp_path / "kmsg-later"
    kmsg.write_text("6,1,1,-;python[5001]: segfault at 0 ip 0 sp 0 error 4 in libc.so\n")
    assert kernlog.kernel_fault(5001, str(kmsg))[0] == "SIGSEGV"
    assert kernlog.kernel_fault(5002, str(kmsg)) is None
    with kmsg.open("a") as log:  # the next rank faults a moment later
        log.write("6,2,2,-;traps: python[5002] trap divide error ip:0 sp:0 error:0 in x.so\n")
    assert kernlog.kernel_fault(5002, str(kmsg))[0] == "SIGFPE"


def test_a_cause_read_late_still_comes_before_the_deaths_it_caused():
    """A SIGKILL read from the launcher's log after the fact carries a late time; the peers that
    lost their connection died of it, so it is first whatever the clocks say."""
    killed = ExitInfo(signal="SIGKILL", at=101.5, source="launcher log")
    peer = ExitInfo(code=1, at=100.0, reason="a peer rank closed its connection")
    torn = ExitInfo(signal="SIGTERM", at=100.2)
    assert first_to_die([(0, peer), (1, torn), (2, killed)]) == 2
    assert first_to_die([(0, peer), (1, torn)]) == 0  # no cause at all: the earliest, as before


def test_peers_that_failed_after_a_kill_are_never_culprits_beside_it():
    from trainwatch.probes.judge.verdict import judge
    ranks = [Rank(rank=0, pid=10, state="exited", exit=ExitInfo(code=1, at=100.0, reason="a peer rank closed its connection")),
             Rank(rank=1, pid=11, state="exited", exit=ExitInfo(code=1, at=100.0, reason="a peer rank closed its connection")),
             Rank(rank=2, pid=12, state="exited", exit=ExitInfo(signal="SIGKILL", at=100.0))]
    verdict = judge(ranks)  # no rank marked first (as a re-judged snapshot may hold them)
    assert verdict.kind == "crashed" and verdict.culprits == (2,), verdict
    assert verdict.summary.startswith("rank 2 died: killed by SIGKILL") and "ranks 0-1 then ended too" in verdict.summary


def test_a_rank_the_catcher_never_saw_alive_is_read_from_the_launchers_log(tmp_path):
    """Rank 2 was SIGKILLed and reaped before `watch` first looked: torchrun's own stamped line names it."""
    log = Path(__file__).parents[1] / "fixtures" / "logs" / "torchrun-rank2-sigkill.log"
    catcher = CrashCatcher(GONE_PID)
    catcher._launcher_log = str(log)
    catcher._locals = {0: 0, 1: 1, 2: 2}
    found = catcher._unseen_deaths()
    by_rank = {r.rank: r.exit for r in found}
    assert by_rank[2].signal == "SIGKILL" and by_rank[2].source == "launcher log" and by_rank[2].at is not None
    assert first_to_die((r.rank, r.exit) for r in found) == 2
    assert catcher._unseen_deaths() == []  # once
