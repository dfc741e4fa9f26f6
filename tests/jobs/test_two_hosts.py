"""Two real hosts on one machine (tests/two_hosts.py): a torchrun gloo job across them, read over ssh.

node1 and node2 each have their own PID, UTS, mount and network namespace, a veth between them
(10.213.0.1/30 and 10.213.0.2/30) and their own sshd. A real ``torchrun --nnodes=2
--nproc-per-node=2`` gloo job spans both; the planted straggler, rank 3, runs on node2.
trainwatch runs on node1, where only ranks 0 and 1 exist, and must name rank 3 over ssh.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from real_jobs import PLANTED, TORCHRUN
from sshd import remote_trainwatch
import two_hosts

pytestmark = [pytest.mark.job, pytest.mark.slow]

TRAINWATCH = str(Path(sys.executable).parent / "trainwatch")
RANKS = r"python\S* -u \S*train\.py --scenario"  # the ranks, not torchrun (whose command line names train.py too)
MASTER_PORT = 29511  # its own network namespace: no other job listens there


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    reason = two_hosts.unavailable_reason()
    if reason:
        if two_hosts.in_ci():
            pytest.fail(f"CI: {reason}")
        pytest.skip(reason)
    with two_hosts.TwoHosts(tmp_path_factory.mktemp("hosts")) as made:
        yield made


@pytest.fixture(scope="module")
def job(hosts, tmp_path_factory):
    """The job on both nodes; it dies with the namespaces, and is killed here first."""
    workdir = tmp_path_factory.mktemp("job")
    script = workdir / "train.py"
    shutil.copy(PLANTED, script)
    procs, logs = [], {}
    for rank, node in enumerate(two_hosts.ADDRS):
        logs[node] = workdir / f"{node}.log"
        cmd = hosts.on(node, ["env", f"GLOO_SOCKET_IFNAME={hosts.veth[node]}", "OMP_NUM_THREADS=1",
                              "PYTHONUNBUFFERED=1", *TORCHRUN, "--nnodes=2", f"--node-rank={rank}",
                              "--master-addr", two_hosts.ADDRS["node1"], "--master-port", str(MASTER_PORT),
                              "--nproc-per-node=2", str(script), "--scenario", "straggler", "--deadline", "120"],
                       cwd=str(workdir))
        with open(logs[node], "wb") as log:
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True))
    try:
        deadline = time.monotonic() + 90
        while not all(p.read_text(errors="replace").count("scenario straggler") >= 2 for p in logs.values()):
            for proc, path in zip(procs, logs.values()):
                assert proc.poll() is None, f"{path.stem} exited early:\n{path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "ranks did not start:\n" + "\n".join(
                p.read_text(errors="replace")[-1500:] for p in logs.values())
            time.sleep(0.3)
        time.sleep(2.0)  # rank 3 reaches its sleep at step 3, a fraction of a second in
        yield hosts
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # nsenter and the torchrun it started
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


def pids(hosts, node: str, pattern: str) -> list[int]:
    done = subprocess.run(hosts.on(node, ["pgrep", "-f", pattern]), capture_output=True, text=True, timeout=20)
    return sorted(int(p) for p in done.stdout.split())


def test_trainwatch_on_node1_names_the_straggler_on_node2_over_ssh(job, tmp_path):
    hosts = job
    ranks_before = {n: pids(hosts, n, RANKS) for n in two_hosts.ADDRS}
    assert [len(p) for p in ranks_before.values()] == [2, 2], ranks_before
    (launcher,) = pids(hosts, "node1", r"^\S*python\S* -m torch.distributed.run")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node1 slots=2\nnode2 slots=2\n")  # this node is in it too: read locally
    cmd = hosts.on("node1", [TRAINWATCH, "snapshot", str(launcher), "--json", "--window", "1",
                             "--hostfile", str(hostfile), "--ssh-option", f"-F {hosts.ssh_config}",
                             "--remote-trainwatch", remote_trainwatch(), "--remote-timeout", "40"])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["source"] == "remote"
    assert {r["rank"]: r["host"] for r in data["ranks"]} == {0: "node1", 1: "node1", 2: "node2", 3: "node2"}
    assert [h["name"] for h in data["hosts"] if h["error"]] == []
    assert data["verdict"]["kind"] == "straggler", data["verdict"]
    assert data["verdict"]["culprits"] == [3], data["verdict"]
    culprit = next(r for r in data["ranks"] if r["rank"] == 3)
    assert culprit["state"] == "stuck" and "train.py" in culprit["where"], culprit
    assert data["job"]["master_addr"] == two_hosts.ADDRS["node1"]

    # The job is untouched, and nothing of trainwatch's is left on either node.
    assert {n: pids(hosts, n, RANKS) for n in two_hosts.ADDRS} == ranks_before
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(pids(hosts, n, "trainwatch") for n in two_hosts.ADDRS):
        time.sleep(0.2)
    assert {n: pids(hosts, n, "trainwatch") for n in two_hosts.ADDRS} == {"node1": [], "node2": []}
