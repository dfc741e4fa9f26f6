"""The other-nodes options and the source they build; SLURM and Kubernetes with stand-in tools."""

from __future__ import annotations

import argparse
import json
import os
import socket
import stat
from pathlib import Path

import pytest

from trainwatch.probes.errors import TrainwatchError
from trainwatch.probes.read.processes.process import JobProcesses, RankProcess
from trainwatch.probes.remote.streams import StreamSource
from trainwatch.probes.remote.reach import KubeRemote, SlurmRemote, SshRemote
from trainwatch.tui.remote_args import (
    add_remote_arguments, detect_slurm, remotes_from_args, slurm_job_here, ssh_options, wants_remote, wrap_source,
)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("pid", type=int, nargs="?")
    parser.add_argument("--window", type=float, default=3.0)
    add_remote_arguments(parser)
    return parser.parse_args(list(argv))


def job(env: dict | None = None) -> JobProcesses:
    ranks = (RankProcess(pid=11, rank=0, env=env or {}),)
    return JobProcesses(launcher="torchrun", root_pid=10, host="here", ranks=ranks, world_size=4,
                        master_addr="10.0.0.1", master_port=29500)


def tool(bindir: Path, name: str, body: str) -> None:
    path = bindir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_defaults_do_not_touch_the_local_source():
    args = parse("123")
    local = object()
    assert not wants_remote(args)
    assert wrap_source(args, local, job()) is local
    assert args.remote_trainwatch == "trainwatch" and args.remote_timeout == 30


def test_hosts_and_hostfile_become_ssh_remotes(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("w3 slots=8\nw4 slots=8\n")
    args = parse("1", "--hosts", "w[1-2]", "--hostfile", str(hostfile), "--hosts", socket.gethostname(),
                 "--ssh-option", "Port=2222", "--ssh-option=-F /etc/cluster_ssh", "--remote-timeout", "5")
    remotes = remotes_from_args(args, job())
    assert [r.name for r in remotes] == ["w1", "w2", "w3", "w4"]  # this node is left out
    assert remotes[0] == SshRemote("w1", options=("-o", "Port=2222", "-F", "/etc/cluster_ssh"), connect_timeout=5)


def test_ssh_options():
    assert ssh_options(["User=me", "-i ~/.ssh/k"]) == ("-o", "User=me", "-i", "~/.ssh/k")


def test_a_one_shot_over_ssh_asks_agents_for_the_compact_wire():
    """snapshot/dump --hosts: one agent per node (the compact wire, every thread), as over SLURM."""
    args = parse("1", "--hosts", "w1", "--remote-trainwatch", "/opt/tw", "--remote-timeout", "7", "--window", "1")
    source = wrap_source(args, None, job())
    try:
        assert isinstance(source, StreamSource) and source.once
        assert source.match == ["--match", "10.0.0.1:29500"] and source.trainwatch == "/opt/tw"
        assert source.timeout == 7 and source.world_size == 4
        assert source.args == ["agent", "--match", "10.0.0.1:29500", "--interval", "1", "--window", "1"]
    finally:
        source.close()


def test_every_judgement_option_reaches_the_nodes():
    parser = argparse.ArgumentParser()
    parser.add_argument("pid", type=int, nargs="?")
    parser.add_argument("--window", type=float, default=3.0)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--stuck-after", type=float, default=None)
    add_remote_arguments(parser)
    args = parser.parse_args(["1", "--hosts", "w1", "--window", "2", "--samples", "5", "--stuck-after", "45"])
    source = wrap_source(args, None, job())
    try:
        assert source.args == ["agent", "--match", "10.0.0.1:29500", "--interval", "2", "--window", "2",
                               "--samples", "5", "--stuck-after", "45"]
    finally:
        source.close()


def test_job_without_identity_is_refused():
    args = parse("1", "--hosts", "w1")
    bare = JobProcesses(launcher="python", root_pid=1, host="h")
    with pytest.raises(TrainwatchError, match="MASTER_ADDR"):
        wrap_source(args, None, bare)


def test_detect_slurm():
    assert detect_slurm(job({"SLURM_JOB_ID": "4242"})) == "4242"
    assert detect_slurm(job()) is None


def test_slurm_nodes_through_srun(tmp_path, monkeypatch):
    me = socket.gethostname()
    tool(tmp_path, "scontrol", f'''case "$2" in
  job) echo "JobId=$4 JobState=RUNNING NodeList=gpu[01-02],{me}" ;;
  hostnames) echo "$3" | sed 's/gpu\\[01-02\\]/gpu01 gpu02/' | tr ' ,' '\\n\\n' ;;
esac
''')
    tool(tmp_path, "srun", "exit 0\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    remotes = remotes_from_args(parse("1", "--slurm", "auto"), job({"SLURM_JOB_ID": "4242"}))
    assert remotes == [SlurmRemote("gpu01", "4242"), SlurmRemote("gpu02", "4242")]
    assert remotes[0].argv("trainwatch", ["snapshot"])[:6] == [
        "srun", "--overlap", "--jobid=4242", "--nodelist=gpu01", "-N1", "-n1"]


def test_slurm_node_name_of_the_ranks_counts_as_this_node(tmp_path, monkeypatch):
    """SLURM's NodeName may differ from the hostname: the ranks' SLURMD_NODENAME is this node too."""
    tool(tmp_path, "scontrol", '''case "$2" in
  job) echo "JobId=$4 NodeList=gpu[01-02]" ;;
  hostnames) printf 'gpu01\\ngpu02\\n' ;;
esac
''')
    tool(tmp_path, "srun", "exit 0\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    remotes = remotes_from_args(parse("1", "--slurm", "auto"), job({"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "gpu02"}))
    assert remotes == [SlurmRemote("gpu01", "7")]


