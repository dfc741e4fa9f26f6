"""What a stuck rank waits for, named by mechanism, on real gloo jobs: rank 1 of two stops at step 3
in a child process, a FIFO, a socket to a local peer, a lock another thread holds, a C call holding
the GIL, or its DataLoader worker, while rank 0 waits in all_reduce. The verdict, the text table,
the detail pane, --json and summary.md all say the thing: its PID, command, path or peer."""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from real_jobs import PlantedJob, rank_stuck_at, wait_until
from watching import rank_pid

pytestmark = [pytest.mark.job, pytest.mark.slow]


@dataclass(frozen=True)
class Case:
    marker: str  # the culprit's line, as planted (its innermost frame in train.py once it is stuck)
    words: str  # a regex the verdict's summary must match; {peer} is the helper process's PID


CASES = {
    "child": Case('subprocess.run(["sleep"', r"rank 1 at train\.py:\d+ wait_for_child waits for its child process "
                                             r"PID {peer} `sleep \d+` \(running \d+ s\) while rank 0 waits in all_reduce"),
    "fifo": Case("with open(path) as fifo:", r"rank 1 at train\.py:\d+ read_fifo waits for data from FIFO "
                                             r"\S+/ready-\d+\.fifo \(\S+ on \S+\): no process has it open for writing"),
    "socket": Case("conn.recv(1)", r"rank 1 at train\.py:\d+ recv_from_peer waits for data on tcp 127\.0\.0\.1:\d+ -> "
                                   r"127\.0\.0\.1:\d+, whose other end PID {peer} `\S+ -c import socket, time; .*` "
                                   r"\(running \d+ s\) holds while rank 0"),
    "lock": Case("with lock:  # deadlock", r"rank 1 at train\.py:\d+ train waits for a lock, which one of thread "
                                           r"'metrics-writer' \(at train\.py:\d+ take_lock_in_thread.<locals>._hold\)"),
    "gil": Case("ctypes.PyDLL(None).sleep(", r"rank 1 at train\.py:\d+ hold_gil waits for a native call that holds "
                                             r"the GIL: sleep\(\) in libc\.so\.6 while rank 0"),
    "pool": Case("pool.map(read_shard", r"rank 1 at train\.py:\d+ map_shards waits for its pool worker PID {peer}, "
                                        r"in train\.py:\d+ read_shard, waiting for data from FIFO \S+/shard-{peer}\.fifo "
                                        r"\(\S+ on \S+\): no process has it open for writing while rank 0"),
    "event": Case("written.wait()", r"rank 1 at train\.py:\d+ save_checkpoint_async waits for an Event: thread "
                                     r"'checkpoint-writer' died of OSError: \[Errno 28\] No space left on device \(its "
                                     r"report in the log\), and no other thread in your code is left to set it"),
    "dataloader": Case("for batch in make_loader(", r"rank 1 at train\.py:\d+ train waits for its DataLoader worker "
                                                    r"PID {peer}, in train\.py:\d+ SlowDataset.__getitem__ while rank 0"),
}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Every case's job at once (they start together: importing torch is most of the wait), each
    gone at its deadline and killed in teardown."""
    root = tmp_path_factory.mktemp("waits")
    started = {name: PlantedJob(root / name, name, nproc=2, deadline=300).start() for name in CASES}
    try:
        for job in started.values():
            job.wait_for_ranks(timeout=120)
        yield started
    finally:
        for job in started.values():
            job.stop()


def helper_of(rank: int) -> int | None:
    """The process that could answer the culprit: its child (sleep, or the socket's peer), its
    DataLoader worker, or the pool worker that made the FIFO it is stuck on."""
    proc = psutil.Process(rank)
    kids = proc.children()
    stuck = [k.pid for k in kids if (Path(proc.cwd()) / f"shard-{k.pid}.fifo").exists()]
    return stuck[0] if stuck else kids[0].pid if kids else None


def judged(job: PlantedJob, scenario: str):
    """The job's snapshot once rank 1 is stuck where it was planted and named as the culprit."""
    from trainwatch.probes.live import LocalSource

    wait_until(lambda: rank_stuck_at(job.script, CASES[scenario].marker), 90, f"rank 1 blocked ({scenario})")
    source = LocalSource(job.pid, window=2.0, samples=3, gpu=False)
    try:
        snapshot = source.poll()
        for _ in range(10):
            if snapshot.verdict.kind == "straggler" and snapshot.rank(1).waits_for:
                break
            snapshot = source.poll()
        return snapshot
    finally:
        source.close()


@pytest.mark.parametrize("scenario", list(CASES))
def test_the_summary_names_what_the_rank_waits_for(jobs, scenario):
    from trainwatch.probes.evidence.summary import render
    from trainwatch.tui.render import render_table
    from trainwatch.tui.widgets.detail import detail_text

    job = jobs[scenario]
    snapshot = judged(job, scenario)
    culprit = snapshot.rank(1)
    peer = helper_of(rank_pid(job, 1))
    words = CASES[scenario].words.replace("{peer}", str(peer))
    assert snapshot.verdict.kind == "straggler" and snapshot.verdict.culprits == (1,), snapshot.verdict
    assert re.search(words, snapshot.verdict.summary), snapshot.verdict.summary
    what = culprit.waits_for
    assert what and what in snapshot.verdict.summary
    # every view says it: --json, the text table (at 80 columns), the detail pane, summary.md
    assert snapshot.to_dict()["ranks"][1]["waits_for"] == what
    console = Console(width=80, record=True, color_system=None, file=io.StringIO())
    console.print(render_table(snapshot))
    table = " ".join(console.export_text().split())
    assert f"▶ rank 1: {what}" in table, table
    assert f"waits for: {what}" in detail_text(culprit, snapshot.taken_at).plain
    summary = render(snapshot, [], [], reason=None, redacted=True, sources={})
    assert f"## What the ranks wait for\n\n- rank 1: {what}" in summary


def test_the_phases_say_the_mechanism(jobs):
    """The table's phase column too: a child is `subprocess`, a FIFO or socket `io`, a GIL holder
    `native` (the rank's own columns, where `unknown` and `sleep` stood before)."""
    phases = {}
    for scenario in ("child", "fifo", "socket", "gil"):
        rank = judged(jobs[scenario], scenario).rank(1)
        phases[scenario] = (rank.phase, rank.op)
    assert phases == {"child": ("subprocess", None), "fifo": ("io", "open"), "socket": ("io", "recv"),
                      "gil": ("native", "sleep()")}, phases


@pytest.mark.parametrize("how", ["capture_output=True", "timeout=90"])
def test_the_child_of_subprocess_run_is_named_however_it_is_waited_for(how):
    """`subprocess.run(..., capture_output=True)` waits in poll() on the child's pipes, and with a
    timeout in a loop of short sleeps: neither names the child to the kernel. Both read "a child
    process it started (which one was not read)", and the sleep loop's wake-ups read as progress."""
    import json
    import os
    import subprocess
    import sys

    code = f"import subprocess; subprocess.run(['sleep', '60'], {how})"
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}  # a rank of its own: no torch import
    rank = subprocess.Popen([sys.executable, "-c", code], env=env)
    child = None
    try:
        wait_until(lambda: any(c.name() == "sleep" for c in psutil.Process(rank.pid).children()), 30, "the child")
        child = next(c for c in psutil.Process(rank.pid).children() if c.name() == "sleep")
        out = subprocess.run([sys.executable, "-m", "trainwatch.tui.cli", "snapshot", "--json", str(rank.pid)],
                             capture_output=True, text=True, timeout=90)
        assert out.returncode == 0, out.stderr
        data = json.loads(out.stdout)
        (only,) = data["ranks"]
        assert only["state"] == "stuck" and only["phase"] == "subprocess", data["verdict"]
        assert only["waits_for"].startswith(f"its child process PID {child.pid} `sleep 60`"), only["waits_for"]
        assert f"PID {child.pid} `sleep 60`" in data["verdict"]["summary"], data["verdict"]
    finally:
        rank.kill()
        rank.wait()
        if child is not None:
            child.kill()
