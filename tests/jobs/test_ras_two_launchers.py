"""Only NCCL RAS can name a culprit on another node: a real gloo job split over two torchrun
launchers ("nodes") on this machine, ranks 0-1 on node 0 and the late rank 2 on node 1, with
NCCL's own text reply (NCCL < 2.28.7 has no JSON; the text names only the outlier, rank 2, on
the other node) served in front of it at the address the ranks name (NCCL_RAS_ADDR).

trainwatch is pointed at node 0's launcher, as a user on node 0 would: its stacks show ranks 0
and 1 waiting in all_reduce and nobody local to blame; RAS names rank 2 with its PID and node.
"""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ras_server import RasServer
from real_jobs import default_signals
from sshd import TwoNodeJob

pytestmark = [pytest.mark.job, pytest.mark.slow]
TRAINWATCH = [sys.executable, "-m", "trainwatch.tui.cli"]
RECORDED = Path(__file__).parents[2].parent / "shared" / "recordings" / "ras-formatter" / "behind.text.v1"


@pytest.fixture(scope="module")
def split_job(tmp_path_factory):
    """(job, server, rank 2's PID): rank 2 (node 1) sleeps at step 3; ranks 0-1 (node 0) wait for it."""
    if not RECORDED.exists():
        pytest.skip(f"no NCCL formatter reply at {RECORDED}")
    with RasServer([{"text": "", "json": ""}], json_supported=False, threaded=True) as server:
        job = TwoNodeJob(tmp_path_factory.mktemp("split"), "straggler", nprocs=(2, 1), deadline=120,
                         extra_env={"NCCL_RAS_ADDR": f"127.0.0.1:{server.port}"}).start()
        try:
            job.wait_for_ranks()
            found = re.search(r"rank 2/3 pid (\d+)", job.logs[1].read_text())
            assert found, job.logs[1].read_text()
            culprit = int(found.group(1))
            # NCCL's own bytes, with the real PID of the late rank; its node stays 10.0.0.2 (another node).
            server.reports = [{"text": RECORDED.read_text().replace("2003", str(culprit)), "json": ""}]
            time.sleep(2.0)  # past step 3: rank 2 sleeps, ranks 0-1 wait in all_reduce
            yield job, server, culprit
        finally:
            job.stop()


def test_snapshot_names_the_rank_on_the_other_node(split_job):
    job, _, culprit = split_job
    proc = subprocess.run([*TRAINWATCH, "snapshot", str(job.pids[0]), "--json"], capture_output=True, text=True,
                          timeout=90)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    data = json.loads(proc.stdout)
    assert sorted(r["rank"] for r in data["ranks"]) == [0, 1]  # node 0's ranks only
    ras = data["collectives"]["ras"]
    assert ras["format"] == "text" and ras["kind"] == "behind" and ras["culprits"] == [2], ras
    assert f"rank 2 (10.0.0.2, pid {culprit}) is 1 collective behind" in ras["finding"]
    verdict = data["verdict"]
    assert verdict["kind"] == "straggler" and verdict["culprits"] == [2], verdict
    assert verdict["summary"].startswith(f"rank 2 (10.0.0.2, pid {culprit}) is 1 collective behind"), verdict
    assert "(NCCL RAS); local ranks 0-1 wait in all_reduce" in verdict["summary"], verdict
    assert any("taken as this job's" in n for n in data["notes"]), data["notes"]  # why a remote-only report is ours
    assert not any("another job" in n for n in data["notes"]), data["notes"]


