"""Sample every rank's stacks in parallel, each py-spy call bounded, with counters around each dump."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from trainwatch.probes import procfs
from trainwatch.probes.errors import TrainwatchError
from trainwatch.probes.pyspy import DEFAULT_TIMEOUT, RankGone, dump_stacks
from trainwatch.probes.snapshot import ThreadStack

MAX_PARALLEL = 32


@dataclass(frozen=True)
class StackSample:
    pid: int
    threads: tuple[ThreadStack, ...] | None  # None: could not sample
    before: procfs.ThreadCounters | None
    after: procfs.ThreadCounters | None
    error: TrainwatchError | None = None
    reused: bool = False  # no py-spy call: the previous stacks were kept (see ProgressTracker.needs_dump)
    gone: bool = False


def sample_one(pid: int, native: bool, previous: tuple[ThreadStack, ...] | None,
               skip: bool, timeout: float = DEFAULT_TIMEOUT) -> StackSample:
    before = procfs.thread_counters(pid)
    if before is None:
        return StackSample(pid, None, None, None, gone=True)
    if skip and previous is not None and not native:
        return StackSample(pid, previous, before, before, reused=True)
    try:
        threads = tuple(dump_stacks(pid, native=native, timeout=timeout))
    except RankGone as exc:
        return StackSample(pid, None, before, None, error=exc, gone=True)
    except TrainwatchError as exc:
        return StackSample(pid, None, before, procfs.thread_counters(pid), error=exc)
    return StackSample(pid, threads, before, procfs.thread_counters(pid))


def sample_all(requests: list[tuple[int, bool, tuple[ThreadStack, ...] | None, bool]],
               timeout: float = DEFAULT_TIMEOUT) -> dict[int, StackSample]:
    """requests: (pid, native, previous stacks, skip the py-spy call) per rank."""
    if not requests:
        return {}
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(requests)), thread_name_prefix="tw-spy") as pool:
        futures = {req[0]: pool.submit(sample_one, *req, timeout) for req in requests}
        return {pid: future.result() for pid, future in futures.items()}
