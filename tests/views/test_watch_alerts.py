"""watch's events: a problem that persisted is one `problem` alert, with the verdict's words."""

from __future__ import annotations

import os
import time
from dataclasses import replace

from trainwatch.probes import Watcher, WatchEvent
from trainwatch.tui.commands.event_command import event_env, event_record

from tui_samples import ListSource, straggler


def test_a_persisting_problem_is_one_alert(tmp_path):
    snap = straggler()
    snap = replace(snap, verdict=replace(snap.verdict, since=time.time() - 5))
    events: list[WatchEvent] = []
    lines: list[str] = []
    watcher = Watcher(os.getpid(), tmp_path, dump_on=frozenset(), hang_after=1.0, emit=lines.append,
                      source=ListSource(snap), on_event=events.append)
    for _ in range(3):
        watcher._poll()
    alerts = [e for e in events if e.alert]
    assert [e.kind for e in events] == ["verdict", "problem"] and len(alerts) == 1
    alert = alerts[0]
    assert alert.verdict == "straggler" and alert.culprits == (3,) and alert.bundle is None
    assert lines == [line for line in lines if "verdict straggler" in line]  # alerts add no text line
    record = event_record(alert, 4242, "node1")
    assert list(record)[:4] == ["event", "time", "unix_time", "pid"] and record["culprits"] == [3]
    env = event_env(alert, 4242, "node1")
    assert env["TRAINWATCH_EVENT"] == "problem" and env["TRAINWATCH_CULPRITS"] == "3"
    assert env["TRAINWATCH_BUNDLE"] == "" and env["TRAINWATCH_SUMMARY"] == snap.verdict.summary


def test_each_event_is_one_line_whatever_its_words_hold(tmp_path):
    """A verdict whose words carry a newline and an escape sequence (a peer's command line, a log
    line) is still one line in watch's output, and inert in the reader's terminal."""
    snap = straggler()
    snap = replace(snap, verdict=replace(snap.verdict, summary="rank 1 runs `python -c 'a\nb'` \x1b[2J\tthere"))
    lines: list[str] = []
    Watcher(os.getpid(), tmp_path, dump_on=frozenset(), hang_after=600.0, emit=lines.append,
            source=ListSource(snap))._poll()
    (line,) = lines
    assert line.endswith("rank 1 runs `python -c 'a\\nb'` \\x1b[2J\\tthere"), line
    assert all(ch.isprintable() for ch in line), line


def test_one_line_keeps_what_prints():
    from trainwatch.probes.wording import one_line
    assert one_line("rank 3 · stuck ≥1m2s — 東京\x7f\x9b") == "rank 3 · stuck ≥1m2s — 東京\\x7f\\x9b"
