"""Streaming node agents with real processes: they stop with their viewer, die and come back,
and one SLURM step's labelled lines reach the right nodes (a stand-in ``srun``; the real SLURM
tests live with the cluster set-up)."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from real_jobs import PlantedJob

from trainwatch.probes.remote.reach import SlurmRemote
from trainwatch.probes.remote.streams import StreamSource
from trainwatch.probes.remote.wire import decode_line, encode_line
from trainwatch.probes.snapshot import Frame, Job, Rank, Snapshot, ThreadStack

CLI = [sys.executable, "-m", "trainwatch.tui.cli"]
NO_JOB = ["agent", "--match", "192.0.2.1:9", "--interval", "0.3"]  # nobody's job: the agent keeps saying so


def wait_until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_agent_says_hello_reports_no_job_and_stops_when_stdin_closes():
    proc = subprocess.Popen([*CLI, *NO_JOB], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        hello = json.loads(proc.stdout.readline())
        assert hello["hello"] is True and hello["kind"] == "trainwatch-node"
        answer = decode_line(proc.stdout.readline())
        assert answer.snapshot is None and answer.code == 4 and "no job with master 192.0.2.1:9" in answer.error
        proc.stdin.close()
        assert proc.wait(timeout=15) == 0
    finally:
        proc.kill()
        proc.wait()


def test_agent_stops_when_its_parent_dies_though_stdin_stays_open(tmp_path):
    agent = " ".join([*CLI, *NO_JOB])
    # fd 3: a background job's own stdin is /dev/null before any redirection (POSIX)
    parent = subprocess.Popen(["sh", "-c", f"exec 3<&0; {agent} <&3 >{tmp_path}/out & echo $!; wait"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    try:
        pid = int(parent.stdout.readline())
        wait_until(lambda: (tmp_path / "out").exists() and (tmp_path / "out").read_text().count("\n") >= 2,
                   30, "the agent's first lines")
        parent.kill()  # our end of its stdin stays open: only the parent's death can stop it
        parent.wait()
        wait_until(lambda: gone(pid), 15, "the orphaned agent to exit")
    finally:
        parent.stdin.close()
        with_group_killed(parent.pid)


def with_group_killed(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@dataclass(frozen=True)
class ScriptRemote:
    """A 'node' reached by running a local shell script (the transport is not what is tested here)."""

    name: str
    script: str

    def argv(self, trainwatch, args):
        return ["sh", "-c", self.script, "sh", *args]


@pytest.fixture(scope="module")
def straggler(tmp_path_factory):
    """A 2-rank straggler job for the tests that only read it through agents."""
    with PlantedJob(tmp_path_factory.mktemp("straggler"), "straggler", nproc=2, deadline=240) as job:
        job.wait_for_ranks()
        yield job


def test_a_dead_agent_is_named_then_started_again(straggler, tmp_path):
    job = straggler
    flag = tmp_path / "died-once"
    # The first start dies at once (as a lost connection would); the second runs the real agent.
    script = (f'if [ ! -e {flag} ]; then touch {flag}; echo "trainwatch: lost it" >&2; exit 5; fi; '
              f'shift 3; exec {" ".join(CLI)} agent {job.proc.pid} "$@"')  # drops --match x:1
    source = StreamSource(None, [ScriptRemote("node-b", script)], match=["--match", "x:1"], interval=0.5,
                          window=0.5, timeout=30)
    try:
        first = source.poll()  # no local source and no answer yet: an error naming the node
    except Exception as exc:  # noqa: BLE001
        first = exc
    try:
        assert "node-b: agent stopped: permission denied (lost it)" in str(first)
        merged = wait_until(lambda: _poll_with_ranks(source), 60, "the restarted agent's answer")
        assert {r.rank for r in merged.ranks} == {0, 1} and {r.host for r in merged.ranks} == {socket.gethostname()}
        assert merged.verdict.kind == "straggler" and merged.verdict.culprits == (1,), merged.verdict
        assert not any(h.error for h in merged.hosts)
        culprit = merged.rank(1)
        assert len(culprit.threads) >= 1 and culprit.threads[0].frames  # full stacks for the culprit
    finally:
        source.close()
    assert not [p for p in psutil.process_iter(["cmdline"]) if "agent" in (p.info["cmdline"] or [])
                and str(job.proc.pid) in (p.info["cmdline"] or [])]


def test_an_agent_started_late_answers_with_the_others_when_the_first_answers_are_called_for(straggler):
    # An agent reached late (a relay's hop, a slow node) is still in its first window when the
    # viewer calls for the first answers, a window + FIRST_CALL_S after launching: it answers once
    # half of its window was watched, not a whole window later, and the viewer says so.
    job = straggler
    script = f'sleep 1.5; shift 3; exec {" ".join(CLI)} agent {job.proc.pid} "$@"'  # drops --match x:1
    source = StreamSource(None, [ScriptRemote("node-late", script)], match=["--match", "x:1"], interval=1,
                          window=2, timeout=60)
    try:
        merged = source.poll()
        looked = source.nodes["node-late"].answer.snapshot.window_s
    finally:
        source.close()
    assert 1.0 <= looked < 1.8, looked  # MIN_FIRST_LOOK of the 2 s window, then the call's last round
    assert merged.verdict.kind == "straggler" and merged.verdict.culprits == (1,), merged.verdict
    assert any(n.startswith("first answers called for 3s after the agents were started: 1 node(s) that started late "
                            "had watched 1.") and n.endswith("of the 2s window") for n in merged.notes), merged.notes


def _poll_with_ranks(source):
    try:
        snap = source.poll()
    except Exception:  # noqa: BLE001
        return None
    return snap if snap.ranks and snap.verdict.kind == "straggler" else None


def node_line(node: str, ranks: list[int], phase: str, world: int) -> str:
    frames = (Frame("compute_step" if phase == "compute" else "sync", "/w/train.py", 9 if phase == "compute" else 40),
              *(Frame(f"layer{i}", "/w/.venv/lib/python3.11/site-packages/torch/nn/modules/module.py", 1500 + i)
                for i in range(30)))
    snap = Snapshot(
        job=Job(launcher="torchrun", pid=1, host=node, world_size=world, master_addr="a", master_port=1),
        ranks=tuple(Rank(rank=n, pid=100 + n, host=node, state="stuck", phase=phase,
                         op="allreduce" if phase == "collective" else None, stuck_for_s=9.0,
                         where="train.py:9 compute_step" if phase == "compute" else "train.py:40 sync",
                         threads=(ThreadStack("MainThread", 1, frames, is_main=True),)) for n in ranks),
        taken_at=time.time(), window_s=1.0)
    return encode_line(snap, node)


def stand_in_srun(bindir: Path, lines: dict[str, str]) -> None:
    """A srun that runs one 'task' per --nodelist node, labels each line with the task number, says
    on stderr that one task failed, and stays up. Its tasks 0 and 1 run on n2 and n1 (SLURM orders
    nodes its own way): the agents' own node names must win over the task order."""
    for node, line in lines.items():
        (bindir / f"{node}.line").write_text(line + "\n")
    srun = bindir / "srun"
    srun.write_text(f"""#!/bin/sh
echo "$@" > {bindir}/srun.args
nodes=$(for a; do case "$a" in --nodelist=*) echo "${{a#--nodelist=}}" | tr ',' '\\n' | sed 's/^n1$/X/; s/^n2$/n1/; s/^X$/n2/' ;; esac; done)
i=0
for n in $nodes; do
  # like srun: each line forwarded in labelled pieces of at most 1,024 bytes
  if [ -e {bindir}/$n.line ]; then fold -b -w 1024 {bindir}/$n.line | sed "s/^/$i: /"; fi
  if [ "$n" = n3 ]; then echo "srun: error: n3: task $i: Exited with exit code 127" >&2; fi
  i=$((i+1))
done
exec sleep 60
""")
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)


