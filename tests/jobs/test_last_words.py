"""Last words: an armed rank told to stop (SIGTERM, SIGINT) or dying of an exception writes every
thread's stack and its Flight Recorder into the run directory, then does what it would have done
anyway (at most a second later): a hung rank blocked in gloo as well as one running Python."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from real_jobs import PlantedJob, default_signals, wait_until
from trainwatch.probes import hook, rundir
from trainwatch.probes.read.collectives import flightrec, hookclient

pytestmark = pytest.mark.job
TRAINWATCH = [sys.executable, "-m", "trainwatch.tui.cli"]
STRAGGLER_SLEEP = "time.sleep(3600)  # stuck in its own work while the others wait"

# Runs a rank as its child, in the same process group (so the launcher's teardown signal reaches
# the rank as without it), and records the rank's wait status: torchrun reaps its workers without
# saying how they ended when it is itself stopped. `-I -S`: the wrapper itself is never armed.
STATUS_WRAPPER = """
import json, os, signal, subprocess, sys, time
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda n, f: None)  # for the rank, not for this wrapper
child = subprocess.Popen(sys.argv[2:])
code = child.wait()
with open(os.path.join(sys.argv[1], f"{child.pid}.json"), "w") as out:
    json.dump({"pid": child.pid, "returncode": code, "ended_at": time.time()}, out)
sys.exit(128 - code if code < 0 else code)
"""


def last_words(run_dir: Path, rank: int) -> dict:
    return json.loads(rundir.last_words_file(run_dir, rank).read_text())


def stacks_of(run_dir: Path) -> dict[int, str]:
    """Each armed rank's stacks, asked of its hook (empty while a rank is not armed yet)."""
    out = {}
    for rank, sock in hookclient.armed_ranks(run_dir).items():
        reply = hookclient.request(sock, "stacks", timeout=5)
        if reply.ok:
            out[rank] = reply.text
    return out


def straggler_stuck(run_dir: Path, nproc: int, script: Path) -> bool:
    """The last rank sleeps in its planted work and every other one waits in all_reduce. The last
    rank must be at the planted sleep itself: in an early step's compute the others' wait in
    all_reduce is only a moment (a loaded CI machine once caught that moment)."""
    stacks = stacks_of(run_dir)
    if len(stacks) < nproc:
        return False
    waiting = all("in all_reduce" in stacks[r] and "in sync_gradients" in stacks[r] for r in range(nproc - 1))
    return waiting and f'"{script}", line {sleep_line(script)} in train' in stacks[nproc - 1]


def sleep_line(script: Path) -> int:
    [line] = [n for n, text in enumerate(script.read_text().splitlines(), 1) if STRAGGLER_SLEEP in text]
    return line


