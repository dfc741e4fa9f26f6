"""Start real planted torchrun jobs for tests; every job is bounded and killed in teardown."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from trainwatch.probes.errors import TrainwatchError
from trainwatch.probes.read.stacks.pyspy import dump_stacks
from trainwatch.tui.planted import stop_job_tree

PLANTED = Path(__file__).resolve().parents[1] / "tui" / "planted.py"
FRAMEWORK_JOBS = Path(__file__).resolve().parent / "jobs_frameworks"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
# Launchers other than torchrun: the venv's console script and its arguments ({nproc}, {port}).
LAUNCH_COMMANDS = {
    # No GPU: accelerate's --multi_gpu launcher runs the ranks in its MULTI_CPU mode (gloo).
    "accelerate": ("accelerate", "launch", "--multi_gpu", "--num_processes", "{nproc}", "--num_machines", "1",
                   "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "{port}"),
    "deepspeed": ("deepspeed", "--num_gpus", "{nproc}", "--master_port", "{port}", "--no_local_rank"),
}


def default_signals() -> None:
    """``preexec_fn`` for a process a test will signal: SIGINT, SIGQUIT and SIGHUP at their
    defaults, as a terminal's foreground job has them. A shell starts a background job (``pytest
    &``) with SIGINT and SIGQUIT ignored, ``nohup`` ignores SIGHUP, and an ignored disposition is
    inherited across exec: a Ctrl-C or hangup the test sends would then do nothing (trainwatch
    rightly keeps an ignored SIGHUP ignored). A test that wants a signal ignored sets that itself."""
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(check, timeout: float, what: str, interval: float = 0.2):
    """Poll ``check()`` until it returns something truthy and return that: a wait on a condition,
    never a fixed sleep. Past ``timeout`` seconds, fail naming ``what`` was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def cpu_ticks(pids: list[int]) -> int:
    """User + system ticks of these processes together (gone ones count 0)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total


def wait_quiet(pids: list[int], timeout: float = 30.0, quiet_s: float = 0.5) -> None:
    """Wait until these processes stop using CPU (blocked where they were planted to block): on a
    loaded machine a rank may still be computing its way there long after its marker line."""
    def quiet() -> bool:
        before = cpu_ticks(pids)
        time.sleep(quiet_s)
        return cpu_ticks(pids) - before <= len(pids)  # a tick each: a heartbeat, not work
    wait_until(quiet, timeout, f"PIDs {pids} blocked (no CPU used for {quiet_s}s)")


def rank_stuck_at(script: Path, marker: str, code: Path | None = None) -> bool:
    """Whether a rank running ``script`` (any PID namespace, e.g. a test node's) is on the one line
    of ``code`` (default: ``script``, a copy of tui/planted.py; else a file ``script`` runs) containing
    ``marker``: its innermost frame in either file, as py-spy sees it. Readiness for a planted fault, e.g. the straggler's
    ``# stuck in its own work``."""
    code = Path(code or script)
    lines = [n for n, text in enumerate(code.read_text().splitlines(), start=1) if marker in text]
    assert len(lines) == 1, f"{marker!r} in {code}: lines {lines}"
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        if str(script) not in cmd or "torch.distributed.run" in cmd:  # a rank, not its launcher
            continue
        try:
            threads = dump_stacks(proc.info["pid"], timeout=10)
        except TrainwatchError:
            continue
        for thread in threads:
            ours = [f for f in thread.frames if Path(f.file).name in (Path(script).name, code.name)]
            if ours and ours[0].line == lines[0]:
                return True
    return False


def _elastic_dirs(pid: int) -> set[Path]:
    """The temp folders torchrun made for the job's ranks (``/tmp/torchelastic_*``, named in each
    rank's ``TORCHELASTIC_ERROR_FILE``): a torchrun killed leaves them behind."""
    found = set()
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return found
    for proc in procs:
        try:
            error_file = proc.environ().get("TORCHELASTIC_ERROR_FILE", "")
        except psutil.Error:
            continue
        found.update(d for d in Path(error_file).parents if d.name.startswith("torchelastic_"))
    return found


def kill_tree(pid: int, elastic: set[Path] | frozenset[Path] = frozenset()) -> None:
    """Kill a test job, every descendant, and anything left in its process group; then remove the
    temp folders its torchrun made (``elastic``: those seen earlier; torchrun never removes them)."""
    elastic = set(elastic) | _elastic_dirs(pid)
    stop_job_tree(pid, grace=0.5)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for folder in elastic:
        shutil.rmtree(folder, ignore_errors=True)


class OwnedTree:
    """A process a test started (``start()`` sets ``proc``): on stop, or leaving a ``with``, it and
    every descendant are killed (torchrun and sshd put children in sessions of their own), then
    reaped; nothing outlives the test."""

    proc: subprocess.Popen | None = None
    elastic: set[Path] = set()  # torchrun's temp folders, seen while it ran (removed on stop)

    def start(self):  # noqa: ANN201 (each subclass returns itself)
        raise NotImplementedError

    def stop(self) -> None:
        if self.proc is None:
            return
        kill_tree(self.proc.pid, self.elastic)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def __enter__(self):  # noqa: ANN204
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class PlantedJob(OwnedTree):
    """A real gloo job running ``tui/planted.py`` copied as ``train.py`` into ``workdir``, or,
    given ``script``, that job script (e.g. one of ``tests/jobs_frameworks/``) copied into
    ``workdir`` under its own name with its ``_*.py`` helpers beside it, run with
    ``--deadline``; ``script_args`` are added either way (``["--ddp"]`` for a planted DDP job).
    ``launcher``: torchrun, accelerate or deepspeed (their own command lines), python (one process),
    or lightning (`python script`: Lightning's launcher starts ranks 1..nproc-1 itself).
    ``max_restarts``: torchrun's ``--max-restarts`` (each attempt's ranks print ``attempt N``)."""

    def __init__(self, workdir: Path, scenario: str | None = None, nproc: int = 3, deadline: float = 60.0,
                 step_s: float = 0.05, launcher: str = "torchrun", extra_env: dict | None = None,
                 prefix: list[str] | None = None, monitor_interval: float | None = None,
                 script: Path | None = None, script_args: list[str] | None = None,
                 max_restarts: int | None = None) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        if script is None:
            assert scenario is not None, "a planted scenario or a job script"
            self.script = self.workdir / "train.py"
            shutil.copy(PLANTED, self.script)
            args = [str(self.script), "--scenario", scenario, "--deadline", str(deadline), "--step-s", str(step_s),
                    *(script_args or [])]
        else:
            script = Path(script)
            for helper in script.parent.glob("_*.py"):
                shutil.copy(helper, self.workdir / helper.name)
            self.script = self.workdir / script.name
            shutil.copy(script, self.script)
            args = [str(self.script), "--deadline", str(deadline), *(script_args or [])]
        if launcher == "torchrun":
            cmd = [*TORCHRUN, "--nproc-per-node", str(nproc), "--master-port", str(free_port())]
            if monitor_interval is not None:
                cmd += ["--monitor-interval", str(monitor_interval)]
            if max_restarts is not None:  # torchrun starts the whole group again when a rank fails
                cmd += ["--max-restarts", str(max_restarts)]
            cmd += args
        elif launcher in LAUNCH_COMMANDS:  # the framework's own launcher, as a user types it
            cmd = [str(Path(sys.executable).with_name(LAUNCH_COMMANDS[launcher][0])),
                   *(a.format(nproc=nproc, port=free_port()) for a in LAUNCH_COMMANDS[launcher][1:]), *args]
        else:  # plain python: one process, or ("lightning") one that starts the other ranks itself
            cmd = [sys.executable, *args]
        self.cmd = (prefix or []) + cmd
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(extra_env or {})}
        if launcher in ("python", "lightning"):
            self.env["MASTER_PORT"] = str(free_port())
        self.nproc = 1 if launcher == "python" else nproc
        self.log = self.workdir / "job.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "PlantedJob":
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, cwd=self.workdir, env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=default_signals)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def rank_pids(self) -> list[int]:
        """PIDs of the processes running train.py as ranks (not the launcher, not DataLoader workers)."""
        if self.nproc == 1 and "torch.distributed.run" not in self.cmd:
            return [self.pid]
        pids = []
        for child in psutil.Process(self.pid).children(recursive=True):
            try:
                cmd, parent_cmd = child.cmdline(), child.parent().cmdline()
            except (psutil.Error, AttributeError):
                continue
            if str(self.script) in cmd and "torch.distributed.run" not in cmd and "torch.distributed.run" in parent_cmd:
                pids.append(child.pid)
        return sorted(pids)

    def wait_for_ranks(self, timeout: float = 60.0, steps: int = 3) -> list[int]:
        """Wait until every rank runs and has printed its start line, plus a few steps."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log.read_text(errors="replace") if self.log.exists() else ""
            if text.count("scenario ") >= self.nproc:
                time.sleep(0.3 * steps)
                if self.proc is not None:
                    self.elastic = self.elastic | _elastic_dirs(self.proc.pid)
                return self.rank_pids()
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"job exited early ({self.proc.returncode}):\n{text[-3000:]}")
            time.sleep(0.2)
        raise TimeoutError(f"ranks did not start in {timeout}s:\n{self.log.read_text(errors='replace')[-3000:]}")

    def wait_for_log(self, *patterns: str, timeout: float = 60.0) -> str:
        """Poll the job's log until every regex in ``patterns`` matches (a job's marker lines);
        returns the log. Fails early, with the log's tail, when the job exits first."""
        deadline = time.monotonic() + timeout
        text = ""
        while True:
            text = self.log.read_text(errors="replace") if self.log.exists() else ""
            missing = [p for p in patterns if not re.search(p, text, re.M)]
            if not missing:
                if self.proc is not None:
                    self.elastic = self.elastic | _elastic_dirs(self.proc.pid)
                return text
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"job exited ({self.proc.returncode}) before {missing}:\n{text[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {missing} in the log within {timeout}s:\n{text[-3000:]}")
            time.sleep(0.2)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

