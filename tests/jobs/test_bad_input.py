"""Bad input: a clear message and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest


def trainwatch(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainwatch.tui.cli", *args], capture_output=True, text=True,
                          timeout=60, env=env)


def assert_clean_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode not in (0, None)
    assert "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def free_pid() -> int:
    """A PID this kernel could give that no process has now."""
    from trainwatch.tui.commands.common import largest_pid
    return next(pid for pid in range(largest_pid(), 1, -1) if not os.path.exists(f"/proc/{pid}"))


def test_no_such_pid():
    pid = free_pid()
    proc = trainwatch("snapshot", str(pid))
    assert_clean_error(proc, f"no process with PID {pid}")
    assert proc.returncode == 3


def usage_error(proc: subprocess.CompletedProcess, command: str, words: str) -> None:
    """A usage error: exit 2, one line from the command's own parser, then where to read more."""
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr.splitlines() == [f"trainwatch {command}: {words}", f"try 'trainwatch {command} --help'"], \
        proc.stderr


@pytest.mark.parametrize("args, words", [
    (["snapshot", "abc"], "argument pid: a PID is a positive whole number, not 'abc'"),
    (["snapshot", "0"], "argument pid: a PID is a positive whole number, not 0"),
    (["snapshot", "99999999999999999999"], "argument pid: 99999999999999999999 is too large for a PID: no process "
                                           "can have it (PIDs here go up to {largest})"),
    (["snapshot", "1", "--bogus"], "unrecognized arguments: --bogus"),
    (["dump", "1", "--window", "x"], "argument --window: seconds, not 'x'"),
    (["attach"], "the following arguments are required: pid (or --k8s SELECTOR: a job's pods, from any machine)"),
    (["watch"], "the following arguments are required: pid (or --k8s SELECTOR: a job's pods, from any machine)"),
    (["watch", "1", "--dump-on", "nothing"], None),
    (["open"], "the following arguments are required: PATH"),
])
def test_usage_errors_are_one_line_and_the_commands_help(args, words):
    from trainwatch.tui.commands.common import largest_pid
    proc = trainwatch(*args)
    if words is None:  # the message is the parser's own: only its shape is checked
        assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 2, proc.stderr
        assert proc.stderr.startswith(f"trainwatch {args[0]}: ") and proc.stderr.endswith("--help'\n")
        return
    usage_error(proc, args[0], words.format(largest=largest_pid()))


def test_not_a_job():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        proc = trainwatch("snapshot", str(sleeper.pid))
        assert_clean_error(proc, "is not a Python training job")
        assert proc.returncode == 4
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_python_process_with_no_torch_no_rank_and_no_children_is_not_a_job():
    """Past its first seconds (a job still starting has not loaded torch yet), a lone Python process
    with no launcher, no rank's environment and neither torch nor Ray is refused with the reason."""
    from real_jobs import wait_until
    from trainwatch.probes.read.processes import discover
    from trainwatch.probes.read.processes.proc import Proc

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(90)"])
    try:
        young = trainwatch("snapshot", "--json", "--window", "0", str(sleeper.pid))
        started = Proc(sleeper.pid).create_time()
        if time.time() - started < discover.STARTING_S:  # read while it may still be starting: a job
            assert young.returncode in (0, 9, 10), young.stderr
        wait_until(lambda: time.time() - started >= discover.STARTING_S, 30, "the sleeper past its start")
        for command in ("snapshot", "watch"):
            proc = trainwatch(command, str(sleeper.pid))
            assert_clean_error(proc, f"PID {sleeper.pid} (python", "neither torch nor Ray loaded",
                               "not a training job")
            assert proc.returncode == 4, (command, proc.returncode, proc.stderr)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_permission_denied_says_why_and_what_to_do():
    # Another user's process: drop to `nobody` and look at our own (root's) Python process.
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                               sys.executable, "-m", "trainwatch.tui.cli", "snapshot", str(target.pid)],
                              capture_output=True, text=True, timeout=60, cwd="/")
        if "setpriv" in proc.stderr and proc.returncode == 127:
            pytest.skip("setpriv unavailable")
        assert_clean_error(proc, "permission denied", "uid 0")
        assert proc.returncode == 5
    finally:
        target.kill()
        target.wait()


def test_pyspy_missing():
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        proc = trainwatch("snapshot", str(target.pid), env={**os.environ, "TRAINWATCH_PYSPY": "/nonexistent/py-spy"})
        assert_clean_error(proc, "py-spy is not installed", "pip install py-spy")
        assert proc.returncode == 6
    finally:
        target.kill()
        target.wait()


def test_no_pid_given():
    proc = trainwatch("snapshot")
    assert_clean_error(proc, "give a PID")
    assert proc.returncode == 2  # usage


