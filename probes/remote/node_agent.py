"""The node agent: keeps sampling this node's ranks and writes one compact line per poll.

Started by a viewer on another node (ssh, one ``srun`` step for all nodes, ``kubectl exec``), it
never outlives the viewer: it stops when its stdin closes, when its parent goes away (it is
re-parented), on SIGTERM/SIGHUP/SIGINT, or when stdout is gone. Lines it reads on stdin are
requests: ``{"full": [ranks], "native": [ranks]}`` (every thread of those ranks; native frames).
Ranks it does not run are ignored, so one request can be broadcast to every node. ``{"answer":
"first"}``: the viewer calls for the first answers, so that the first poll's window, if still
going, ends once half of it was watched (``live.MIN_FIRST_LOOK``). ``{"bundle":
ID}`` asks for this node's evidence bundle: the agent writes it (as ``trainwatch dump`` would) and
sends it back as wire lines (``wire.bundle_lines``), so a dump of a thousand nodes rides the agents
already running instead of a new connection per node.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from ..errors import TrainwatchError, UsageError
from .wire import bundle_lines, encode_line, error_line, whole

STOP_GRACE_S = 10.0  # after a stop, a poll still running gets this long before the agent exits anyway
PARENT_CHECK_S = 0.5


def node_name() -> str:
    """How the viewer knows this node: the SLURM node name inside a step, else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


class Requests:
    """What the viewer asked for (read from stdin by a thread); stops the agent on EOF."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.full: frozenset[int] = frozenset()
        self.full_all = False  # every thread of every rank (one-shot snapshots)
        self.native: frozenset[int] = frozenset()
        self.bundles: list[str] = []  # bundles asked for, not yet sent
        self.changed = threading.Event()
        self.answer_now = threading.Event()  # the viewer called for the first answer

    def read(self, stream: BinaryIO) -> None:
        try:
            for raw in stream:
                self._take(raw)
        except (OSError, ValueError):
            pass  # stdin unreadable: as good as closed
        self.stop.set()  # stdin closed: the viewer is gone

    def _take(self, raw: bytes) -> None:
        try:
            data = json.loads(raw)
        except ValueError:
            return  # not a request (a stray line on the terminal): ignored
        if isinstance(data, dict) and data.get("answer") == "first":
            self.answer_now.set()  # no new poll: it only ends the first window sooner
            return
        if isinstance(data, dict):
            self.full_all = data.get("full") == "all" or (self.full_all and "full" not in data)
            self.full = _ranks(data.get("full"), self.full)
            self.native = _ranks(data.get("native"), self.native)
            if isinstance(data.get("bundle"), str):
                self.bundles.append(data["bundle"])
            self.changed.set()


def _ranks(value: Any, default: frozenset[int]) -> frozenset[int]:
    if not isinstance(value, list):
        return default
    return frozenset(n for n in value if isinstance(n, int) and not isinstance(n, bool))


def watch_parent(stop: threading.Event, parent: int) -> None:
    """Stop when re-parented (the viewer's ssh/slurmstepd/kubectl side went away)."""
    while not stop.wait(PARENT_CHECK_S):
        if os.getppid() != parent:
            stop.set()


def die_with_parent() -> None:
    """Linux: SIGTERM when the parent dies, even while a poll is running (best effort)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # no prctl (not Linux): the agent still ends when its stdout breaks


def run_agent(open_source: Callable[[threading.Event], Any], interval: float, *, once: bool = False,
              stdin: BinaryIO | None = None, stdout: TextIO | None = None, node: str | None = None,
              write_bundle: Callable[[Any, Any, Path], Path] | None = None) -> int:
    """Poll ``open_source(answer_now)``'s source every ``interval`` s, one line each, until told to
    stop (``answer_now`` is set when the viewer calls for the first answer).
    ``write_bundle(source, snapshot, out_dir)`` writes this node's bundle as a .tar.gz when asked.

    ``open_source`` finds the job; while it cannot (no job here yet, or no longer), the agent writes
    an error line per interval and tries again. Returns the exit status (0 on a normal stop).
    """
    stdin = stdin if stdin is not None else sys.stdin.buffer
    stdout = stdout if stdout is not None else sys.stdout
    node = node or node_name()
    stop = threading.Event()
    requests = Requests(stop)
    parent = os.getppid()
    if not once:
        die_with_parent()
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # a viewer that vanished ends us at the next line
        threading.Thread(target=requests.read, args=(stdin,), name="tw-agent-stdin", daemon=True).start()
        threading.Thread(target=watch_parent, args=(stop, parent), name="tw-agent-parent", daemon=True).start()
        threading.Thread(target=_exit_after_stop, args=(stop,), name="tw-agent-deadline", daemon=True).start()
    source = None
    snap = None
    seq = 0
    if not once:  # connected: the viewer may start the next node
        stdout.write(json.dumps({"kind": "trainwatch-node", "v": 1, "node": node, "hello": True}) + "\n")
        stdout.flush()
    try:
        while not stop.is_set():
            while requests.bundles and not stop.is_set():  # asked for a bundle: sent before the next poll
                _send_bundle(stdout, node, requests.bundles.pop(0), source, snap, write_bundle)
            started = time.monotonic()
            seq += 1
            try:
                if source is None:
                    source = open_source(requests.answer_now)
                snap = source.poll(native_for=requests.native)
                full = (frozenset(r.rank for r in snap.ranks if r.rank is not None) if requests.full_all
                        else requests.full)
                line = encode_line(snap, node, full, seq)
            except TrainwatchError as exc:
                line = error_line(node, exc.message, exc.exit_code, seq)
                if once or isinstance(exc, UsageError):  # asking again cannot fix bad arguments
                    stdout.write(line + "\n")
                    stdout.flush()
                    return exc.exit_code
                if source is not None:
                    source.close()
                    source = None
            if stop.is_set():
                break
            stdout.write(whole(line) + "\n")
            stdout.flush()
            if once:
                return 0
            requests.changed.clear()
            # Wake early for a request (the selected rank's stacks), else on the interval.
            deadline = started + interval
            while not stop.is_set() and time.monotonic() < deadline:
                if requests.changed.wait(min(0.2, max(0.0, deadline - time.monotonic()))):
                    break
    except BrokenPipeError:
        pass  # the viewer went away: the agent's work is done
    finally:
        if source is not None:
            source.close()
    return 0


def _send_bundle(stdout: TextIO, node: str, bundle: str, source: Any, snap: Any,
                 write_bundle: Callable[[Any, Any, Path], Path] | None) -> None:
    """This node's bundle for request ``bundle``, written in a private temp dir, as wire lines."""
    with tempfile.TemporaryDirectory(prefix="trainwatch-agent-bundle-") as tmp:
        data, error = b"", None
        if write_bundle is None:
            error = "this agent cannot write bundles"
        elif source is None or snap is None:
            error = "no job read here yet"
        else:
            try:
                data = Path(write_bundle(source, snap, Path(tmp))).read_bytes()
            except TrainwatchError as exc:
                error = exc.message
            except OSError as exc:
                error = f"the bundle could not be read back: {exc.strerror or exc}"
        for line in bundle_lines(node, bundle, data, error):
            stdout.write(whole(line) + "\n")
        stdout.flush()


def _exit_after_stop(stop: threading.Event) -> None:
    """A poll can take a window and more: once told to stop, leave within the grace whatever it does."""
    stop.wait()
    time.sleep(STOP_GRACE_S)
    os._exit(0)
