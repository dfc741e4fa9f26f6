"""End to end through a real SLURM (tests/infra/slurm_up.sh): a 2-node sbatch job, read with srun --overlap.

The job is a real gloo world of two ranks, one per node (tw1, tw2), launched by torchrun under
``sbatch``/``srun``; the planted straggler, rank 1, runs on tw2. trainwatch runs on tw1 (in its
namespaces: it sees only tw1's rank) and must reach tw2 through ``srun --overlap`` inside the
job's allocation, name rank 1, and leave the job as it was: same ranks, no step left behind.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from real_jobs import PLANTED, default_signals, free_port, rank_stuck_at, wait_until

pytestmark = [pytest.mark.job, pytest.mark.slow]

TRAINWATCH_PROC = r"trainwatch(\.tui\.cli| snapshot| watch| attach| agent)"  # a trainwatch process, here or remote
RANKS = r"python\S* -u \S*train\.py --scenario"  # the ranks, not torchrun (whose command line names train.py too)
TRAINWATCH = str(Path(sys.executable).parent / "trainwatch")
# On the nodes (srun passes the caller's environment), trainwatch is found on PATH like any tool.
NODE_ENV = f"PATH={Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class SlurmJob:
    NAME = "tw-straggler"

    def __init__(self, cluster, workdir: Path, deadline: float = 150.0) -> None:
        self.cluster, self.workdir = cluster, workdir
        shutil.copy(PLANTED, workdir / "train.py")
        self.log = workdir / "job.log"
        launch = (f"exec env OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 {shlex.quote(sys.executable)} -m "
                  f"torch.distributed.run --nnodes=2 --node-rank=$SLURM_NODEID --master-addr 127.0.0.1 "
                  f"--master-port {free_port()} --nproc-per-node 1 {workdir / 'train.py'} "
                  f"--scenario straggler --deadline {deadline:g}")
        self.script = workdir / "job.sh"
        self.script.write_text(textwrap.dedent(f"""\
            #!/bin/sh
            #SBATCH --nodes=2 --ntasks-per-node=1 --time=4 --job-name={self.NAME} --output={self.log}
            exec srun --kill-on-bad-exit=1 sh -c {shlex.quote(launch)}
            """))
        self.id = ""

    def submit(self) -> "SlurmJob":
        done = subprocess.run(["sbatch", "--parsable", str(self.script)], capture_output=True, text=True,
                              timeout=30, check=True, cwd=self.workdir)
        self.id = done.stdout.strip().split(";")[0]
        return self

    def wait_for_straggler(self, timeout: float = 60.0) -> None:
        """Both ranks started, and the culprit is past step 3 (where it sleeps)."""
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.log.read_text(errors="replace") if self.log.exists() else ""
            if text.count("scenario straggler") >= 2 and self.rank_pids()["tw2"]:
                wait_until(lambda: rank_stuck_at(self.workdir / "train.py", "# stuck in its own work"),
                           max(1.0, deadline - time.monotonic()), "rank 1 to reach its planted sleep")
                return
            state = self.cluster.job_state(self.id)
            assert state in ("PENDING", "CONFIGURING", "RUNNING"), f"job {self.id} is {state}:\n{text[-3000:]}"
            time.sleep(0.3)
        raise TimeoutError(f"job {self.id} did not start its ranks in {timeout:g}s:\n{text[-3000:]}")

    def rank_pids(self) -> dict[str, list[int]]:
        """Each node's rank processes, in the node's own PID numbering."""
        return {n: self.cluster.pids_on_node(n, RANKS) for n in self.cluster.NODES}

    def launcher_pid(self, node: str) -> int:
        (pid,) = self.cluster.pids_on_node(node, r"^\S*python\S* -m torch.distributed.run")
        return pid


@pytest.fixture(scope="module")
def job(slurm_cluster, tmp_path_factory):
    # One job of ours per node, or --slurm auto would rightly refuse to guess: end any an aborted run left.
    subprocess.run(["scancel", f"--name={SlurmJob.NAME}"], capture_output=True, timeout=20, check=False)
    started = SlurmJob(slurm_cluster, tmp_path_factory.mktemp("slurm")).submit()
    try:
        started.wait_for_straggler()
        yield started
    finally:
        slurm_cluster.cancel(started.id)


@pytest.fixture
def untouched(job, slurm_cluster):
    """After the test: the job still runs, with the same rank PIDs and no job step of trainwatch's."""
    before = job.rank_pids()
    steps = slurm_cluster.job_steps(job.id)
    assert steps == sorted([f"{job.id}.0", f"{job.id}.batch"]), steps
    yield

    def left_behind() -> dict:
        return {"steps": slurm_cluster.job_steps(job.id),
                "trainwatch": {n: slurm_cluster.pids_on_node(n, TRAINWATCH_PROC) for n in slurm_cluster.NODES}}

    clean = {"steps": steps, "trainwatch": {n: [] for n in slurm_cluster.NODES}}
    deadline = time.monotonic() + 15  # trainwatch's srun steps end as it exits; slurmctld may lag a moment
    while time.monotonic() < deadline and left_behind() != clean:
        time.sleep(0.3)
    assert left_behind() == clean
    assert slurm_cluster.job_state(job.id) == "RUNNING"
    assert job.rank_pids() == before