def gone(pid: int) -> bool:
    """Dead: reaped, or a zombie its parent has not reaped yet."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def generic_entries(words: dict) -> list[dict]:
    traces, _ = flightrec.hook_reply_traces(words["fr"])
    [(recorder, trace)] = traces  # gloo: the generic recorder only
    assert recorder == "generic"
    return trace["entries"]


@pytest.fixture(scope="module")
def torn_down(tmp_path_factory):
    """A 3-rank armed straggler job (`trainwatch run`), stopped as a teardown does once the
    straggler is stuck: SIGTERM to the launcher, which torchrun passes on to its ranks.
    Returns (job, run dir, {rank: wait status record}, when SIGTERM was sent)."""
    tmp = tmp_path_factory.mktemp("torn_down")
    run_dir, statuses = tmp / "run", tmp / "statuses"
    statuses.mkdir()
    wrapper = tmp / "status_wrapper.py"
    wrapper.write_text(STATUS_WRAPPER)
    prefix = [*TRAINWATCH, "run", "--out", str(run_dir), "--"]
    job = PlantedJob(tmp / "job", "straggler", nproc=3, deadline=45, prefix=prefix)
    at = job.cmd.index(str(job.script))
    job.cmd[at:at] = ["--no-python", sys.executable, "-I", "-S", str(wrapper), str(statuses), sys.executable, "-u"]
    with job:
        job.wait_for_ranks(steps=0)
        wait_until(lambda: straggler_stuck(run_dir, 3, job.script), 40, "the straggler stuck, the others in all_reduce")
        pids = {r["rank"]: r["pid"] for r in rundir.hook_records(run_dir)}
        sent = time.time()
        os.kill(job.pid, signal.SIGTERM)
        job.proc.wait(timeout=30)
        by_pid = {rec["pid"]: rec for rec in map(rundir.read_json, statuses.glob("*.json"))}
        yield job, run_dir, {rank: by_pid.get(pid) for rank, pid in pids.items()}, sent


def test_every_rank_leaves_last_words_on_a_teardown(torn_down):
    job, run_dir, _, sent = torn_down
    words = {rank: last_words(run_dir, rank) for rank in range(3)}
    for rank, said in words.items():
        assert said["format"] == hook.LAST_WORDS_FORMAT and said["rank"] == rank, said
        assert said["trigger"] == "SIGTERM" and said["at"] >= sent - 1 and said["elapsed_s"] < 1.0, said
        assert json.loads(rundir.hook_json(run_dir, rank).read_text())["last_words"]["SIGTERM"] == "armed"
    straggler = words[2]["stacks"]
    assert f'"{job.script}", line {sleep_line(job.script)} in train' in straggler, straggler
    waiting = words[0]["stacks"]
    # in all_reduce, or (when a peer died first and the collective failed) in torch's c10d wrapper around it
    assert ("in all_reduce" in waiting or "c10d_logger.py" in waiting) and "in sync_gradients" in waiting, waiting
    entries = generic_entries(words[0])  # TORCH_FR_BUFFER_SIZE, set by `trainwatch run`
    assert entries and entries[-1]["profiling_name"] == "gloo:all_reduce", entries[-1:]
    # faulthandler's C handler wrote the blocked rank's stacks the moment the signal came
    assert "in sync_gradients" in rundir.last_words_log(run_dir, 0).read_text()


def test_the_ranks_still_die_by_sigterm_within_a_second(torn_down):
    _, run_dir, statuses, sent = torn_down
    print("SIGTERM to the launcher, to each rank's death:",
          {rank: round(status["ended_at"] - sent, 3) for rank, status in statuses.items() if status},
          "writing:", {rank: last_words(run_dir, rank)["elapsed_s"] for rank in statuses})
    for rank, status in statuses.items():
        assert status is not None, f"rank {rank}: no wait status recorded"
        assert status["returncode"] == -signal.SIGTERM, (rank, status)
        # torchrun's own forwarding is in this too; the last words add at most a second
        assert status["ended_at"] - sent < 1.5, (rank, status["ended_at"] - sent)


def test_a_hung_rank_told_to_stop_is_gone_within_a_second(tmp_path):
    """SIGTERM straight to a rank blocked in gloo's all_reduce: a Python handler could not run
    until the collective returns; the listener thread writes and re-raises the signal."""
    run_dir = tmp_path / "run"
    env, _ = rundir.armed_env(run_dir, {})
    with PlantedJob(tmp_path / "job", "straggler", nproc=2, deadline=40, extra_env=env) as job:
        job.wait_for_ranks(steps=0)
        wait_until(lambda: straggler_stuck(run_dir, 2, job.script), 40, "rank 0 blocked in all_reduce")
        pid = json.loads(rundir.hook_json(run_dir, 0).read_text())["pid"]
        sent = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: gone(pid), 5, "the rank to die", interval=0.01)
        took = time.monotonic() - sent
        job.proc.wait(timeout=30)  # torchrun stops the other rank and exits: its report is complete
    print(f"SIGTERM to death of a rank blocked in all_reduce: {took:.3f}s")
    assert took < 1.5, took
    said = last_words(run_dir, 0)
    assert said["trigger"] == "SIGTERM" and said["pid"] == pid
    assert "in all_reduce" in said["stacks"], said["stacks"]
    assert generic_entries(said), said
    log = job.log.read_text(errors="replace")
    assert re.search(rf"exitcode: -15\) local_rank: 0 \(pid: {pid}\)", log), log[-3000:]  # died by SIGTERM


# -- small jobs: one armed Python process each, no torch ---------------------------------------
def armed_env(run_dir: Path, by_hand: bool = False) -> dict[str, str]:
    """A rank's environment: armed as `trainwatch run` does (sitecustomize), or for a script that
    imports the hook by hand."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "TRAINWATCH_ARMED_PID", "TRAINWATCH_HOOK")}
    env.update(RANK="0", TRAINWATCH_RUN_DIR=str(run_dir), PYTHONUNBUFFERED="1")
    if not by_hand:
        env.update(TRAINWATCH_HOOK="1", PYTHONPATH=str(rundir.HOOK_DIR))
    return env