@pytest.mark.parametrize("command", ["snapshot", "dump", "attach", "watch"])
@pytest.mark.parametrize("pid", ["-1", "0", "abc", "12.5"])
def test_a_pid_that_is_no_pid_is_refused(command, pid):
    proc = trainwatch(command, pid)
    shown = repr(pid) if not pid.lstrip("-").isdigit() else pid
    assert_clean_error(proc, f"argument pid: a PID is a positive whole number, not {shown}")
    assert proc.returncode == 2
    assert "ValueError" not in proc.stderr


def run_in_shell(script: str, **kwargs) -> subprocess.CompletedProcess:
    """``script`` in its own bash, as typed at a prompt ($$ is that shell)."""
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, **kwargs)


TW = f"{sys.executable} -m trainwatch.tui.cli"


def test_snapshot_of_its_own_shell_is_not_a_job():
    proc = run_in_shell(f"{TW} snapshot --window 0 $$; exit $?")  # `; exit` keeps bash as the parent
    assert_clean_error(proc, "is not a Python training job", "one of trainwatch's own parent processes")
    assert proc.returncode == 4
    assert "healthy" not in (proc.stdout + proc.stderr).lower()


def test_snapshot_of_itself_is_not_a_job():
    proc = run_in_shell(f"exec {TW} snapshot --window 0 $$")  # exec: $$ is trainwatch itself
    assert_clean_error(proc, "is trainwatch itself, not a training job")
    assert proc.returncode == 4