def test_one_srun_step_for_all_nodes_and_lines_routed_to_their_nodes(tmp_path):
    assert len(node_line("n1", [0, 1], "collective", 8)) > 2048  # cut into pieces by the stand-in srun
    stand_in_srun(tmp_path, {"n1": node_line("n1", [0, 1], "collective", 8),
                             "n2": node_line("n2", [2, 3], "compute", 8),
                             "n4": node_line("n4.cluster", [6, 7], "collective", 8)})
    srun = str(tmp_path / "srun")
    remotes = [SlurmRemote(n, "77", srun=srun) for n in ("n1", "n2", "n3", "n4", "n5")]
    source = StreamSource(None, remotes, match=["--match", "a:1"], interval=1, window=1, timeout=3,
                          extra_args=["--stuck-after", "30"])
    try:
        merged = source.poll()
    finally:
        source.close()
    args = (tmp_path / "srun.args").read_text().split()
    assert args[:10] == ["--overlap", "--jobid=77", "--nodes=5", "--ntasks=5", "--ntasks-per-node=1",
                         "--nodelist=n1,n2,n3,n4,n5", "--label", "--input=all", "--kill-on-bad-exit=0", "--quiet"]
    assert args[10:] == ["trainwatch", "agent", "--match", "a:1", "--interval", "1", "--window", "1",
                         "--stuck-after", "30"]
    hosts = {r.rank: r.host for r in merged.ranks if r.state != "unknown"}
    # n4's agent calls itself n4.cluster, a name we do not know: its task number decides (its
    # ranks keep the name their node gave them).
    assert hosts == {0: "n1", 1: "n1", 2: "n2", 3: "n2", 6: "n4.cluster", 7: "n4.cluster"}
    errors = {h.name: h.error for h in merged.hosts if h.error}
    assert set(errors) == {"n3", "n5"}
    assert errors["n3"] == "Exited with exit code 127"
    assert errors["n5"] == "timeout: no answer in 3s"
    assert merged.verdict.culprits == (2, 3) and merged.verdict.summary.endswith("nodes not read: n3, n5")
    assert [r.rank for r in merged.ranks if r.state == "unknown"] == [4, 5]


