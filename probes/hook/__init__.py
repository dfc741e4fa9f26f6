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
import json
import os
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
    })
    return True


def _implicit_run_dir() -> Path:
    """Without ``trainwatch run``: one directory per launcher, shared by its local ranks."""
    return rundir.implicit_run_dir(os.getuid(), os.getppid())


def _ensure_run_json(run_dir: Path, signal_no: int | None) -> None:
    try:
        fd = os.open(rundir.run_json(run_dir), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as out:
        json.dump({"command": None, "started_at": time.time(), "host": socket.gethostname(),
                   "faulthandler": {"signal": signal_no}, "armed_by": "import"}, out, indent=2)


def _arm_faulthandler(path: Path, rank: int) -> int | None:
    """Fatal signals and the on-demand signal both append to one file per rank."""
    import signal

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
            frames = traceback.extract_tb(tb)
            last = frames[-1] if frames else None
            rundir.write_json(path, {
                "pid": os.getpid(), "at": time.time(), "code": 1,
                "exception": "".join(traceback.format_exception_only(kind, value)).strip(),
                "frame": f"{last.filename}:{last.lineno} {last.name}" if last else None,
            })
        except Exception:
            pass
        previous(kind, value, tb)

    sys.excepthook = record


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
            return
        with conn:
            try:
                conn.settimeout(5.0)
                command = conn.recv(MAX_REQUEST).decode(errors="replace").strip()
                reply = handle(command)
                conn.sendall(json.dumps(reply).encode() + b"\n")
            except Exception:  # a broken client never takes the hook down
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
    except Exception as exc:
        return _err(f"{command} failed: {type(exc).__name__}: {exc}")
    return _err(f"unknown command {command!r}; expected one of {', '.join(COMMANDS)}")


def all_stacks() -> str:
    """Every Python thread's stack, in faulthandler's format, with thread names added."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    parts = []
    for ident, frame in sys._current_frames().items():
        label = "Current thread" if ident == me else "Thread"
        parts.append(f'{label} 0x{ident:016x} "{names.get(ident, "?")}" (most recent call first):')
        for entry in reversed(traceback.extract_stack(frame)):
            parts.append(f'  File "{entry.filename}", line {entry.lineno} in {entry.name}')
        parts.append("")
    return "\n".join(parts)


FR_FORMAT = "trainwatch-fr/2"  # read by trainwatch.probes.read.flightrec.hook_reply_traces
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
        if dump is None:
            errors[name] = (f"this torch has no torch._C._distributed_c10d.{function} "
                            "(built without it, or the private API changed)")
            continue
        try:
            raw = dump(**kwargs)
        except Exception as exc:  # e.g. no process group of that backend
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
