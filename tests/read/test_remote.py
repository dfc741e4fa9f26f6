"""Transports: exact command lines, bounded runs, failure reasons, bundles streamed back."""

from __future__ import annotations

import json

import pytest

from trainwatch.probes.remote.pods import parse_pods
from trainwatch.probes.remote.reach import KubeRemote, SlurmRemote, SshRemote, kubectl_get_pods_argv
from trainwatch.probes.remote.calls import Result, classify_failure
from trainwatch.probes.remote.launches import match_args
from trainwatch.probes.snapshot import Job

TW = "trainwatch"
ARGS = ["snapshot", "--json", "--match", "10.0.0.1:29500"]


def test_ssh_command_line():
    remote = SshRemote("node2", options=("-o", "Port=2222"), connect_timeout=7)
    assert remote.argv("/opt/tw/bin/trainwatch", ARGS) == [
        "ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=7", "-o", "Port=2222", "--", "node2",
        "/opt/tw/bin/trainwatch snapshot --json --match 10.0.0.1:29500"]
    quoted = SshRemote("n", destination="me@n").argv("trainwatch", ["dump", "--out", "a b"])
    assert quoted[-2:] == ["me@n", "trainwatch dump --out 'a b'"]
    assert "-F" not in remote.argv(TW, ARGS)  # the user's own ssh config applies


def test_slurm_command_line():
    remote = SlurmRemote("gpu07", job_id="4242")
    assert remote.argv("env X=1 trainwatch", ARGS) == [
        "srun", "--overlap", "--jobid=4242", "--nodelist=gpu07", "-N1", "-n1", "--quiet",
        "env", "X=1", "trainwatch", *ARGS]


def test_kubectl_command_lines():
    assert KubeRemote("trainer-1", namespace="ml", container="main").argv(TW, ARGS) == [
        "kubectl", "exec", "-n", "ml", "-c", "main", "trainer-1", "--", "trainwatch", *ARGS]
    assert KubeRemote("p").argv(TW, ["snapshot"]) == ["kubectl", "exec", "p", "--", "trainwatch", "snapshot"]
    assert kubectl_get_pods_argv("job=llm", "ml") == ["kubectl", "get", "pods", "-l", "job=llm", "-o", "json",
                                                      "-n", "ml"]


def test_parse_kubectl_pods():
    doc = {"apiVersion": "v1", "kind": "List", "items": [
        {"metadata": {"name": "w-0"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running", "podIP": "10.1.0.4"}},
        {"metadata": {"name": "w-1"}, "spec": {}, "status": {"phase": "Pending"}},
    ]}
    pods = parse_pods(json.dumps(doc))
    assert [(p.name, p.state.pod_phase, p.state.node) for p in pods] == [("w-0", "Running", "n1"), ("w-1", "Pending", None)]
    single = {"kind": "Pod", "metadata": {"name": "solo"}, "status": {"phase": "Running"}}
    assert [p.name for p in parse_pods(json.dumps(single))] == ["solo"]
    with pytest.raises(ValueError):
        parse_pods("error: You must be logged in")


def test_match_args_prefers_master_then_job_id():
    job = Job(launcher="torchrun", pid=1, host="h", master_addr="10.0.0.1", master_port=29500, job_id="abc")
    assert match_args(job) == ["--match", "10.0.0.1:29500"]
    assert match_args(Job(launcher="torchrun", pid=1, host="h", job_id="77")) == ["--match-job-id", "77"]
    with pytest.raises(ValueError):
        match_args(Job(launcher="torchrun", pid=1, host="h", job_id="none"))


@pytest.mark.parametrize("remote, rc, stderr, expected", [
    (SshRemote("n"), 255, "ssh: connect to host n port 22: Connection refused", "unreachable"),
    (SshRemote("n"), 255, "me@n: Permission denied (publickey).", "permission denied by ssh"),
    (SshRemote("n"), 127, "bash: line 1: trainwatch: command not found", "trainwatch not installed"),
    (SshRemote("n"), 127, "sh: 1: /nonexistent: not found", "trainwatch not installed"),
    (SlurmRemote("n", "1"), 2, "slurmstepd: error: execve(): trainwatch: No such file or directory",
     "trainwatch not installed"),
    (KubeRemote("p"), 1, 'exec: "trainwatch": executable file not found in $PATH', "trainwatch is not installed in pod p's image"),
    (KubeRemote("p"), 1, 'Error from server (Forbidden): pods "p" is forbidden: User "system:serviceaccount:ml:default" '
     'cannot create resource "pods/exec" in API group "" in the namespace "ml"',
     'permission denied: system:serviceaccount:ml:default may not create pods/exec in namespace ml (grant it with a '
     'Role rule: apiGroups: [""], resources: ["pods/exec"], verbs: ["create"]'),
    (SshRemote("n"), 4, "trainwatch: no job with master 10.0.0.1:29500 on n2", "no job found there (no job with"),
    (SshRemote("n"), 5, "trainwatch: permission denied reading PID 7", "permission denied (permission denied"),
    (SshRemote("n"), 1, "boom", "failed with exit status 1 (boom)"),
])
def test_failure_reasons(remote, rc, stderr, expected):
    assert expected in classify_failure(remote, Result(rc, stderr=stderr), 5.0)


def test_timeout_reason():
    assert classify_failure(SshRemote("n"), Result(None, timed_out=True), 5.0) == "timeout: no answer in 5s"


def test_missing_local_tool_is_named():
    result = Result(None, start_error="cannot run /nonexistent/ssh: No such file or directory")
    assert classify_failure(SshRemote("n"), result, 5) == "cannot run /nonexistent/ssh: No such file or directory"