def test_a_python_parent_without_torch_is_not_a_job():
    code = ("import os, subprocess, sys; sys.exit(subprocess.call([sys.executable, '-m', 'trainwatch.tui.cli', "
            "'snapshot', '--window', '0', str(os.getpid())]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert_clean_error(proc, "is not a Python training job", "own parent processes")
    assert proc.returncode == 4


def test_a_job_started_from_the_same_shell_is_still_found():
    script = (f"{sys.executable} -c 'import time; time.sleep(30)' & job=$!; "
              f"sleep 0.5; {TW} snapshot --json --window 0 $$; rc=$?; kill $job; echo \"job=$job\" >&2; exit $rc")
    proc = run_in_shell(script)
    assert proc.returncode == 0, proc.stderr
    job = int(proc.stderr.split("job=")[-1].split()[0])
    assert json.loads(proc.stdout)["job"]["pid"] == job  # the sleeper, not trainwatch


@pytest.mark.parametrize("how", ["file", "pipe"])
def test_attach_with_stdout_redirected_refuses_without_escape_codes(tmp_path, how):
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        if how == "file":
            with open(tmp_path / "out.txt", "w") as out:
                proc = subprocess.run([sys.executable, "-m", "trainwatch.tui.cli", "attach", str(target.pid)],
                                      stdout=out, stderr=subprocess.PIPE, text=True, timeout=60)
            written = (tmp_path / "out.txt").read_text()
        else:
            proc = trainwatch("attach", str(target.pid))
            written = proc.stdout
        assert_clean_error(proc, "trainwatch: attach shows a live screen and needs a terminal",
                               "stdout is not one", "use `trainwatch snapshot PID`")
        assert proc.returncode == 2
        assert written == ""  # no escape codes, nothing at all
    finally:
        target.kill()
        target.wait()


def test_open_with_stdout_redirected_points_at_summary(tmp_path):
    from tui_samples import straggler

    bundle = tmp_path / "trainwatch-node1-4242-20231114T223000Z"
    bundle.mkdir()
    (bundle / "bundle.json").write_text('{"format": "trainwatch-bundle"}')
    (bundle / "snapshot.json").write_text(straggler().to_json())
    proc = trainwatch("open", str(bundle))
    assert_clean_error(proc, "trainwatch: open shows a live screen and needs a terminal",
                       "use `trainwatch open PATH --summary` (or --json)")
    assert proc.returncode == 2 and proc.stdout == ""


def test_unknown_option_is_a_usage_error():
    proc = trainwatch("snapshot", "--no-such-option", "1")
    assert proc.returncode == 2 and "unrecognized arguments: --no-such-option" in proc.stderr


def test_bad_option_values_are_usage_errors():
    for args, needle in ((("watch", "1", "--dump-on", "everything"), "argument --dump-on: unknown value: everything"),
                         (("dump", "1", "--signal", "SIGNOPE"), "unknown signal 'SIGNOPE'")):
        proc = trainwatch(*args)
        assert_clean_error(proc, needle)
        assert proc.returncode == 2


def test_job_id_from_a_login_node_whose_nodes_cannot_be_reached():
    # No rank of job 4242 here: the named node is asked instead; it is down, and says so.
    proc = trainwatch("snapshot", "--match-job-id", "4242", "--hosts", "127.0.0.1", "--ssh-option", "Port=1",
                      "--remote-timeout", "5")
    assert_clean_error(proc, "no node of the job could be read", "127.0.0.1: unreachable")
    assert proc.returncode == 1  # nothing at all could be read: not a partial view (9)


def test_job_id_with_no_node_to_ask():
    assert_clean_error(trainwatch("snapshot", "--match-job-id", "4242"), "no job with id 4242")


@pytest.mark.parametrize("args, needle", [
    (("snapshot", "1", "--window", "-3"), "argument --window: seconds, 0 or more, not -3"),
    (("dump", "1", "--window", "nan"), "argument --window: seconds, not nan"),
    (("attach", "1", "--interval", "0"), "argument --interval: seconds greater than 0, not 0"),
    (("snapshot", "1", "--samples", "0"), "argument --samples: a whole number from 1 to 100, not 0"),
    (("snapshot", "1", "--remote-timeout", "-1"), "argument --remote-timeout: seconds greater than 0"),
    (("demo", "--ranks", "65"), "argument --ranks: a whole number from 1 to 64, not 65"),
])
def test_numbers_out_of_range_are_usage_errors(args, needle):
    proc = trainwatch(*args)
    assert_clean_error(proc, needle)
    assert proc.returncode == 2


def test_watch_hang_after_zero_is_refused_and_leaves_no_folder(tmp_path):
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        proc = subprocess.run([sys.executable, "-m", "trainwatch.tui.cli", "watch", str(sleeper.pid),
                               "--hang-after", "0"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert_clean_error(proc, "argument --hang-after: seconds greater than 0, not 0")
    assert proc.returncode == 2 and os.listdir(tmp_path) == []


def test_one_window_option_with_one_default_per_command():
    from trainwatch.tui.cli import build_parser
    from trainwatch.tui.commands.common import WINDOW_DEFAULTS

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name, default in WINDOW_DEFAULTS.items():
        window = next(a for a in sub.choices[name]._actions if a.dest == "window")
        assert window.default == default and window.type.__name__ == "seconds_or_zero", name


def test_version_and_the_list_of_commands():
    version = trainwatch("--version")
    assert version.returncode == 0 and version.stdout.strip().startswith("trainwatch 0."), version
    bare = trainwatch()
    assert bare.returncode == 2 and bare.stderr.startswith("usage: trainwatch")
    for command in ("snapshot", "attach", "demo", "dump", "open", "run", "watch"):
        assert f"\n  {command} " in bare.stderr, bare.stderr
    assert "Traceback" not in bare.stderr


def test_the_name_is_said_once():
    proc = trainwatch("attach", "1")
    assert proc.stderr.startswith("trainwatch: attach shows a live screen"), proc.stderr
    assert "trainwatch: trainwatch" not in proc.stderr


def test_open_a_file_that_is_no_bundle(tmp_path):
    proc = trainwatch("open", "/etc/passwd", "--summary")
    assert_clean_error(proc, "/etc/passwd is not a trainwatch bundle, nor anything a training job leaves")
    assert proc.returncode == 7 and "ReadError" not in proc.stderr and "method gz" not in proc.stderr
    cut = tmp_path / "cut.tar.gz"
    subprocess.run(["tar", "czf", str(tmp_path / "whole.tar.gz"), "-C", "/usr/lib/python3", "."], check=False,
                   capture_output=True)
    cut.write_bytes((tmp_path / "whole.tar.gz").read_bytes()[:4000])
    proc = trainwatch("open", str(cut), "--summary")
    assert_clean_error(proc, "damaged bundle archive")
    assert proc.returncode == 7


def test_snapshot_json_leads_with_its_version():
    from trainwatch.probes.snapshot import SCHEMA_VERSION, Job, Snapshot

    text = Snapshot(job=Job(launcher="torchrun", pid=1, host="h")).to_json()
    assert next(iter(json.loads(text))) == "version" and json.loads(text)["version"] == SCHEMA_VERSION
    assert text.lstrip("{ \n").startswith('"version"')


def test_watch_dump_on_speaks_the_verdict_vocabulary():
    from trainwatch.probes.snapshot import PROBLEM_VERDICTS, VERDICTS
    from trainwatch.tui.commands.watch import DUMP_ON_WORDS, dump_on_kinds

    assert set(DUMP_ON_WORDS) == set(PROBLEM_VERDICTS) and set(DUMP_ON_WORDS) <= set(VERDICTS)
    assert dump_on_kinds("all") == PROBLEM_VERDICTS and dump_on_kinds("none") == frozenset()
    assert dump_on_kinds("straggler, crashed") == {"straggler", "crashed"}


@pytest.fixture(scope="module")
def not_a_job():
    """A process that is no training job: were --out checked after the job is looked for (and sampled),
    the error would say so instead."""
    sleeper = subprocess.Popen(["sleep", "60"])
    yield sleeper.pid
    sleeper.kill()
    sleeper.wait()


def test_dump_out_a_file_is_refused_before_the_job_is_looked_at(tmp_path, not_a_job):
    target = tmp_path / "bundle"
    target.write_text("")
    proc = trainwatch("dump", str(not_a_job), "--out", str(target))
    assert_clean_error(proc, f"cannot write the bundle into {target}: it is a file, not a folder")
    assert proc.returncode == 8 and "training job" not in proc.stderr


def test_dump_out_in_proc_says_it_is_the_kernels(not_a_job):
    proc = trainwatch("dump", str(not_a_job), "--out", "/proc/x")
    assert_clean_error(proc, "cannot write the bundle into /proc/x: /proc is in the kernel's proc filesystem")
    assert proc.returncode == 8 and "No such file" not in proc.stderr


def test_dump_out_on_a_read_only_mount(tmp_path, not_a_job):
    """A read-only tmpfs in a mount namespace of the test's own (root), and a folder nobody may write
    into for an unprivileged user."""
    ro = tmp_path / "ro"
    ro.mkdir()
    proc = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o ro tmpfs {ro} && exec "
                           f"{sys.executable} -m trainwatch.tui.cli dump {not_a_job} --out {ro}/b"],
                          capture_output=True, text=True, timeout=60)
    if "unshare" in proc.stderr or "mount:" in proc.stderr:
        pytest.skip(f"no mount namespace here: {proc.stderr.strip()}")
    assert_clean_error(proc, f"cannot write the bundle into {ro}/b: {ro} is on a read-only filesystem (tmpfs)")
    assert proc.returncode == 8


def test_dump_out_without_permission(not_a_job):
    import shutil
    import tempfile
    from pathlib import Path

    top = Path(tempfile.mkdtemp())  # in /tmp: an unprivileged user can reach it, pytest's own folder is 0700
    closed = top / "closed"
    closed.mkdir(mode=0o555)
    top.chmod(0o755)
    try:
        proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                               "trainwatch.tui.cli", "dump", str(not_a_job), "--out", str(closed / "b")],
                              capture_output=True, text=True, timeout=60, cwd="/")
    finally:
        shutil.rmtree(top)
    if "setpriv" in proc.stderr and proc.returncode == 127:
        pytest.skip("setpriv unavailable")
    assert_clean_error(proc, f"no permission to write in {closed} (owned by root, mode 555)")


