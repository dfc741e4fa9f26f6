"""When to take a native (C/C++) sample of a rank, and what it said, cached per Python stack.

The Python stack alone cannot tell a rank spinning in ``cuStreamSynchronize`` behind a stuck NCCL
collective from one running a long kernel, nor DDP's gradient all_reduce inside ``backward``
from the backward pass itself. A native sample can, but ``py-spy dump --native`` pauses the rank
(0.2-1.2 s on a CUDA process) and py-spy itself may use ~500 MB. So it is taken only when it
decides the judgement:

* the rank's Python stack did not change since the last sample (a moving rank needs none);
* its place is ambiguous: compute (``backward``, ``forward``, a user line that may hide a CUDA
  call), unknown, or a lock (``work.wait()`` of an async collective or a point-to-point op reads
  as a lock from the Python line alone); a Python-visible collective, DataLoader or sleep is clear;
* it did not block and wake up since the last look (a rank that keeps waking is working);
* no native sample exists yet for this exact Python stack. A cached result that said "compute"
  is retaken after ``RECHECK_COMPUTE_S`` (the line may have moved on to a sync point since), and
  as soon as a rank it was taken of while on a CPU (kernel state R) is found asleep: it computed
  then, and waits now (DDP's backward, read under load while it still ran, then blocked in its
  gradient all_reduce at the same Python line).

Ranks whose Python stacks are identical share one native sample (STAT-style equivalence classes:
the seven ranks waiting in DDP's backward while the eighth sleeps cost one dump, not seven); the
others say which PID's sample decided their phase. At most ``MAX_PER_POLL`` ranks get one per poll (a whole 8-GPU node in one poll), ``PARALLEL`` at a
time, so py-spy's memory stays bounded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from .phases import Classification, SourceLine, classify, main_thread, stack_signature
from .progress import StackWatch
from ..observed import StackSample
from ..snapshot import Phase, ThreadStack
from ..record import Record

# A "lock" read from the Python line alone (``work.wait()``, ``.acquire(``) may be a c10d work wait:
# the native frames tell (``c10d::Work::wait``, ``ProcessGroupGloo::RecvWork::wait``).
# A "native" one (idle, holding the GIL) is named by its native frames: the C function it is in.
AMBIGUOUS_PHASES: frozenset[Phase] = frozenset({"compute", "unknown", "lock", "native"})
RECHECK_COMPUTE_S = 15.0
MAX_PER_POLL = 8
PARALLEL = 4


@dataclass(frozen=True, repr=False)
class NativeResult(Record):
    """What a rank's native stack says it waits in, and since when it was taken."""

    signature: tuple
    threads: tuple[ThreadStack, ...]
    classification: Classification
    at: float
    running: bool = False  # the rank was on (or waiting for) a CPU when sampled: "compute" was then


class NativeCache:
    """Per-PID native samples, valid while the rank's Python stack stays the same."""

    def __init__(self) -> None:
        self._results: dict[int, NativeResult] = {}
        self.taken = 0  # native samples taken so far (for benchmarks and notes)

    def lookup(self, pid: int, signature: tuple) -> NativeResult | None:
        """The native result for this exact Python stack, if one was taken."""
        result = self._results.get(pid)
        return result if result is not None and result.signature == signature else None

    def wanted(self, pid: int, signature: tuple, classification: Classification, unchanged: bool,
               woke: bool, now: float, asleep: bool = False) -> bool:
        """Whether a native sample of this rank would decide its judgement now (``asleep``: the
        kernel has its thread asleep now)."""
        if not signature or not unchanged or woke or classification.phase not in AMBIGUOUS_PHASES:
            return False
        known = self.lookup(pid, signature)
        if known is None:
            return True
        return outdated(known, asleep) or (known.classification.phase == "compute"
                                            and now - known.at >= RECHECK_COMPUTE_S)

    def store(self, pid: int, signature: tuple, threads: tuple[ThreadStack, ...],
              classification: Classification, now: float, running: bool = False) -> None:
        self._results[pid] = NativeResult(signature, threads, classification, now, running)

    def forget(self, pid: int) -> None:
        self._results.pop(pid, None)


def outdated(known: NativeResult, asleep: bool) -> bool:
    """A "compute" read while the rank was on a CPU no longer says what it does once it sleeps."""
    return known.classification.phase == "compute" and known.running and asleep


def _asleep(sample: StackSample) -> bool:
    return sample.kernel is not None and sample.kernel.letter in ("S", "D")


def _running(sample: StackSample) -> bool:
    return sample.kernel is not None and sample.kernel.letter == "R"


def resolve_natively(samples: dict[int, StackSample], classified: dict[int, Classification], cache: NativeCache,
                     tracker: StackWatch, now: float,
                     take_native: Callable[[list[int]], dict[int, StackSample]],
                     source_line: SourceLine | None = None,
                     ) -> tuple[dict[int, StackSample], dict[int, Classification]]:
    """Replace ambiguous plain samples by native ones (taken now through ``take_native``, or cached
    for the very same Python stack) and their classification. Call before ``tracker.observe``."""
    samples, classified = dict(samples), dict(classified)
    wanted: list[int] = []
    for pid, cls in classified.items():
        sample = samples[pid]
        if any(t.frames and t.frames[0].native for t in sample.threads or ()):
            continue  # already a native dump (the user asked for one)
        signature = stack_signature(main_thread(sample.threads))
        unchanged = tracker.signature(pid) == signature
        cached = cache.lookup(pid, signature)
        if cache.wanted(pid, signature, cls, unchanged, tracker.woke(pid, sample.before), now, _asleep(sample)):
            wanted.append(pid)
        elif cached is not None and not outdated(cached, _asleep(sample)):
            samples[pid] = replace(sample, threads=cached.threads)
            classified[pid] = cached.classification
    if not wanted:
        return samples, classified
    classes: dict[tuple, list[int]] = {}  # one native sample per distinct Python stack
    for pid in wanted:
        classes.setdefault(stack_signature(main_thread(samples[pid].threads)), []).append(pid)
    representatives = {min(pids): signature for signature, pids in classes.items()}
    for pid, native in take_native(sorted(representatives)[:MAX_PER_POLL]).items():
        # Counters after our own native attach: its wake-ups must not count as the rank's.
        plain = samples[pid] = replace(samples[pid], after=native.after or samples[pid].after)
        signature = representatives[pid]
        if native.threads is None:  # the plain sample stands, saying that it could not be told apart
            if classified[pid].detail is None:
                classified[pid] = replace(classified[pid], detail=f"native stack not read: {native.error or 'no stacks'}")
            continue
        if stack_signature(main_thread(native.threads)) != signature:
            continue  # it moved while we looked: the plain sample stands
        cls = classify(native.threads, source_line, plain.kernel)
        cache.taken += 1
        cache.store(pid, signature, native.threads, cls, now, _running(plain))
        samples[pid] = replace(plain, threads=native.threads)
        classified[pid] = cls
        shared = replace(cls, detail=f"phase from a native sample of PID {pid}, which has the same Python stack")
        for other in classes[signature]:
            if other != pid:
                cache.store(other, signature, samples[other].threads, shared, now, _running(samples[other]))
                classified[other] = shared
    return samples, classified