def test_slurm_auto_without_a_pid_finds_the_job_here(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "31")
    assert slurm_job_here(5) == "31"  # inside an allocation (salloc, sbatch, srun --pty)
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu07")
    tool(tmp_path, "squeue", 'echo "$@" > "$(dirname "$0")/args"; echo 42\n')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert slurm_job_here(5) == "42"  # the one job running on this node
    assert (tmp_path / "args").read_text().split() == ["-h", "-t", "RUNNING", "-w", "gpu07", "-o", "%i"]
    tool(tmp_path, "squeue", "echo 42; echo 43\n")
    with pytest.raises(TrainwatchError, match="jobs 42, 43 run on node gpu07"):
        slurm_job_here(5)
    tool(tmp_path, "squeue", "exit 0\n")
    with pytest.raises(TrainwatchError, match="no SLURM job runs on node gpu07"):
        slurm_job_here(5)


def test_slurm_auto_without_slurm_job_is_refused(tmp_path, monkeypatch):
    tool(tmp_path, "srun", "exit 0\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(TrainwatchError, match="SLURM_JOB_ID"):
        remotes_from_args(parse("1", "--slurm", "auto"), job())


def test_slurm_without_srun_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(TrainwatchError, match="srun"):
        remotes_from_args(parse("1", "--slurm", "7"), job())


def test_k8s_pods_through_kubectl(tmp_path, monkeypatch):
    running = {"phase": "Running", "containerStatuses": [{"name": "main", "state": {"running": {}}}]}
    spec = {"containers": [{"name": "main"}]}
    pods = {"kind": "List", "items": [
        {"metadata": {"name": "trainer-0"}, "spec": spec, "status": running},
        {"metadata": {"name": "trainer-1"}, "spec": spec, "status": running},
        {"metadata": {"name": "trainer-2"}, "spec": spec, "status": {"phase": "Pending"}},
    ]}
    (tmp_path / "pods.json").write_text(json.dumps(pods))
    tool(tmp_path, "kubectl", f'echo "$@" > {tmp_path}/args; cat {tmp_path}/pods.json\n')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HOSTNAME", "trainer-0")  # we run inside trainer-0
    remotes = remotes_from_args(parse("1", "--k8s", "job=llm", "--k8s-namespace", "ml"), job())
    assert remotes == [KubeRemote("trainer-1", namespace="ml", container="main")]
    assert (tmp_path / "args").read_text().split() == ["get", "pods", "-l", "job=llm", "-o", "json", "-n", "ml"]


def test_k8s_errors_are_named(tmp_path, monkeypatch):
    tool(tmp_path, "kubectl", 'echo "error: the server doesn\'t have a resource type" >&2; exit 1\n')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(TrainwatchError, match="kubectl get pods -l a=b"):
        remotes_from_args(parse("1", "--k8s", "a=b"), job())


def test_ray_auto_reaches_the_nodes_the_run_was_placed_on_and_only_for_ray_train():
    ray_job = JobProcesses(launcher="ray train", root_pid=1, host="node1", world_size=4, local_world_size=2,
                           ranks=(RankProcess(pid=10, rank=2), RankProcess(pid=11, rank=3)),
                           job_id="ray_train_run-1", peer_nodes=("10.0.0.2", "10.0.0.3"))
    args = parse("1", "--ray", "auto", "--ssh-option", "Port=2222")
    assert wants_remote(args)
    remotes = remotes_from_args(args, ray_job)
    assert [(type(r), r.name) for r in remotes] == [(SshRemote, "10.0.0.2"), (SshRemote, "10.0.0.3")]
    assert remotes[0].options == ("-o", "Port=2222")
    with pytest.raises(TrainwatchError, match="not a Ray Train job"):
        remotes_from_args(args, JobProcesses(launcher="torchrun", root_pid=1, host="h"))
    without_log = JobProcesses(launcher="ray train", root_pid=1, host="node2", world_size=4, local_world_size=2,
                               ranks=ray_job.ranks)
    with pytest.raises(TrainwatchError, match="controller log"):
        remotes_from_args(args, without_log)


def test_ray_auto_reaches_the_nodes_whose_ranks_connect_to_a_worker_groups_store():
    """Plain Ray actors: the store served here sees the other nodes' ranks connect; a node whose
    ranks only dial a store served elsewhere cannot tell the other nodes and says where to run."""
    from trainwatch.probes.snapshot import Rendezvous

    ranks = (RankProcess(pid=10, rank=0), RankProcess(pid=11, rank=1))
    here = JobProcesses(launcher="ray actors", root_pid=1, host="node1", world_size=4, local_world_size=2, ranks=ranks,
                        master_addr="10.0.0.1", master_port=4000, peer_nodes=("10.0.0.2",),
                        rendezvous=Rendezvous(store="10.0.0.1:4000", served_here=True, host_pid=10))
    args = parse("1", "--ray", "auto")
    assert [r.name for r in remotes_from_args(args, here)] == ["10.0.0.2"]
    elsewhere = JobProcesses(launcher="ray actors", root_pid=1, host="node2", world_size=2, local_world_size=2,
                             ranks=ranks, rendezvous=Rendezvous(store="10.0.0.1:4000", served_here=False))
    with pytest.raises(TrainwatchError, match="served on another node") as caught:
        remotes_from_args(args, elsewhere)
    assert "10.0.0.1:4000" in (caught.value.remedy or "")