def start(tmp_path: Path, code: str, by_hand: bool = False, preexec_fn=None) -> subprocess.Popen:
    """The job, its signals at their defaults (whatever this test process inherited) and then as
    ``preexec_fn`` sets them."""
    script = tmp_path / "job.py"
    script.write_text(code)

    def dispositions() -> None:
        default_signals()
        if preexec_fn is not None:
            preexec_fn()
    proc = subprocess.Popen([sys.executable, str(script)], env=armed_env(tmp_path / "run", by_hand), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=dispositions)
    first = proc.stdout.readline().strip()
    assert first == "ready", first + finish(proc)
    return proc


def finish(proc: subprocess.Popen, timeout: float = 10) -> str:
    """Wait for the process (killed past ``timeout``) and return the rest of its output. Not
    communicate(): it reads the pipe itself, past what readline() buffered."""
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.stdout.read()


def signal_and_wait(proc: subprocess.Popen, signum: int) -> tuple[int, str, float]:
    sent = time.monotonic()
    proc.send_signal(signum)
    out = finish(proc)
    return proc.returncode, out, time.monotonic() - sent


PLAIN_SLEEP = """
import time
def wait_here():
    time.sleep(30)
print("ready", flush=True)
wait_here()
"""


OWN_HANDLER = """
import signal, sys, time
def on_term(signum, frame):
    print("job handler ran", flush=True)
    sys.exit(7)
signal.signal(signal.SIGTERM, on_term)
{arm}
def wait_here():
    time.sleep(30)
print("ready", flush=True)
wait_here()
"""


@pytest.mark.parametrize("order", ["hook armed after the handler", "handler installed after the hook"])
def test_the_jobs_own_sigterm_handler_still_decides(tmp_path, order):
    """Chained to (armed after it), or replacing ours (installed later, as a job under `trainwatch
    run` does): either way the job's handler runs as before, and the last words are written."""
    by_hand = order.startswith("hook armed after")
    proc = start(tmp_path, OWN_HANDLER.format(arm="import trainwatch.probes.hook" if by_hand else ""), by_hand)
    code, out, took = signal_and_wait(proc, signal.SIGTERM)
    assert code == 7 and "job handler ran" in out, (code, out)
    said = last_words(tmp_path / "run", 0)
    assert said["trigger"] == "SIGTERM" and said["fr"] is None and "torch is not imported" in said["fr_error"]
    assert took < 1.5, took
    if by_hand:  # ours ran first, in front of the job's: the main thread's stack is the job's sleep
        assert "in wait_here" in said["stacks"], said["stacks"]


SIGINT_JOB = """
import sys, time
def wait_here():
    print("ready", flush=True)  # inside the try: a SIGINT right after "ready" is the job's to catch
    time.sleep(30)
try:
    wait_here()
except KeyboardInterrupt:
    print("KeyboardInterrupt caught by the job", flush=True)
    sys.exit(3)
"""


def test_sigint_still_raises_keyboard_interrupt(tmp_path):
    proc = start(tmp_path, SIGINT_JOB)
    code, out, took = signal_and_wait(proc, signal.SIGINT)
    assert code == 3 and "KeyboardInterrupt caught by the job" in out, (code, out)
    said = last_words(tmp_path / "run", 0)
    assert said["trigger"] == "SIGINT" and "in wait_here" in said["stacks"]
    assert took < 1.5, took


