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