def on_tw1(cluster, argv: list[str]) -> list[str]:
    return cluster.on_node("tw1", ["env", NODE_ENV, *argv])


def test_snapshot_slurm_auto_names_the_straggler_on_the_other_node(job, slurm_cluster, untouched):
    # No PID: on a node of the job, --slurm auto finds it by squeue, the ranks here by SLURM_JOB_ID.
    cmd = on_tw1(slurm_cluster, [TRAINWATCH, "snapshot", "--slurm", "auto", "--json", "--window", "1",
                                 "--remote-timeout", "40"])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["source"] == "remote"
    assert {r["rank"]: r["host"] for r in data["ranks"]} == {0: "tw1", 1: "tw2"}
    assert [h["name"] for h in data["hosts"] if h["error"]] == []
    assert data["verdict"]["kind"] == "straggler", data["verdict"]
    assert data["verdict"]["culprits"] == [1], data["verdict"]
    culprit = next(r for r in data["ranks"] if r["rank"] == 1)
    assert culprit["state"] == "stuck" and "train.py" in culprit["where"], culprit
    assert not any("only this node" in w for w in data["warnings"]), data["warnings"]


def test_watch_bundles_the_straggler_read_through_srun(job, slurm_cluster, untouched, tmp_path):
    out = tmp_path / "watch"
    cmd = on_tw1(slurm_cluster, [TRAINWATCH, "watch", str(job.launcher_pid("tw1")), "--slurm", "auto",
                                 "--hang-after", "4", "--interval", "1", "--out", str(out)])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=default_signals)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip())
            if " note: tw2: bundle " in line or " note: tw2: no bundle" in line:
                break
        assert any(" bundle " in line for line in lines), "\n".join(lines)
    finally:
        _interrupt(proc)
    (bundle,) = [p for p in out.iterdir() if p.is_dir()]
    snap = json.loads((bundle / "snapshot.json").read_text())
    assert snap["verdict"]["kind"] == "straggler" and snap["verdict"]["culprits"] == [1], snap["verdict"]
    assert {r["rank"]: (r["host"], r["state"]) for r in snap["ranks"]}[1] == ("tw2", "stuck")
    # tw2's own evidence, fetched through srun: the culprit's stack, where it sleeps.
    assert any(line.endswith("note: tw2: bundle in hosts/tw2/") for line in lines), lines
    assert "train.py" in (bundle / "hosts" / "tw2" / "ranks" / "1" / "stacks.txt").read_text()
    assert any(" verdict straggler: " in line for line in lines), lines


def _interrupt(proc: subprocess.Popen) -> None:
    """Ctrl-C for trainwatch (it ends its srun steps), KILL if it lingers."""
    for sig, grace in ((signal.SIGINT, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=grace)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture
def tmux():
    from test_tmux_attach import Tmux
    server = Tmux()
    yield server
    server.kill()


def test_attach_shows_the_straggler_on_the_other_node_and_quits_cleanly(job, slurm_cluster, untouched, tmux):
    if shutil.which("tmux") is None:
        pytest.fail("CI: tmux is required") if slurm_cluster.in_ci() else pytest.skip("needs tmux")
    cmd = on_tw1(slurm_cluster, ["env", "-u", "COLUMNS", "-u", "LINES", "TERM=xterm-256color", "COLORTERM=",
                                 TRAINWATCH, "attach", str(job.launcher_pid("tw1")), "--slurm", "auto"])
    tmux("new-session", "-d", "-s", "tw", "-x", "140", "-y", "40", shlex.join(cmd))
    screen = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        screen = tmux.screen()
        if "STRAGGLER" in screen and "▶1" in screen and "▶ rank 1" in screen and "tw2" in screen:
            break
        assert tmux.alive(), f"trainwatch exited early:\n{screen}"
        time.sleep(1.0)
    else:
        pytest.fail(f"no straggler verdict naming rank 1 on tw2 within 60s; screen:\n{screen}")
    assert "world 2" in screen and "train.py" in screen, screen
    tmux("send-keys", "-t", "tw", "q")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and tmux.alive():
        time.sleep(0.2)
    assert not tmux.alive(), f"q did not quit:\n{tmux.screen()}"


def test_snapshot_from_a_login_node_reads_every_node_through_srun(job, slurm_cluster, untouched):
    # A login node: its own hostname and process table, no rank of the job; only the job id is known.
    login = ["unshare", "--pid", "--uts", "--mount", "--fork", "--mount-proc", "--kill-child",
             "sh", "-c", 'hostname login && exec "$@"', "sh", "env", NODE_ENV]
    cmd = [*login, TRAINWATCH, "snapshot", "--slurm", job.id, "--json", "--window", "1", "--remote-timeout", "40"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert {r["rank"]: r["host"] for r in data["ranks"]} == {0: "tw1", 1: "tw2"}
    assert data["verdict"]["kind"] == "straggler" and data["verdict"]["culprits"] == [1], data["verdict"]
