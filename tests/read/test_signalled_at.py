"""When a signal reached an armed job's ranks, from what their hooks left (``last_words.signalled_at``):
the moment a stop began, before which `watch`'s last poll tells what the job was doing."""

from __future__ import annotations

import json
import os

from trainwatch.probes import rundir
from trainwatch.probes.read.collectives.last_words import signalled_at


def test_the_faulthandler_trace_and_the_hook_s_words_each_say_when_the_earliest_counts(tmp_path):
    for rank in (0, 1):
        rundir.rank_dir(tmp_path, rank).mkdir(parents=True)
        rundir.last_words_log(tmp_path, rank).touch()  # opened empty when the hook armed the rank
    assert signalled_at(tmp_path, [0, 1]) is None  # armed, never signalled
    log = rundir.last_words_log(tmp_path, 1)
    log.write_text("Fatal Python error: ... (faulthandler's trace at SIGTERM)\n")
    os.utime(log, (1000.0, 1000.0))
    # The hook's words begin later (a thread the signal woke writes them; later still under load).
    rundir.last_words_file(tmp_path, 0).write_text(json.dumps({"trigger": "SIGTERM", "at": 1002.5}))
    assert signalled_at(tmp_path, [0, 1]) == 1000.0
    assert signalled_at(tmp_path, [0]) == 1002.5
    assert signalled_at(tmp_path, [0, 1], since=1001.0) == 1002.5  # an earlier attempt's trace is not this one's
    rundir.last_words_file(tmp_path, 0).write_text(json.dumps({"trigger": "exception", "at": 999.0}))
    assert signalled_at(tmp_path, [0]) is None  # an exception is no signal from outside
