"""A one-shot command (snapshot, dump) over other nodes: a node whose first answer had not judged
its ranks yet (its agent started late, behind a slow `kubectl exec` on a loaded node, and looked too
briefly to tell stuck from running) is judged by its next answer, not reported as unreadable.

The agents are stand-ins speaking the wire (real processes), so StreamSource's launches, reader and
first poll run as they do for real."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

from trainwatch.probes.remote.launches import Launch, popen_agent
from trainwatch.probes.remote.reach import SshRemote
from trainwatch.probes.remote.streams import StreamSource
from trainwatch.probes.remote.wire import encode_line
from trainwatch.probes.snapshot import Frame, Job, Rank, Snapshot, ThreadStack, Verdict

AGENT = textwrap.dedent("""\
    import json, sys, time
    first, second, pause = sys.argv[1:4]
    print(open(first).read().strip(), flush=True)
    time.sleep(float(pause))
    if second != "-":
        print(open(second).read().strip(), flush=True)
    sys.stdin.read()  # until the viewer closes it
    """)


def answer(host: str, state: str, window: float) -> str:
    job = Job(launcher="torchrun", pid=10, host=host, world_size=2, master_addr="a", master_port=1)
    threads = (ThreadStack("MainThread", 7, (Frame("sleep", "/w/train.py", 9),), is_main=True),)
    ranks = (Rank(rank=1, pid=101, host=host, state=state, phase="sleep", op="sleep", where="train.py:9 train",
                  threads=threads),)
    return encode_line(Snapshot(job=job, ranks=ranks, verdict=Verdict("unknown", (), ""), taken_at=1.0,
                                window_s=window), host, seq=1)


def source(tmp_path: Path, second: str | None, pause: float, timeout: float = 20.0) -> StreamSource:
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    (tmp_path / "first").write_text(answer("n1", "unknown", 0.4))
    if second:
        (tmp_path / "second").write_text(second)

    def spawn(launch: Launch):
        return popen_agent(Launch([sys.executable, str(script), str(tmp_path / "first"),
                                   str(tmp_path / "second") if second else "-", str(pause)],
                                  launch.names, launch.remote))

    return StreamSource(None, [SshRemote("n1")], match=["--match", "a:1"], interval=1.0, window=1.0,
                        timeout=timeout, once=True, spawn=spawn, world_size=2)


def test_a_node_that_answered_before_judging_is_judged_by_its_next_answer(tmp_path):
    src = source(tmp_path, answer("n1", "stuck", 2.0), pause=1.0)
    try:
        snap = src.poll()
    finally:
        src.close()
    rank = snap.rank(1)
    assert rank.state == "stuck", rank  # not "unknown", read as "could not be read"
    assert "could not be read" not in snap.verdict.summary, snap.verdict


def test_a_node_that_never_judges_is_waited_for_no_longer_than_the_first_answers(tmp_path):
    started = time.monotonic()
    src = source(tmp_path, None, pause=0.0, timeout=3.0)
    try:
        snap = src.poll()
    finally:
        src.close()
    assert snap.rank(1).state == "unknown"
    assert time.monotonic() - started < 1.0 + 3.0 + 2.0  # window + timeout, and the start of the agent