def test_an_uncaught_keyboard_interrupt_ends_the_rank_as_before(tmp_path):
    """Python exits by SIGINT on an uncaught KeyboardInterrupt; exit.json names the job's frame
    (not the hook's handler it was raised through), and the last words stay the signal's."""
    proc = start(tmp_path, PLAIN_SLEEP)
    code, out, _ = signal_and_wait(proc, signal.SIGINT)
    assert code == -signal.SIGINT and "KeyboardInterrupt" in out, (code, out)
    assert last_words(tmp_path / "run", 0)["trigger"] == "SIGINT"
    frame = json.loads(rundir.exit_file(tmp_path / "run", 0).read_text())["frame"]
    assert frame.endswith(" wait_here") and "job.py" in frame, frame


def test_a_rank_running_python_dies_by_sigterm(tmp_path):
    proc = start(tmp_path, PLAIN_SLEEP)
    code, _, took = signal_and_wait(proc, signal.SIGTERM)
    assert code == -signal.SIGTERM, code
    said = last_words(tmp_path / "run", 0)
    assert said["trigger"] == "SIGTERM" and "in wait_here" in said["stacks"]
    assert took < 1.5, took


IGNORED = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
import trainwatch.probes.hook
print("ready", flush=True)
time.sleep(30)
"""


@pytest.mark.parametrize("how", ["set by the job", "inherited"])
def test_an_ignored_signal_is_left_alone(tmp_path, how):
    if how == "set by the job":
        proc = start(tmp_path, IGNORED, by_hand=True)
    else:  # from a parent that ignores it (as a shell's background job ignores SIGINT)
        proc = start(tmp_path, PLAIN_SLEEP, preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))
    try:
        notes = json.loads(rundir.hook_json(tmp_path / "run", 0).read_text())["last_words"]
        assert notes["SIGTERM"] == "left alone: the job ignores it (SIG_IGN)" and notes["SIGINT"] == "armed", notes
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert proc.poll() is None  # still ignored
        assert not rundir.last_words_file(tmp_path / "run", 0).exists()
    finally:
        proc.kill()
        finish(proc)


RAISES = """
def step():
    raise RuntimeError("planted failure")
print("ready", flush=True)
step()
"""


def test_an_uncaught_exception_leaves_last_words(tmp_path):
    proc = start(tmp_path, RAISES)
    out = finish(proc)
    assert proc.returncode == 1 and "RuntimeError: planted failure" in out, out
    said = last_words(tmp_path / "run", 0)
    assert said["trigger"] == "exception"
    main = said["stacks"].split('"MainThread" (most recent call first):')[1]
    assert main.index("in step") < main.index("in <module>"), said["stacks"]  # innermost first



SLOW_EXCEPTION = """
import sys, time, types
import trainwatch.probes.hook as hook
sys.modules["torch"] = types.ModuleType("torch")  # a Flight Recorder that takes 2 s, as on a loaded node
def slow_fr_trace():
    print("asked", flush=True)
    time.sleep(2)
    return {"ok": True, "text": '{"entries": []}', "error": None}
hook.fr_trace = slow_fr_trace
def step():
    raise RuntimeError("planted failure")
print("ready", flush=True)
step()
"""


def test_a_launchers_sigterm_waits_for_the_exceptions_last_words(tmp_path):
    """A peer died; this rank's collective raised, and its last words are being written when the
    launcher's SIGTERM comes. The signal waits for them (their Flight Recorder took 2 s), rather
    than ending the process at the 1 s budget with the Flight Recorder cut off (an aborts test
    lost its culprit so under CI load), and the process still ends promptly."""
    proc = start(tmp_path, SLOW_EXCEPTION, by_hand=True)
    assert proc.stdout.readline().strip() == "asked"
    code, out, took = signal_and_wait(proc, signal.SIGTERM)
    said = last_words(tmp_path / "run", 0)
    assert said["trigger"] == "exception" and said["fr"] == '{"entries": []}', (said, out)
    assert code in (1, -signal.SIGTERM) and took < 2 + hook.LAST_WORDS_BUDGET_S + 1.0, (code, took, out)

FORKS = """
import os, signal, time
print("ready", flush=True)
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
time.sleep(0.3)
os.kill(child, signal.SIGTERM)
_, status = os.waitpid(child, 0)
print("child", os.WIFSIGNALED(status) and os.WTERMSIG(status), flush=True)
"""


def test_a_forked_child_is_not_the_rank(tmp_path):
    """A DataLoader worker forked by the rank: SIGTERM kills it as before, and the rank (whose
    listener shares nothing with it) says nothing."""
    proc = start(tmp_path, FORKS)
    out = finish(proc)
    assert proc.returncode == 0 and f"child {int(signal.SIGTERM)}" in out, out
    assert not rundir.last_words_file(tmp_path / "run", 0).exists()


WAKEUP_TAKEN = """
import os, signal, time
r, w = os.pipe()
os.set_blocking(w, False)
signal.set_wakeup_fd(w)  # as an event loop does
import trainwatch.probes.hook
assert signal.set_wakeup_fd(w) == w  # still the job's
def wait_here():
    time.sleep(30)
