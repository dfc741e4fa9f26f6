"""Reason and message where people read them: summary.md, the detail pane, the log tail."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from trainwatch.probes.evidence.bundle_rank import RankEvidence
from trainwatch.probes.evidence.summary import render
from trainwatch.probes.snapshot import ExitInfo, Verdict
from trainwatch.probes.read.logs.ranklog import RankLogs
from trainwatch.tui.widgets.detail import detail_text
from trainwatch.tui.widgets.lines import state_label

from tui_samples import NOW, straggler

ASSERT_LOG = Path(__file__).parents[1] / "fixtures" / "logs" / "device-side-assert-torchrun-2ranks.log"
MESSAGE = "torch.AcceleratorError: CUDA error: device-side assert triggered"


def crashed_on_the_recorded_log():
    """Ranks 0-3 writing to the recorded torchrun log; rank 1 died of the device-side assert."""
    base = straggler()
    ranks = [replace(r, log_path=str(ASSERT_LOG)) for r in base.ranks]
    ranks[1] = replace(ranks[1], state="exited", threads=(), exit=ExitInfo(
        code=1, at=NOW - 5, first=True, reason="CUDA device-side assert", message=MESSAGE, frame="job/gpujob.py:60 main"))
    verdict = Verdict("crashed", (1,), "rank 1 died: exit code 1, CUDA device-side assert, in job/gpujob.py:60 main")
    return replace(base, ranks=tuple(ranks), verdict=verdict)


def test_summary_names_reason_and_message_and_shows_the_culprits_error_first():
    snap = crashed_on_the_recorded_log()
    evidence = [RankEvidence(rank=1, pid=snap.rank(1).pid, files={"log-tail.txt": ASSERT_LOG.read_text()})]
    text = render(snap, evidence, [], reason=None, redacted=True, sources={})
    crash = text.split("## Crash", 1)[1].split("##", 1)[0]
    assert f"- rank 1 (PID {snap.rank(1).pid}): exit code 1 — **first to die**" in crash
    assert "reason: CUDA device-side assert" in crash and f"message: `{MESSAGE}`" in crash
    log = text.split("### Log of culprit rank 1", 1)[1]
    body = log.split("```")[1].strip().splitlines()
    assert body[0] == "── error ──" and body[1] == "Traceback (most recent call last):"
    assert MESSAGE in body and "Connection closed by peer" not in log.split("── last output ──")[0]  # rank 0's


def with_log_tails(snap):
    """The ranks' tails as the live view reads them into the snapshot (the file is shared by all)."""
    logs = RankLogs()
    for rank in snap.ranks:
        logs.note_writer(rank.pid or -1, rank.log_path)
    return replace(snap, ranks=tuple(replace(r, log_tail=logs.shown_tail(r.log_path, r.rank, r.local_rank))
                                     for r in snap.ranks))


def test_detail_pane_shows_the_message_and_a_tail_that_leads_with_the_error():
    snap = with_log_tails(crashed_on_the_recorded_log())
    dead = snap.rank(1)
    text = detail_text(dead, NOW, False).plain
    assert "exited: exit code 1" in text and "reason: CUDA device-side assert" in text
    assert f"message: {MESSAGE}" in text and "died in: job/gpujob.py:60 main" in text
    log = text.split(f"log {ASSERT_LOG}", 1)[1].splitlines()
    assert log[1].strip() == "── error ──" and log[2].strip() == "Traceback (most recent call last):"
    # the file is shared: rank 0's traceback is its own, never shown as rank 1's error
    assert "Connection closed by peer" not in text.split("── last output ──")[0]
    zero = detail_text(snap.rank(0), NOW, False).plain
    assert "Connection closed by peer" in zero and MESSAGE not in zero.split("── last output ──")[0]


def test_a_rank_that_raised_but_lingers_reads_as_raised():
    base = straggler()
    rank = replace(base.ranks[3], phase="exiting", detail="main thread exited; kept alive by non-daemon thread 'w'",
                   exit=ExitInfo(at=NOW - 3, first=True, reason="RuntimeError", message="RuntimeError: boom"))
    text = detail_text(rank, NOW, False).plain
    assert "raised: an uncaught exception; the process is still alive, 3s ago  first rank to fail" in text
    assert "message: RuntimeError: boom" in text and "exited:" not in text
    assert state_label(rank) == "raised"