# file stem -> (the verdict, what RAS's finding says of rank 2); NCCL 2.27.7 text for each (see at_2_27_7).
# A rank RAS names (behind, unreachable, dead, in error, aborted) holds the others up: a straggler;
# a `hang` names no rank (docs/how-trainwatch-decides.md).
SCENARIOS_2_27_7 = {"behind": ("straggler", "is 1 collective behind"),
                    "mismatch": ("mismatch", "launched AllGather #4 where the 2 others launched AllReduce #101"),
                    "notstarted": ("straggler", "has not launched any collective"),
                    "unreachable": ("straggler", "is unreachable by NCCL RAS"),
                    "dead": ("straggler", "is considered dead by NCCL RAS"),
                    "nocomm": ("mismatch", "no longer has the communicator"),
                    "asyncerror": ("straggler", "reports an NCCL asynchronous error"),
                    "abort": ("straggler", "aborted its communicator")}


def at_2_27_7(raw: str) -> str:
    """NCCL 2.27.7's text: client_support.cc differs from 2.29.7's, for these sections, only in the
    version line and the timings' precision (%.2fs)."""
    raw = re.sub(r"NCCL version 2\.\d+\.\d+", "NCCL version 2.27.7", raw)
    return re.sub(r"\((\d+\.\d\d)\ds\)", r"(\1s)", raw)


def test_snapshot_judges_nccl_2_27_7s_text_for_every_scenario(split_job):
    """Each of NCCL's text replies for a rank behind, missing or in error, as 2.27.7 words them, read
    by one `snapshot` (one RAS reply, or two when a rank was unreachable), names rank 2 on the other node."""
    job, server, culprit = split_job
    wrong = {}
    for stem, (kind, words) in SCENARIOS_2_27_7.items():
        raw = (RECORDED.parent / f"{stem}.text.v1").read_text().replace("2003", str(culprit))
        server.reports = [{"text": at_2_27_7(raw), "json": ""}]
        proc = subprocess.run([*TRAINWATCH, "snapshot", str(job.pids[0]), "--json"], capture_output=True, text=True,
                              timeout=90)
        assert proc.returncode == 0, proc.stderr
        data = json.loads(proc.stdout)
        verdict, ras = data["verdict"], (data["collectives"] or {}).get("ras") or {}
        if (verdict["kind"], verdict["culprits"]) != (kind, [2]) or words not in verdict["summary"] \
                or ras.get("nccl_version") != "2.27.7":
            wrong[stem] = (verdict, ras.get("nccl_version"))
        time.sleep(ras_lock_gap())
    server.reports = [{"text": RECORDED.read_text().replace("2003", str(culprit)), "json": ""}]
    assert not wrong, wrong


def ras_lock_gap() -> float:
    from trainwatch.probes.read.collectives.ras import MIN_GAP_S
    return MIN_GAP_S


def test_watch_names_it_and_a_stalled_server_never_turns_it_healthy(split_job):
    """watch sees the straggler; then NCCL's server stops after its header (as it does while its own
    collective waits for a rank): those partial replies are notes, never progress, never healthy."""
    job, server, _ = split_job
    watch = subprocess.Popen([*TRAINWATCH, "watch", str(job.pids[0]), "--json", "--interval", "1",
                              "--out", str(job.workdir / "watch")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in watch.stdout], daemon=True).start()

    def events_for(seconds: float, until=lambda event: False) -> list[dict]:
        out, end = [], time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                out.append(json.loads(lines.get(timeout=0.5)))
            except queue.Empty:
                continue
            if until(out[-1]):
                break
        return out

    try:
        before = events_for(60, lambda e: e["event"] == "verdict" and e["verdict"] == "straggler")
        assert before and before[-1]["event"] == "verdict" and before[-1]["culprits"] == [2], before
        server.stop_after_head = server.head_first = True
        queries = server.queries
        after = events_for(20)
        assert server.queries > queries  # it went on asking, one at a time
    finally:
        watch.send_signal(signal.SIGINT)
        try:
            watch.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            watch.kill()
        server.stop_after_head = server.head_first = False
    assert server.max_active == 1
    verdicts = [e["verdict"] for e in after if e["event"] == "verdict"]
    assert not verdicts or set(verdicts) == {"straggler"}, after  # the culprit is kept; never healthy
