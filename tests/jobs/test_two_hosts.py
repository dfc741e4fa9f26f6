"""Two real hosts on one machine (tests/two_hosts.py): a torchrun gloo job across them, read over ssh and SLURM.

node1 and node2 each have their own PID, UTS, mount and network namespace, a veth between them
(10.213.0.1/30 and 10.213.0.2/30) and their own sshd. A real ``torchrun --nnodes=2
--nproc-per-node=2`` gloo job spans both; the planted straggler, rank 3, runs on node2.
trainwatch runs on node1, where only ranks 0 and 1 exist, and must name rank 3 over ssh; then
the same job under a SLURM whose slurmctld and slurmds run in the nodes, read with srun --overlap.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from real_jobs import PLANTED, TORCHRUN, default_signals, kill_tree, rank_stuck_at, wait_until
from sshd import remote_trainwatch
import two_hosts

pytestmark = [pytest.mark.job, pytest.mark.slow]

TRAINWATCH = str(Path(sys.executable).parent / "trainwatch")
TRAINWATCH_PROC = r"trainwatch(\.tui\.cli| snapshot| watch| attach| agent)"  # a trainwatch process, here or remote
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


@pytest.fixture
def job(hosts, tmp_path):
    """The job on both nodes; it dies with the namespaces, and is killed here first."""
    workdir = tmp_path / "job"
    workdir.mkdir()
    script = workdir / "train.py"
    shutil.copy(PLANTED, script)
    procs, logs = [], {}
    for rank, node in enumerate(two_hosts.ADDRS):
        logs[node] = workdir / f"{node}.log"
        cmd = hosts.on(node, ["env", f"GLOO_SOCKET_IFNAME={two_hosts.IFNAME}", "OMP_NUM_THREADS=1",
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
        wait_until(lambda: rank_stuck_at(script, "# stuck in its own work"), 60, "rank 3 to reach its planted sleep")
        yield hosts
    finally:
        for proc in procs:
            kill_tree(proc.pid)  # nsenter, its torchrun, and the ranks (each in a session of its own)
            proc.wait(timeout=10)


def pids(hosts, node: str, pattern: str) -> list[int]:
    done = subprocess.run(hosts.on(node, ["pgrep", "-f", pattern]), capture_output=True, text=True, timeout=20)
    return sorted(int(p) for p in done.stdout.split())


def test_each_node_reaches_only_the_other(hosts):
    """No default route, no interface but loopback and the veth: traffic cannot leave the two namespaces."""
    for node, addr in two_hosts.ADDRS.items():
        routes = subprocess.run(hosts.on(node, ["ip", "-o", "route"]), capture_output=True, text=True,
                                timeout=20, check=True).stdout.splitlines()
        assert [r.split()[:3] for r in routes] == [["10.213.0.0/30", "dev", two_hosts.IFNAME]], routes
        links = subprocess.run(hosts.on(node, ["ip", "-o", "link"]), capture_output=True, text=True,
                               timeout=20, check=True).stdout
        assert sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines()) == [
            "lo", two_hosts.IFNAME], links
        hostname = subprocess.run(hosts.on(node, ["hostname"]), capture_output=True, text=True, timeout=20)
        assert hostname.stdout.strip() == node


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
    # its log's tail, read on node2 by the agent there, travels in the snapshot (the view reads no file)
    assert any("rank 3/4" in line for line in culprit["log_tail"] or ()), culprit["log_tail"]
    assert data["job"]["master_addr"] == two_hosts.ADDRS["node1"]

    # The job is untouched, and nothing of trainwatch's is left on either node.
    assert {n: pids(hosts, n, RANKS) for n in two_hosts.ADDRS} == ranks_before
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(pids(hosts, n, TRAINWATCH_PROC) for n in two_hosts.ADDRS):
        time.sleep(0.2)
    assert {n: pids(hosts, n, TRAINWATCH_PROC) for n in two_hosts.ADDRS} == {"node1": [], "node2": []}


def test_watch_on_node1_streams_node2_through_one_ssh_agent_and_leaves_nothing(job, tmp_path):
    """watch keeps one agent on node2 (started once, over ssh) and bundles the straggler it names."""
    import os
    import signal

    hosts = job
    ranks_before = {n: pids(hosts, n, RANKS) for n in two_hosts.ADDRS}
    (launcher,) = pids(hosts, "node1", r"^\S*python\S* -m torch.distributed.run")
    out = tmp_path / "watch"
    cmd = hosts.on("node1", [TRAINWATCH, "watch", str(launcher), "--hosts", "node2", "--hang-after", "3",
                             "--interval", "1", "--out", str(out), "--ssh-option", f"-F {hosts.ssh_config}",
                             "--remote-trainwatch", remote_trainwatch(), "--remote-timeout", "40"])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=default_signals)
    lines: list[str] = []
    seen: dict[int, int] = {}  # agent PID -> times seen (a py-spy the agent starts shares its command line until exec)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip())
            for pid in pids(hosts, "node2", r"trainwatch\.tui\.cli agent"):
                seen[pid] = seen.get(pid, 0) + 1
            if " note: node2: bundle " in line or " note: node2: no bundle" in line:
                break
        assert any(" bundle " in line for line in lines), "\n".join(lines)
    finally:
        for sig, grace in ((signal.SIGINT, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=grace)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
    agents = {pid for pid, times in seen.items() if times > 1}
    assert len(agents) == 1, seen  # one agent on node2, started once for every poll
    (bundle,) = [p for p in out.iterdir() if p.is_dir()]
    snap = json.loads((bundle / "snapshot.json").read_text())
    assert snap["verdict"]["kind"] == "straggler" and snap["verdict"]["culprits"] == [3], snap["verdict"]
    assert {r["rank"]: r["host"] for r in snap["ranks"]} == {0: "node1", 1: "node1", 2: "node2", 3: "node2"}
    assert {n: pids(hosts, n, RANKS) for n in two_hosts.ADDRS} == ranks_before
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(pids(hosts, n, TRAINWATCH_PROC) for n in two_hosts.ADDRS):
        time.sleep(0.2)
    assert {n: pids(hosts, n, TRAINWATCH_PROC) for n in two_hosts.ADDRS} == {"node1": [], "node2": []}


@pytest.fixture
def slurm_job(hosts, slurm_cluster, tmp_path):
    """SLURM on the two nodes (munged from slurm_cluster) and a 2-node sbatch straggler; scancel'd after."""
    hosts.start_slurm()
    workdir = tmp_path / "slurm-job"
    workdir.mkdir()
    shutil.copy(PLANTED, workdir / "train.py")
    log = workdir / "job.log"
    launch = (f"exec env GLOO_SOCKET_IFNAME={two_hosts.IFNAME} OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 "
              f"{shlex.join(TORCHRUN)} --nnodes=2 --node-rank=$SLURM_NODEID --master-addr "
              f"{two_hosts.ADDRS['node1']} --master-port {MASTER_PORT + 1} --nproc-per-node=2 "
              f"{workdir / 'train.py'} --scenario straggler --deadline 120")
    script = workdir / "job.sh"
    script.write_text(f"#!/bin/sh\n#SBATCH --nodes=2 --ntasks-per-node=1 --time=4 --output={log}\n"
                      f"exec srun --kill-on-bad-exit=1 sh -c {shlex.quote(launch)}\n")
    done = subprocess.run(hosts.on("node1", ["sbatch", "--parsable", str(script)], cwd=str(workdir)),
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 90
        while not (log.exists() and log.read_text(errors="replace").count("scenario straggler") >= 4):
            assert time.monotonic() < deadline, f"job {job_id} did not start its ranks:\n" + (
                log.read_text(errors="replace")[-3000:] if log.exists() else "(no output)")
            time.sleep(0.3)
        wait_until(lambda: rank_stuck_at(workdir / "train.py", "# stuck in its own work"), 60,
                   "rank 3 to reach its planted sleep")
        yield job_id
    finally:
        subprocess.run(hosts.on("node1", ["scancel", job_id]), capture_output=True, timeout=20)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and pids(hosts, "node2", RANKS) + pids(hosts, "node1", RANKS):
            time.sleep(0.3)


def steps(hosts, job_id: str) -> list[str]:
    done = subprocess.run(hosts.on("node1", ["squeue", "-h", "-s", "-j", job_id, "-o", "%i"]),
                          capture_output=True, text=True, timeout=20, check=True)
    return sorted(done.stdout.split())


def test_trainwatch_on_node1_names_the_straggler_on_node2_through_slurm(hosts, slurm_job):
    ranks_before = {n: pids(hosts, n, RANKS) for n in two_hosts.ADDRS}
    steps_before = steps(hosts, slurm_job)
    assert steps_before == sorted([f"{slurm_job}.0", f"{slurm_job}.batch"])
    cmd = hosts.on("node1", [TRAINWATCH, "snapshot", "--slurm", "auto", "--json", "--window", "1",
                             "--remote-timeout", "40"])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert {r["rank"]: r["host"] for r in data["ranks"]} == {0: "node1", 1: "node1", 2: "node2", 3: "node2"}
    assert data["verdict"]["kind"] == "straggler" and data["verdict"]["culprits"] == [3], data["verdict"]
    assert {n: pids(hosts, n, RANKS) for n in two_hosts.ADDRS} == ranks_before
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and steps(hosts, slurm_job) != steps_before:
        time.sleep(0.3)
    assert steps(hosts, slurm_job) == steps_before
