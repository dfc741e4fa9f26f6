"""A snapshot source for a job that spans nodes: this node's probe plus every other node's, merged.

Other nodes are asked in parallel (at most ``parallel`` at once), each call bounded by
``timeout``. ``poll`` waits at most ``wait_s`` for them: a node still busy after that does not
hold the others back; its last good snapshot is shown with a note (or its last error), and its
answer is picked up by a later poll.
"""

from __future__ import annotations

import contextlib
import inspect
import socket
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from ..errors import TrainwatchError
from ..judge.judgement import JudgeMemory
from .merge import NodeView, merge_nodes
from .remote import (
    DEFAULT_PARALLEL, DEFAULT_TIMEOUT_S, NodeResult, Remote, Runner, collect_remote_bundles,
    fetch_snapshot, snapshot_args,
)
from ..snapshot import Snapshot

KILL_GRACE_S = 2.5


class NodeEvidence:
    """What every multi-node source does alike: pause the local probe's judgement while evidence is
    taken (other nodes judge their own progress), and fetch the other nodes' bundles one-shot."""

    local: Any
    remotes: Sequence[Any]
    timeout: float
    trainwatch: Any
    match: Any
    parallel: Any
    runner: Any
    _local_takes_native: bool

    def _poll_local(self, native_for: frozenset[int]) -> NodeView:
        """This node, read by the local source (a failure is this node's error, not the view's)."""
        name = socket.gethostname()
        try:
            snap = self.local.poll(native_for=native_for) if self._local_takes_native else self.local.poll()
        except TrainwatchError as exc:
            return NodeView(name=name, error=exc.message, local=True)
        return NodeView(name=snap.job.host or name, snapshot=snap, local=True)

    def paused_judgement(self) -> AbstractContextManager[None]:
        if self.local is None:
            return contextlib.nullcontext()
        return self.local.paused_judgement()

    def collect_bundles(self, bundle_dir: Path, timeout: float | None = None) -> list[str]:
        """Fetch every other node's evidence bundle into ``<bundle_dir>/hosts/<node>/``."""
        return collect_remote_bundles(self.remotes, Path(bundle_dir), timeout or self.timeout,
                                      trainwatch=self.trainwatch, match=self.match,
                                      parallel=self.parallel, runner=self.runner)


class MultiNodeSource(NodeEvidence):
    """Polls this node (``local_source``, may be None) and ``remotes``; returns one merged Snapshot."""

    def __init__(self, local_source: Any, remotes: Sequence[Remote], *, match: list[str],
                 trainwatch: str = "trainwatch", timeout: float = DEFAULT_TIMEOUT_S,
                 wait_s: float | None = None, parallel: int = DEFAULT_PARALLEL,
                 window: float | None = None, reuse_s: float = 300.0,
                 world_size: int | None = None, runner: Runner | None = None,
                 extra_args: Sequence[str] = ()) -> None:
        self.local = local_source
        self.remotes = list(remotes)
        self.match = list(match)
        self.trainwatch = trainwatch
        self.timeout = timeout
        # One-shot commands wait for the timeout itself plus time to kill and reap the child.
        self.wait_s = timeout + KILL_GRACE_S if wait_s is None else wait_s
        self.parallel = parallel
        self.reuse_s = reuse_s
        self.world_size = world_size
        self.args = snapshot_args(self.match, window, list(extra_args))
        self.runner = runner or Runner()
        self.memory = JudgeMemory()  # the merged view's own judgement across polls
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(parallel, len(self.remotes) or 1)),
                                        thread_name_prefix="trainwatch-remote")
        self._inflight: dict[int, Future[NodeResult]] = {}
        self._latest: dict[int, NodeResult] = {}
        self._good: dict[int, NodeResult] = {}
        self._local_takes_native = poll_accepts(local_source, "native_for")

    def __getattr__(self, name: str) -> Any:
        """Anything else (job, window, pid...) is the local source's."""
        local = self.__dict__.get("local")
        if local is None:
            raise AttributeError(name)
        return getattr(local, name)

    def poll(self, native_for: frozenset[int] = frozenset()) -> Snapshot:
        started = time.time()
        for index, remote in enumerate(self.remotes):
            self._harvest(index)
            if index not in self._inflight:
                args = [*self.args, "--native"] if native_for else self.args
                self._inflight[index] = self._pool.submit(
                    fetch_snapshot, remote, self.runner, self.trainwatch, args, self.timeout)
        views = [self._poll_local(native_for)] if self.local is not None else []
        remaining = self.wait_s - (time.time() - started)
        if self._inflight:
            wait_futures(list(self._inflight.values()), timeout=max(0.0, remaining))
        for index in range(len(self.remotes)):
            self._harvest(index)
            views.append(self._view(index, started))
        if not any(v.snapshot is not None for v in views):
            reasons = "; ".join(f"{v.name}: {v.error}" for v in views)
            raise TrainwatchError(f"no node of the job could be read ({reasons})")
        return merge_nodes(views, memory=self.memory, world_size=self.world_size)

    def _harvest(self, index: int) -> None:
        future = self._inflight.get(index)
        if future is None or not future.done():
            return
        del self._inflight[index]
        try:
            result = future.result()
        except Exception as exc:  # a bug in parsing must not take the whole view down
            result = NodeResult(self.remotes[index], error=f"internal error: {exc!r}")
        self._latest[index] = result
        if result.snapshot is not None:
            self._good[index] = result

    def _view(self, index: int, started: float) -> NodeView:
        name = self.remotes[index].name
        latest, good = self._latest.get(index), self._good.get(index)
        fresh = latest is not None and latest.at >= started and index not in self._inflight
        if fresh and latest.snapshot is not None:
            return NodeView(name=name, snapshot=latest.snapshot, note=latest.note)
        if fresh:
            return NodeView(name=name, error=latest.error)
        if good is not None and time.time() - good.at <= self.reuse_s and latest is good:
            return NodeView(name=name, snapshot=good.snapshot, stale_s=time.time() - good.at, note=good.note)
        if latest is not None and latest.error:
            return NodeView(name=name, error=f"{latest.error} (asking again)")
        return NodeView(name=name, error=f"slow: no answer after {self.wait_s:g}s (still waiting, up to {self.timeout:g}s)")

    def close(self) -> None:
        """Kill every remote call still running and stop the workers; closes the local source too."""
        self.runner.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        close = getattr(self.local, "close", None)
        if callable(close):
            close()


def poll_accepts(obj: Any, keyword: str) -> bool:
    """Whether ``obj.poll`` takes ``keyword`` (local sources of older shapes do not)."""
    poll = getattr(obj, "poll", None)
    if poll is None:
        return False
    try:
        return keyword in inspect.signature(poll).parameters
    except (TypeError, ValueError):
        return False