def test_requests_on_stdin_choose_full_stacks_and_native_ranks_and_eof_stops():
    import io
    import threading

    from trainwatch.probes.remote.node_agent import Requests

    stop = threading.Event()
    requests = Requests(stop)
    requests.read(io.BytesIO(b'{"full": [3, 7], "native": [7]}\nnot json\n{"full": [1, true, "x"]}\n'))
    assert requests.full == frozenset({1}) and requests.native == frozenset({7}) and not requests.full_all
    assert stop.is_set()  # the stream ended: the viewer is gone
    requests.read(io.BytesIO(b'{"full": "all", "native": []}\n{"native": [2]}\n'))  # one-shot snapshots
    assert requests.full_all and requests.native == frozenset({2})
    requests.changed.clear()
    requests.read(io.BytesIO(b'{"answer": "first"}\n'))  # the viewer calls for the first answers
    assert requests.answer_now.is_set() and not requests.changed.is_set()  # it ends a window, starts no poll
    assert requests.full_all and requests.native == frozenset({2})


def test_agent_leaves_cleanly_on_sigterm_while_its_stdin_is_still_open():
    """srun and kill(1) stop agents with SIGTERM; its exit must be clean (not an abort at shutdown)."""
    proc = subprocess.Popen([*CLI, *NO_JOB], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert json.loads(proc.stdout.readline())["hello"] is True
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, proc.stderr.read()
    finally:
        proc.stdin.close()
        proc.kill()
        proc.wait()
