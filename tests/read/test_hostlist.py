"""Host lists, hostfiles and SLURM nodelists."""

from __future__ import annotations

import os
import stat

import pytest

from trainwatch.probes.remote.hostlist import (
    HostlistError, expand_nodelist, parse_hostfile_text, parse_hosts, parse_scontrol_job, read_hostfile,
    slurm_hostnames,
)


@pytest.mark.parametrize("spec, names", [
    ("node01", ["node01"]),
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("gpu[8-11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),
    ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
    ("r[1-2]-n[01-02]", ["r1-n01", "r1-n02", "r2-n01", "r2-n02"]),
    ("node[001-003]-ib", ["node001-ib", "node002-ib", "node003-ib"]),
    ("a,a,b", ["a", "b"]),
    (" a , b ", ["a", "b"]),
])
def test_expand_nodelist(spec, names):
    assert expand_nodelist(spec) == names


@pytest.mark.parametrize("spec", ["node[1-", "node]1[", "node[a-b]", "node[5-1]", "node[1-9999999]"])
def test_bad_nodelists_are_named(spec):
    with pytest.raises(HostlistError):
        expand_nodelist(spec)


def test_hosts_option_is_repeatable_and_deduplicated():
    assert parse_hosts(["n[1-2]", "n2,user@n3"]) == ["n1", "n2", "user@n3"]


def test_hostfile_formats():
    text = """
    # DeepSpeed / Open MPI
    worker-1 slots=8
    worker-2 slots=8 max_slots=8   # trailing comment
    worker-1 slots=8
    mpich-host:4
    plain
    rack[1-2]
    """
    assert parse_hostfile_text(text) == ["worker-1", "worker-2", "mpich-host", "plain", "rack1", "rack2"]


def test_hostfile_errors_name_the_line(tmp_path):
    with pytest.raises(HostlistError, match="line 2"):
        parse_hostfile_text("ok\nbad slots\n")
    with pytest.raises(HostlistError, match="cannot read hostfile"):
        read_hostfile(tmp_path / "absent")
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(HostlistError, match="no hosts"):
        read_hostfile(tmp_path / "empty")


def _fake_tool(bindir, name, body):
    path = bindir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_scontrol_is_used_when_present(tmp_path, monkeypatch):
    _fake_tool(tmp_path, "scontrol", 'echo "$@" > "$(dirname "$0")/args"; printf "alpha\\nbeta\\n"\n')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert slurm_hostnames("whatever[1-2]") == ["alpha", "beta"]
    assert (tmp_path / "args").read_text().split() == ["show", "hostnames", "whatever[1-2]"]


def test_without_scontrol_we_expand_ourselves(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert slurm_hostnames("n[1-3]") == ["n1", "n2", "n3"]


def test_parse_scontrol_show_job():
    line = "JobId=42 JobName=train UserId=me(1) JobState=RUNNING NodeList=gpu[01-02] BatchHost=gpu01"
    assert parse_scontrol_job(line) == "gpu[01-02]"
    assert parse_scontrol_job("JobId=42 JobState=PENDING NodeList=(null)") is None
    assert parse_scontrol_job("JobId=42 ReqNodeList=x ExcNodeList=(null)") is None