print("ready", flush=True)
wait_here()
"""


def test_a_wakeup_fd_the_job_set_is_kept(tmp_path):
    """No listener then: the Python handler writes the last words itself (a rank running Python)."""
    proc = start(tmp_path, WAKEUP_TAKEN, by_hand=True)
    notes = json.loads(rundir.hook_json(tmp_path / "run", 0).read_text())["last_words"]
    assert notes["SIGTERM"] == "armed" and notes["listener"].startswith("not started: the wakeup fd is taken"), notes
    code, out, took = signal_and_wait(proc, signal.SIGTERM)
    assert code == -signal.SIGTERM and took < 1.5, (code, out, took)
    said = last_words(tmp_path / "run", 0)
    assert said["trigger"] == "SIGTERM" and "in wait_here" in said["stacks"]


FROM_A_THREAD = """
import threading, time
import trainwatch.probes.hook as hook
armed = threading.Thread(target=hook.install, kwargs={"rank": 0})
armed.start()
armed.join()
print("ready", flush=True)
raise RuntimeError("planted failure")
"""


def test_armed_from_a_thread_leaves_the_signals_alone(tmp_path):
    """install() after init_process_group in a thread (Ray Train's TrainingThread): Python sets
    signal handlers only in the main thread. The exception's last words are still written."""
    env = armed_env(tmp_path / "run", by_hand=True)
    del env["RANK"]
    script = tmp_path / "job.py"
    script.write_text(FROM_A_THREAD)
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "planted failure" in out.stderr, out
    notes = json.loads(rundir.hook_json(tmp_path / "run", 0).read_text())["last_words"]
    assert notes == {name: "left alone: armed outside the main thread (Python sets signal handlers only there)"
                     for name in ("SIGTERM", "SIGINT")}, notes
    assert last_words(tmp_path / "run", 0)["trigger"] == "exception"


SLOW_RECORDER = """
import signal, sys, time, types
import trainwatch.probes.hook as hook
sys.modules["torch"] = types.ModuleType("torch")  # a Flight Recorder to wait for: a wedged one
def slow_fr_trace():
    time.sleep(10)
    return {"ok": False, "text": "", "error": "too late"}
hook.fr_trace = slow_fr_trace
# The main thread never sees SIGTERM (as one blocked in C++ never runs Python): only the
# faulthandler trace and the listener act on it.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
print("ready", flush=True)
time.sleep(30)
"""


def test_a_slow_write_never_holds_the_signal_past_the_budget(tmp_path):
    proc = start(tmp_path, SLOW_RECORDER, by_hand=True)
    code, out, took = signal_and_wait(proc, signal.SIGTERM)
    print(f"SIGTERM to death with a write that never ends: {took:.3f}s")
    assert code == -signal.SIGTERM, (code, out)
    assert hook.LAST_WORDS_BUDGET_S <= took < hook.LAST_WORDS_BUDGET_S + 0.5, took
    assert "in <module>" in rundir.last_words_log(tmp_path / "run", 0).read_text()  # faulthandler's, at once
    said = last_words(tmp_path / "run", 0)  # the stacks, written before the Flight Recorder was asked
    assert said["trigger"] == "SIGTERM" and "in <module>" in said["stacks"] and said["fr"] is None, said
    assert said["fr_error"] == "the Flight Recorder dump did not finish within 1 s", said
