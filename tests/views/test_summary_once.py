"""summary.md says what holds for the whole job once, and per rank only where a rank differs."""

from __future__ import annotations

from pathlib import Path

from trainwatch.probes.evidence import summary
from trainwatch.probes.evidence.bundle_rank import FAULTHANDLER_NOT_ARMED, RankEvidence
from trainwatch.probes.evidence.summary import render
from trainwatch.probes.snapshot import ExitInfo, Rank
from trainwatch.probes.wording import how_ended
from trainwatch.tui.widgets.lines import state_label

from tui_samples import straggler

SHARED = "Flight Recorder from the hook: no hook in this process (start the job with `trainwatch run`)"


def evidence_for(snapshot, faults=None) -> list[RankEvidence]:
    out = []
    for rank in snapshot.ranks:
        ev = RankEvidence(rank=rank.rank, pid=rank.pid, faulthandler=(faults or {}).get(rank.rank, FAULTHANDLER_NOT_ARMED))
        ev.note(SHARED)
        ev.note("environment unreadable (/proc/PID/environ)") if rank.rank == 2 else None
        out.append(ev)
    return out


def test_job_wide_facts_are_said_once():
    snap = straggler()
    text = render(snap, evidence_for(snap), [], reason=None, redacted=True, sources={})
    assert text.count(FAULTHANDLER_NOT_ARMED) == 1 and f"faulthandler, every rank: {FAULTHANDLER_NOT_ARMED}" in text
    assert text.count(SHARED) == 1 and f"- {SHARED} (every rank)" in text
    assert "- rank 2: environment unreadable (/proc/PID/environ)" in text
    table = text.split("## Ranks", 1)[1].split("##", 1)[0]
    assert "faulthandler |" not in table  # no column repeating one value


def test_a_rank_that_differs_is_named():
    snap = straggler()
    text = render(snap, evidence_for(snap, {3: "collected"}), [], reason=None, redacted=True, sources={})
    assert text.count(FAULTHANDLER_NOT_ARMED) == 1 and "faulthandler, other ranks:" in text
    row = next(line for line in text.splitlines() if line.startswith("| 3 |"))
    assert row.endswith("| collected |")


def test_one_na_and_one_way_to_say_how_a_rank_ended():
    source = Path(summary.__file__).read_text()
    assert "'n/a'" not in source and '"n/a"' not in source
    dead = Rank(rank=1, pid=9, state="exited", exit=ExitInfo(signal="SIGSEGV"))
    assert state_label(dead) == summary.state_word(dead) == how_ended(dead.exit, short=True) == "SIGSEGV"
    assert how_ended(ExitInfo(code=1)) == "exit code 1" and how_ended(ExitInfo()) == "exit status not seen"