def test_trainwatch_run_is_never_taken_for_its_own_job(tmp_path):
    """`trainwatch run` before its job has started (a launcher still importing, on a GPU box) is
    said so, exit 4, and not judged as a one-rank job of its own (a watch started then read the
    wrapper as rank 0 for the whole run); once its command runs, that command is the job."""
    from real_jobs import wait_until
    from trainwatch.probes.read.processes.proc import Proc

    def wrapped(name: str, *command: str) -> tuple[subprocess.Popen, int]:
        wrapper = subprocess.Popen([sys.executable, "-m", "trainwatch.tui.cli", "run", "--out", str(tmp_path / name),
                                    "--", *command], stderr=subprocess.DEVNULL)
        started = lambda: [c for c in Proc(wrapper.pid).children() if c.cmdline() == list(command)]  # noqa: E731
        wait_until(started, 30, "the wrapper's command past its exec")
        return wrapper, started()[0].pid

    def stop(wrapper: subprocess.Popen, child: int) -> None:
        for pid in (child, wrapper.pid):  # the command first: it runs in a process group of its own
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        wrapper.wait()

    # A non-Python command beneath it: nothing to judge yet, as before a launcher's exec.
    wrapper, child = wrapped("a", "sleep", "60")
    try:
        proc = trainwatch("snapshot", "--json", "--window", "0", str(wrapper.pid))
        assert_clean_error(proc, f"PID {wrapper.pid} is `trainwatch run`, which has not started its job yet")
        assert proc.returncode == 4
    finally:
        stop(wrapper, child)
    wrapper, child = wrapped("b", sys.executable, "-c", "import time; time.sleep(60)")
    try:
        proc = trainwatch("snapshot", "--json", "--window", "0", str(wrapper.pid))
        assert proc.returncode in (0, 9, 10), proc.stderr
        ranks = json.loads(proc.stdout)["ranks"]
        assert [r["pid"] for r in ranks] == [child], ranks
    finally:
        stop(wrapper, child)
