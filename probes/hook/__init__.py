"""The in-process hook: arms one rank of a job so its evidence survives a crash or a hang.

Loaded by ``probes/hook/armed/sitecustomize.py`` (``trainwatch run``), or by hand::

    import trainwatch.probes.hook  # first line of the training script

It arms only a rank's main process (``RANK`` set, and no armed ancestor: DataLoader
workers and other helpers inherit ``RANK``) and then:

* enables faulthandler for fatal signals, and registers it on ``FAULTHANDLER_SIGNAL`` for
  on-demand all-thread traces, both into ``ranks/<rank>/faulthandler.log``;
* tees fd 1 and 2 into ``ranks/<rank>/output.log`` through a helper process, so the tail
  of the output survives the rank dying (a thread would die with it);
* records an uncaught exception in ``ranks/<rank>/exit.json``;
* leaves last words: on SIGTERM or SIGINT (a launcher's teardown, ``timeout``, SLURM, Ctrl-C), or an
  uncaught exception, every thread's stack and the Flight Recorder go to
  ``ranks/<rank>/last-words.json`` (and faulthandler's trace to ``last-words.log``) before the
  signal does what it would have done anyway, at most ``LAST_WORDS_BUDGET_S`` later;
* serves ``ping``, ``stacks`` and ``fr_trace`` on ``ranks/<rank>/control.sock`` from a
  daemon thread. It never imports torch: ``fr_trace`` works only when the job already did, and
  returns both the NCCL Flight Recorder and the generic one (gloo).

Standard library only, nothing done while idle: the job's behaviour does not change.
"""

from __future__ import annotations

import atexit
import faulthandler
import hashlib
import importlib.util
import itertools
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

try:
    from .. import rundir
except ImportError:  # loaded by path into an interpreter without trainwatch installed
    _here = Path(__file__).resolve().parent  # probes/hook/; the run directory's layout lives in probes/rundir.py
    _spec = importlib.util.spec_from_file_location("_trainwatch_rundir", _here.parent / "rundir.py")
    rundir = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(rundir)

ARMED_PID_ENV = "TRAINWATCH_ARMED_PID"  # pid of the armed rank; inherited by its children
COMMANDS = ("ping", "stacks", "fr_trace")
MAX_REQUEST = 256
_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes on Linux

_state: dict[str, object] = {}


def should_arm(env: dict[str, str] | None = None, rank: int | None = None) -> bool:
    """True for a rank's main process (``RANK`` set, or ``rank`` known from its process group);
    False for launchers and for a rank's children."""
    env = os.environ if env is None else env
    if "RANK" not in env and rank is None:
        return False
    # Set: this is an armed rank's DataLoader worker or subprocess (or armed already).
    return not env.get(ARMED_PID_ENV)


def install(run_dir: str | Path | None = None, rank: int | None = None) -> bool:
    """Arm this process if it is a rank. ``rank``: its global rank when ``RANK`` is not in its
    environment (read from its process group once it has one). Returns whether it is armed now."""
    if _state or not should_arm(rank=rank):
        return bool(_state)
    if rank is None:
        try:
            rank = int(os.environ["RANK"])
        except ValueError:
            return False
    run_dir = Path(run_dir or os.environ.get("TRAINWATCH_RUN_DIR") or _implicit_run_dir()).resolve()
    own = rundir.rank_dir(run_dir, rank)
    own.mkdir(parents=True, exist_ok=True, mode=0o700)
    rundir.flight_dir(run_dir).mkdir(parents=True, exist_ok=True)
    os.environ[ARMED_PID_ENV] = str(os.getpid())
    _state.update(rank=rank, run_dir=run_dir, pid=os.getpid())

    signal_no = _arm_faulthandler(rundir.faulthandler_file(run_dir, rank), rank)
    tee_pid = _tee_output(rundir.rank_log_file(run_dir, rank))
    _hook_excepthook(rundir.exit_file(run_dir, rank))
    last_words = _arm_last_words(run_dir, rank)
    sock_path = _serve(run_dir, rank)
    if not os.environ.get("TRAINWATCH_RUN_DIR"):
        os.environ["TRAINWATCH_RUN_DIR"] = str(run_dir)
        _ensure_run_json(run_dir, signal_no)
    rundir.write_json(rundir.hook_json(run_dir, rank), {
        "rank": rank,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "host": socket.gethostname(),
        "started_at": time.time(),
        "socket": str(sock_path) if sock_path else None,
        "faulthandler_signal": signal_no,
        "faulthandler_file": str(rundir.faulthandler_file(run_dir, rank)),
        "log_file": str(rundir.rank_log_file(run_dir, rank)),
        "tee_pid": tee_pid,
        "torchelastic_error_file": os.environ.get("TORCHELASTIC_ERROR_FILE"),
        "restart_count": os.environ.get("TORCHELASTIC_RESTART_COUNT"),
        "last_words": last_words,
        "last_words_file": str(rundir.last_words_file(run_dir, rank)),
    })
    return True


