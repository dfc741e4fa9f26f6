"""A process in a PID and mount namespace of its own (as a container's, a pod's), read from outside:
its threads by their IDs here, its PID there, its files through /proc/PID/root, one name for it in
the files trainwatch processes share. Real processes made with ``unshare``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trainwatch.probes.read import runtime_files
from trainwatch.probes.read.processes import namespaces, procfs
from trainwatch.probes.read.stacks.pyspy import dump_stacks
from real_jobs import kill_tree, wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="needs root and unshare (namespaces)")

# Three threads; the main one sleeps where a test can name it. Its own view of itself goes to stdout.
PROGRAM = textwrap.dedent("""
    import os, sys, threading, time
    sys.path[:0] = {paths!r}
    from trainwatch.probes.read.processes import namespaces
    for _ in range(2):
        threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
    open({inside!r}, "w").write("only in the container\\n")
    print(os.getpid(), namespaces.node_identity(), flush=True)
    time.sleep(120)  # the main thread's line
""")


@pytest.fixture
def contained(tmp_path):
    """A Python process in new PID and mount namespaces, with a tmpfs only it sees at ``tmp_path/private``."""
    private = tmp_path / "private"
    private.mkdir()
    script = tmp_path / "prog.py"
    paths = [p for p in sys.path if p]
    script.write_text(PROGRAM.format(paths=paths, inside=str(private / "secret.txt")))
    proc = subprocess.Popen(["unshare", "--pid", "--mount", "--fork", "--mount-proc", "sh", "-c",
                             f"mount -t tmpfs none {private} && exec {sys.executable} {script}"],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        inner_pid, identity = proc.stdout.readline().split()
        python = wait_until(lambda: _python_below(proc.pid), 20, "the contained python")
        wait_until(lambda: len(os.listdir(f"/proc/{python}/task")) >= 3, 20, "its threads")
        yield python, int(inner_pid), identity, private
    finally:
        kill_tree(proc.pid)
        proc.wait(timeout=10)


def _python_below(pid: int) -> int | None:
    for child in procfs.descendant_pids(pid) or ():
        if "python" in (procfs.read_text(f"/proc/{child}/comm") or ""):
            return child
    return None


def test_its_pid_there_and_its_threads_here(contained):
    python, inner, _identity, _private = contained
    assert python != inner and namespaces.inner_pid(python) == inner
    assert namespaces.inner_pid(os.getpid()) is None  # ours: no other PID to give
    threads = dump_stacks(python)
    tids = {t.tid for t in threads}
    # py-spy names each thread by its ID in the container; here they are the IDs under /proc/PID/task
    assert tids == {int(t) for t in os.listdir(f"/proc/{python}/task")}, threads
    main = [t for t in threads if t.is_main]
    assert len(main) == 1 and main[0].tid == python
    assert any(f.function == "<module>" for f in main[0].frames)


def test_its_files_are_reached_through_its_root(contained):
    python, _inner, _identity, private = contained
    inside = str(private / "secret.txt")
    assert not os.path.exists(inside)  # here the folder is empty: the tmpfs is the container's
    here = namespaces.path_here(python, inside)
    assert here == f"/proc/{python}/root{inside}"
    assert Path(here).read_text() == "only in the container\n"
    # a file the container shares with us keeps its own name (one file, one name, from every rank)
    assert namespaces.path_here(python, sys.executable) == sys.executable


def test_one_name_for_it_from_inside_and_from_outside(contained):
    python, inner, identity, _private = contained
    assert namespaces.node_identity(python) == identity  # the same node, seen from its host
    assert namespaces.node_identity(python) != namespaces.node_identity()  # another PID namespace than ours
    path = runtime_files.rank_file("still-", python)
    space = os.readlink(f"/proc/{python}/ns/pid")[5:-1]
    assert path is not None and path.name == f"still-{inner}-{runtime_files.start_ticks(python)}-{space}.json"


def test_a_file_about_a_process_in_a_namespace_not_seen_here_is_kept(tmp_path, monkeypatch):
    """Two containers share a runtime folder on one machine: a trainwatch in one never sweeps away
    what another wrote about its own ranks (their processes are invisible to it); a file about a
    process of our own namespace that has gone is swept."""
    monkeypatch.setattr(runtime_files, "_folder", tmp_path)
    monkeypatch.setattr(runtime_files, "_last_sweep", 0.0)
    ours = os.readlink("/proc/self/ns/pid")[5:-1]
    unseen = tmp_path / "still-7-1234-1.json"  # PID namespace 1: no process here is in it
    gone = tmp_path / f"still-{2 ** 22 + 7}-1234-{ours}.json"  # no such PID
    alive = tmp_path / f"still-{os.getpid()}-{runtime_files.start_ticks(os.getpid())}-{ours}.json"
    for path in (unseen, gone, alive):
        path.write_text("{}")
    runtime_files.sweep()
    assert unseen.exists() and alive.exists() and not gone.exists()
    old = time.time() - runtime_files.UNSEEN_KEPT_S - 60
    os.utime(unseen, (old, old))
    monkeypatch.setattr(runtime_files, "_last_sweep", 0.0)
    runtime_files.sweep()
    assert not unseen.exists()