def _implicit_run_dir() -> Path:
    """Without ``trainwatch run``: one directory per launcher, shared by its local ranks."""
    return rundir.implicit_run_dir(os.getuid(), os.getppid())


def _ensure_run_json(run_dir: Path, signal_no: int | None) -> None:
    try:
        fd = os.open(rundir.run_json(run_dir), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return  # another rank wrote it first
    with os.fdopen(fd, "w") as out:
        json.dump({"command": None, "started_at": time.time(), "host": socket.gethostname(),
                   "faulthandler": {"signal": signal_no}, "armed_by": "import"}, out, indent=2)


def _arm_faulthandler(path: Path, rank: int) -> int | None:
    """Fatal signals and the on-demand signal both append to one file per rank."""
    out = open(path, "a", buffering=1)
    out.write(f"=== trainwatch: rank {rank} pid {os.getpid()} started {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
    _state["fault_file"] = out  # faulthandler keeps only the fd: keep the file object alive
    faulthandler.enable(file=out, all_threads=True)
    signal_no = rundir.FAULTHANDLER_SIGNAL
    if signal.getsignal(signal_no) not in (signal.SIG_DFL, None):
        return None  # the job uses this signal itself: leave it alone
    faulthandler.register(signal_no, file=out, all_threads=True, chain=False)
    return signal_no


_TEE_CODE = r"""
import os, select, signal, sys
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
os.setsid()
log = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
pairs = {int(sys.argv[2]): int(sys.argv[3]), int(sys.argv[4]): int(sys.argv[5])}
while pairs:
    ready, _, _ = select.select(list(pairs), [], [])
    for src in ready:
        data = os.read(src, 65536)
        if not data:
            del pairs[src]
            continue
        try:
            os.write(log, data)
        except OSError:
            pass
        try:
            os.write(pairs[src], data)
        except OSError:
            pass
"""


def _tee_output(log_path: Path) -> int | None:
    """Send fd 1 and 2 through a helper process that copies them to the log and the terminal.

    The helper is its own session and ignores signals, so it drains every byte the rank
    wrote even when the rank is killed; it exits when the last writer closes the pipes.
    """
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        keep_out, keep_err = os.dup(1), os.dup(2)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        fds = (out_r, keep_out, err_r, keep_err)
        helper = subprocess.Popen(
            [sys.executable, "-S", "-E", "-c", _TEE_CODE, str(log_path), *map(str, fds), "trainwatch-tee"],
            pass_fds=fds, stdin=subprocess.DEVNULL, close_fds=True)
    except OSError:
        return None
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    for fd in (out_r, out_w, err_r, err_w, keep_out, keep_err):
        os.close(fd)
    return helper.pid


def _hook_excepthook(path: Path) -> None:
    previous = sys.excepthook

    def record(kind, value, tb) -> None:
        try:
            frames = _job_frames(tb)
            last = next((f for f in reversed(frames) if _own_code(f.filename)), frames[-1] if frames else None)
            rundir.write_json(path, {
                "pid": os.getpid(), "at": time.time(), "code": 1,
                "exception": "".join(traceback.format_exception_only(kind, value)).strip(),
                "frame": f"{last.filename}:{last.lineno} {last.name}" if last else None,
            })
        except Exception:  # noqa: BLE001 - inside the job's excepthook: the job's own traceback still prints
            pass
        words = _state.get("last_words")
        if isinstance(words, _LastWords) and os.getpid() == _state.get("pid"):
            _speak(words, "exception", time.monotonic() + LAST_WORDS_BUDGET_S, tb=tb)
        previous(kind, value, tb)

    sys.excepthook = record


_LIBRARY_DIRS = tuple({os.path.dirname(os.__file__) + os.sep, os.sep + "site-packages" + os.sep,
                       os.sep + "dist-packages" + os.sep})


def _own_code(filename: str) -> bool:
    """A file of the job's own, not the standard library's nor an installed package's: the frame
    an uncaught exception is recorded at (torch's innermost frame says nothing of the job)."""
    return not filename.startswith("<") and not any(part in filename for part in _LIBRARY_DIRS)


def _job_frames(tb: object) -> traceback.StackSummary:
    """The traceback's frames without the hook's own at its end: a KeyboardInterrupt raised by
    default_int_handler, chained from the hook's SIGINT handler, is the job's."""
    frames = traceback.extract_tb(tb)
    while len(frames) > 1 and frames[-1].filename == __file__:
        frames.pop()
    return frames


# -- last words ----------------------------------------------------------------------------------
# A hung rank's main thread is blocked in C++ (a gloo or NCCL wait): a Python signal handler runs
# only once that call returns, which may be never. So for SIGTERM and SIGINT, on top of a Python
# handler that chains to the job's: faulthandler's C handler writes every thread's stack at once
# (into last-words.log), and Python's wakeup fd wakes a daemon thread, which writes last-words.json
# (stacks and Flight Recorder: the waits release the GIL) and, for a signal whose action was the
# default one, makes the process die by that signal. Nothing runs until a signal comes.

LAST_WORDS_FORMAT = "trainwatch-last-words/1"
LAST_WORDS_SIGNALS = ("SIGTERM", "SIGINT")
LAST_WORDS_BUDGET_S = 1.0  # the most a signal is delayed by the writing
# A signal that comes while another path writes (an uncaught exception's, as a launcher's SIGTERM
# follows a peer's death) waits for that writing this long: the process is ending by its exception
# anyway, and on a loaded node those last words take seconds (their Flight Recorder was cut at 1 s).
LAST_WORDS_JOINED_S = 8.0
_POLL_S = 0.002


class _LastWords:
    """What the signal handlers, the listener thread and the excepthook share.

    Only atomic operations under the GIL and Event.is_set() are used from the main thread: a
    Python signal handler may run in the middle of any of this code there, so a lock taken by the
    interrupted code would deadlock it."""

    def __init__(self, path: Path, rank: int) -> None:
        self.path = path
        self.rank = rank
        self.handlers: dict[int, object] = {}  # signal -> our Python handler
        self.previous: dict[int, object] = {}  # signal -> the handler ours chains to
        self.log = None  # faulthandler's file: kept alive (faulthandler keeps only the fd)
        self.log_start = 0  # its size when armed: what faulthandler writes at our signal comes after
        self.wakeup_fd: int | None = None  # the pipe's ends: Python's C handler writes, the listener reads
        self.read_fd: int | None = None
        self.listener: threading.Thread | None = None
        self.reading = False  # the listener is taking bytes out of the pipe
        self.libc_signal = None  # C signal(): resets a disposition from a thread other than main
        self.writer: str | None = None  # the trigger whose path writes the last words
        self.heard = threading.Event()  # the listener read a signal of ours
        self.done = threading.Event()  # the last words are written (or given up)
        self._tickets = itertools.count()
        self._times: dict[str, float] = {}

    def claim(self) -> bool:
        """True once per process: whoever gets it writes the last words."""
        return next(self._tickets) == 0

    def deadline(self) -> float:
        """LAST_WORDS_BUDGET_S after the first signal (monotonic): the most any waits."""
        return self._times.setdefault("first", time.monotonic()) + LAST_WORDS_BUDGET_S


def _arm_last_words(run_dir: Path, rank: int) -> dict[str, str]:
    """Arm SIGTERM and SIGINT for last words where the job's handler can be chained; returns
    what was done to each (for hook.json)."""
    words = _LastWords(rundir.last_words_file(run_dir, rank), rank)
    _state["last_words"] = words  # the excepthook's last words, whatever happens below
    if threading.current_thread() is not threading.main_thread():
        why = "left alone: armed outside the main thread (Python sets signal handlers only there)"
        return {name: why for name in LAST_WORDS_SIGNALS}
    notes: dict[str, str] = {}
    for name in LAST_WORDS_SIGNALS:
        signum = int(getattr(signal, name))
        previous = signal.getsignal(signum)
        why = _not_chainable(previous)
        if why is None and previous is signal.SIG_DFL and words.libc_signal is None:
            words.libc_signal = _libc_signal()
            if words.libc_signal is None:
                why = "cannot restore the default action from a thread (no ctypes)"
        if why:
            notes[name] = f"left alone: {why}"
            continue
        try:
            if words.log is None:
                words.log = open(rundir.last_words_log(run_dir, rank), "a", buffering=1)
                words.log_start = os.fstat(words.log.fileno()).st_size
            handler = _signal_handler(words, previous)
            signal.signal(signum, handler)  # first: faulthandler chains to the handler it finds
            faulthandler.register(signum, file=words.log, all_threads=True, chain=True)
        except (OSError, ValueError, RuntimeError) as exc:
            if signal.getsignal(signum) is not previous:
                signal.signal(signum, previous)
            notes[name] = f"left alone: {type(exc).__name__}: {exc}"
            continue
        words.handlers[signum], words.previous[signum] = handler, previous
        notes[name] = "armed"
    if words.handlers:
        notes["listener"] = _start_listener(words)
        os.register_at_fork(after_in_child=_forget_last_words)
        atexit.register(_await_last_words)
    return notes


def _not_chainable(previous: object) -> str | None:
    """Why a signal with this Python handler is left alone, or None when ours can chain to it."""
    if previous is signal.SIG_IGN:
        return "the job ignores it (SIG_IGN)"
    if previous is None:
        return "its handler was not installed from Python"
    if previous is signal.SIG_DFL or callable(previous):  # default_int_handler is a callable too
        return None
    return f"unknown handler {previous!r}"


def _libc_signal():  # noqa: ANN202 (a ctypes function)
    try:
        import ctypes
        function = ctypes.CDLL(None).signal
    except (ImportError, OSError, AttributeError):
        return None
    function.restype = ctypes.c_void_p
    function.argtypes = (ctypes.c_int, ctypes.c_void_p)
    return function


def _signal_handler(words: _LastWords, previous: object):  # noqa: ANN202
    def on_signal(signum: int, frame: object) -> object:
        if os.getpid() == _state.get("pid"):  # not a forked child: those act exactly as before
            if (previous is signal.SIG_DFL and words.listener is not None and not words.done.is_set()
                    and words.writer not in (None, *LAST_WORDS_SIGNALS)):
                # This handler interrupted the exception's last words on this very thread: waiting
                # here would only wait out their budget. Let them finish; the listener ends the
                # process by this signal once they are written (LAST_WORDS_JOINED_S at most).
                return None
            deadline = words.deadline()
            if words.listener is not None and _wait_for(words.heard, min(deadline, time.monotonic() + 0.2)):
                _wait_for(words.done, deadline)  # the listener is writing them
            else:  # no listener, or its wakeup fd was taken over: write them here
                _speak(words, rundir.signal_name(signum), deadline, then_die=previous is signal.SIG_DFL,
                       signum=signum)
        if previous is signal.SIG_DFL:
            _die_by(words, signum)
            return None
        return previous(signum, frame)  # the job's handler, or default_int_handler's KeyboardInterrupt

    on_signal.__qualname__ = "trainwatch_last_words"
    return on_signal


def _wait_for(event: threading.Event, deadline: float) -> bool:
    """Poll: Event.wait takes a lock that the code this signal handler interrupted may hold."""
    while not event.is_set() and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    return event.is_set()


def _start_listener(words: _LastWords) -> str:
    try:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # as Python requires of a wakeup fd
        os.set_blocking(read_fd, False)
    except OSError as exc:
        return f"not started: {exc}"
    try:
        old = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except (ValueError, OSError) as exc:
        os.close(read_fd)
        os.close(write_fd)
        return f"not started: {exc}"
    if old != -1:  # someone's already (an event loop): keep theirs; the Python handler writes them
        signal.set_wakeup_fd(old)
        os.close(read_fd)
        os.close(write_fd)
        return f"not started: the wakeup fd is taken (fd {old}); last words only once the main thread runs Python"
    listener = threading.Thread(target=_listen, args=(words, read_fd), name="trainwatch-last-words", daemon=True)
    words.wakeup_fd, words.read_fd = write_fd, read_fd
    try:
        listener.start()
    except RuntimeError as exc:  # can't start new thread
        signal.set_wakeup_fd(-1)
        words.wakeup_fd = words.read_fd = None
        os.close(read_fd)
        os.close(write_fd)
        return f"not started: {exc}"
    words.listener = listener
    return "started"


def _listen(words: _LastWords, read_fd: int) -> None:
    """The listener thread: Python's C signal handler writes each signal's number to the pipe.
    ``reading`` is set before a byte leaves the pipe, so the exit path knows it is in hand."""
    poller = select.poll()  # not select.select: no limit on the fd's number
    poller.register(read_fd, select.POLLIN)
    while True:
        try:
            poller.poll()
            words.reading = True
            data = os.read(read_fd, 64)  # non-blocking: the exit path may have taken it meanwhile
        except BlockingIOError:
            words.reading = False
            continue
        except (OSError, ValueError):
            return  # the pipe closed: the hook is being let go
        if not data:
            return
        for signum in data:
            if signum in words.handlers:
                _heard(words, signum)
        words.reading = False


def _heard(words: _LastWords, signum: int) -> None:
    words.heard.set()
    deadline = words.deadline()
    # Ours may have been replaced by the job's own handler since: then that one decides.
    then_die = signal.getsignal(signum) is words.handlers[signum] and words.previous[signum] is signal.SIG_DFL
    trigger = rundir.signal_name(signum)
    _speak(words, trigger, deadline, then_die=then_die, signum=signum)
    if then_die:
        # Another path may be writing them (an uncaught exception's, as a launcher's SIGTERM follows a
        # peer's death): the signal waits for its Flight Recorder, longer than for its own.
        joined = words.writer != trigger  # ours was not claimed: another path holds the writing
        _wait_for(words.done, time.monotonic() + LAST_WORDS_JOINED_S if joined else deadline)
        _die_by(words, signum)


def _speak(words: _LastWords, trigger: str, deadline: float, then_die: bool = False, signum: int = 0,
           tb: object = None) -> None:
    """Write the last words, once per process. With ``then_die``, off the main thread, a timer makes
    the process die by ``signum`` at ``deadline`` should the writing take longer. (On the main
    thread no timer: starting a thread takes a lock the interrupted code may hold.)"""
    if not words.claim():
        return
    words.writer = trigger
    timer = None
    try:
        if then_die and threading.current_thread() is not threading.main_thread():
            timer = threading.Timer(max(0.0, deadline - time.monotonic()), _die_by, args=(words, signum))
            timer.name, timer.daemon = "trainwatch-last-words-deadline", True
            timer.start()
        _write_last_words(words, trigger, deadline, tb)
    except Exception:  # noqa: BLE001 - last words never take the job down, nor keep it from ending
        pass
    finally:
        words.done.set()
        if timer is not None:
            timer.cancel()


def _write_last_words(words: _LastWords, trigger: str, deadline: float, tb: object) -> None:
    """The stacks first, written at once; then again with the Flight Recorder, which a wedged
    communicator could keep from ever returning (the process dies at ``deadline`` regardless)."""
    started = time.monotonic()
    record = {
        "format": LAST_WORDS_FORMAT, "rank": words.rank, "pid": os.getpid(), "host": socket.gethostname(),
        "trigger": trigger, "at": time.time(),
        # At a signal, faulthandler's dump of that instant: a moment later the job's code may have
        # moved on (a wait that the signal interrupted raises, and the stack unwinds).
        "stacks": (tb is None and _stacks_at_signal(words)) or all_stacks(current=_job_frames(tb) if tb is not None else None),
        "fr": None, "fr_error": f"the Flight Recorder dump did not finish within {LAST_WORDS_BUDGET_S:g} s",
        "elapsed_s": None,
    }
    if "torch" in sys.modules and time.monotonic() < deadline:
        record["elapsed_s"] = round(time.monotonic() - started, 4)
        rundir.write_json(words.path, record)
        reply = fr_trace()
    elif time.monotonic() < deadline:
        reply = fr_trace()  # cheap: says torch is not imported
    else:
        reply = _err(f"not asked: the stacks took the whole {LAST_WORDS_BUDGET_S:g} s")
    record["fr"], record["fr_error"] = (reply["text"], None) if reply["ok"] else (None, reply["error"])
    record["elapsed_s"] = round(time.monotonic() - started, 4)
    rundir.write_json(words.path, record)


def _die_by(words: _LastWords, signum: int) -> None:
    """What the default action would have done: die by ``signum``, so the parent's wait status says so."""
    try:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signum, signal.SIG_DFL)
        else:  # Python's signal.signal works only in the main thread, which may be blocked in C++
            words.libc_signal(signum, None)
        os.kill(os.getpid(), signum)
    except (OSError, ValueError, TypeError):
        pass  # inside the job: its own end goes on as it would have


def _forget_last_words() -> None:
    """In a forked child (a DataLoader worker): no faulthandler trace into the parent's file, no
    wakeup byte into the parent's pipe (its listener would take the child's signal for its own).
    The signals get back the handlers they had before arming (unless the job changed them since)."""
    words = _state.get("last_words")
    if not isinstance(words, _LastWords):
        return
    for signum, handler in words.handlers.items():
        try:
            faulthandler.unregister(signum)
            if signal.getsignal(signum) is handler:  # the job's own disposition, as before arming
                signal.signal(signum, words.previous[signum])
        except (RuntimeError, ValueError, OSError):
            pass  # disarming inside the job: what cannot be undone stays as armed
    if words.wakeup_fd is not None:
        try:
            old = signal.set_wakeup_fd(-1)
            if old != words.wakeup_fd:  # the job's since: keep it
                signal.set_wakeup_fd(old)
        except (ValueError, OSError):
            pass  # not the main thread: the wakeup fd stays as it is


def _await_last_words() -> None:
    """At exit: the job's own handler (installed after ours) may end the process before the
    listener has written; wait for it, within the budget, or write them here if the listener has
    not read the signal yet. Nothing to wait for on an ordinary exit."""
    words = _state.get("last_words")
    if not isinstance(words, _LastWords) or os.getpid() != _state.get("pid") or words.done.is_set():
        return
    ours = [signum for signum in _pending_signals(words) if signum in words.handlers]
    if ours:
        _speak(words, rundir.signal_name(ours[0]), words.deadline())
    until = time.monotonic() + LAST_WORDS_BUDGET_S
    while words.reading and not words.heard.is_set() and time.monotonic() < until:
        time.sleep(_POLL_S)  # the listener holds bytes it read: let it say whether one is ours
    if words.heard.is_set() or "first" in words._times:
        _wait_for(words.done, words.deadline())


def _pending_signals(words: _LastWords) -> bytes:
    """The signal numbers in the wakeup pipe that the listener has not read (taken out of it)."""
    data = b""
    if words.read_fd is None:
        return data
    try:
        while chunk := os.read(words.read_fd, 64):  # non-blocking
            data += chunk
    except OSError:  # BlockingIOError: nothing (more) in it
        pass
    return data


def _serve(run_dir: Path, rank: int) -> Path | None:
    path = rundir.control_socket(run_dir, rank)
    if len(os.fsencode(str(path))) > _SOCKET_PATH_MAX:
        digest = hashlib.sha1(str(run_dir).encode()).hexdigest()[:12]
        short = Path(tempfile.gettempdir()) / f"trainwatch-{os.getuid()}"
        short.mkdir(mode=0o700, exist_ok=True)
        path = short / f"{digest}-{rank}.sock"
    try:
        path.unlink(missing_ok=True)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # owner-only from the moment it exists
        try:
            server.bind(str(path))
        finally:
            os.umask(old_umask)
        server.listen(4)
    except OSError:
        return None
    _state["server"] = server
    threading.Thread(target=_accept_loop, args=(server,), name="trainwatch-hook", daemon=True).start()
    atexit.register(_cleanup, path)
    return path


def _cleanup(path: Path) -> None:
    if os.getpid() == _state.get("pid"):  # not in a forked child
        path.unlink(missing_ok=True)


def _accept_loop(server: socket.socket) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return  # the socket was closed: the hook is being let go
        with conn:
            try:
                conn.settimeout(5.0)
                command = conn.recv(MAX_REQUEST).decode(errors="replace").strip()
                reply = handle(command)
                conn.sendall(json.dumps(reply).encode() + b"\n")
            except Exception:  # noqa: BLE001 - a broken client never takes the hook down
                continue


def handle(command: str) -> dict:
    """Answer one request: ``{"ok": bool, "text": str, "error": str | None}``."""
    try:
        if command == "ping":
            return _ok(json.dumps({"rank": _state.get("rank"), "pid": os.getpid()}))
        if command == "stacks":
            return _ok(all_stacks())
        if command == "fr_trace":
            return fr_trace()
    except Exception as exc:  # noqa: BLE001 - the job's own process: the client gets the error
        return _err(f"{command} failed: {type(exc).__name__}: {exc}")
    return _err(f"unknown command {command!r}; expected one of {', '.join(COMMANDS)}")


def all_stacks(current: traceback.StackSummary | None = None) -> str:
    """Every Python thread's stack, in faulthandler's format, with thread names added.
    ``current``: the calling thread's stack to show instead of its own (an exception's)."""
    names = _thread_names()
    me = threading.get_ident()
    parts = []
    for ident, frame in sys._current_frames().items():
        label = "Current thread" if ident == me else "Thread"
        parts.append(f'{label} 0x{ident:016x} "{names.get(ident, "?")}" (most recent call first):')
        for entry in reversed(current if current is not None and ident == me else traceback.extract_stack(frame)):
            parts.append(f'  File "{entry.filename}", line {entry.lineno} in {entry.name}')
        parts.append("")
    return "\n".join(parts)


_DUMP_HEADER = re.compile(r"^(Thread|Current thread) 0x([0-9a-f]+) \(most recent call first\):$", re.M)
MAX_DUMP_BYTES = 1 << 20


def _stacks_at_signal(words: _LastWords) -> str | None:
    """What faulthandler wrote into the last-words log when our signal arrived (its C handler runs
    before ours), with thread names added as :func:`all_stacks` writes them; None without one."""
    if words.log is None:
        return None
    try:
        with open(words.log.name, errors="replace") as handle:
            handle.seek(words.log_start)
            text = handle.read(MAX_DUMP_BYTES)
    except OSError:
        return None
    if not _DUMP_HEADER.search(text):
        return None
    names = _thread_names()

    def named(found: re.Match) -> str:
        name = names.get(int(found.group(2), 16))
        label = f' "{name}"' if name else ""
        return f"{found.group(1)} 0x{found.group(2)}{label} (most recent call first):"

    return _DUMP_HEADER.sub(named, text)


def _thread_names() -> dict[int, str]:
    """Thread names by ident. Not threading.enumerate(): it takes a lock that the code a signal
    handler interrupted may hold (last words are written from one)."""
    active = getattr(threading, "_active", None)
    if isinstance(active, dict):
        return {ident: thread.name for ident, thread in list(active.items())}
    return {thread.ident: thread.name for thread in threading.enumerate()}


FR_FORMAT = "trainwatch-fr/2"  # read by trainwatch.probes.read.collectives.flightrec.hook_reply_traces
# NCCL keeps its own recorder; the generic one (gloo and other backends) is empty on NCCL jobs.
FR_DUMPS = (("nccl", "_dump_nccl_trace_json", {"includeCollectives": True, "onlyActive": False}),
            ("generic", "_dump_fr_trace_json", {}))


def fr_trace() -> dict:
    """Both Flight Recorders (NCCL's and the generic one) as JSON text, from torch's own dumps.

    The reply text is ``{"format", "nccl": <JSON text or null>, "generic": <JSON text or null>,
    "errors": {...}}``; each part is torch's dump unchanged. Never imports torch.
    """
    if "torch" not in sys.modules:
        return _err("torch is not imported in this process: no Flight Recorder to dump")
    c10d = sys.modules.get("torch._C._distributed_c10d")
    parts: dict[str, str | None] = {"nccl": None, "generic": None}
    errors: dict[str, str] = {}
    for name, function, kwargs in FR_DUMPS:
        dump = getattr(c10d, function, None)
        if dump is None and name == "nccl" and not hasattr(c10d, "ProcessGroupNCCL"):
            continue  # a torch built without NCCL (CPU): the job cannot use NCCL, nothing to say of it
        if dump is None:
            errors[name] = (f"this torch has no torch._C._distributed_c10d.{function} "
                            "(built without it, or the private API changed)")
            continue
        try:
            raw = dump(**kwargs)
        except Exception as exc:  # noqa: BLE001 - e.g. no process group of that backend
            errors[name] = f"{function} failed: {type(exc).__name__}: {exc}"
            continue
        parts[name] = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    if not any(parts.values()):
        return _err("; ".join(errors.values()))
    return _ok(json.dumps({"format": FR_FORMAT, **parts, "errors": errors}))


def _ok(text: str) -> dict:
    return {"ok": True, "text": text, "error": None}


def _err(message: str) -> dict:
    return {"ok": False, "text": "", "error": message}


install()
