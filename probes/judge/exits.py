"""How a rank ended, in words, whether that was a crash, and which rank died first. Pure.

What a dead rank left is read by ``read/processes/exits.py``; this module only weighs it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Hashable, TypeVar

from ..observed import SIGNAL_REASONS, UNTOLD, abnormal
from ..snapshot import ExitInfo, Rank
from ..wording import how_ended

__all__ = ["CONSEQUENCES", "WAITED", "OOM_KILLED", "SAME_MOMENT_S", "TEARDOWN_SIGNALS", "VANISHED", "abnormal", "death",
           "describe_exit", "first_to_die", "headline", "how", "how_they_ended", "is_cause", "killed_together",
           "raised_while_alive"]

TEARDOWN_SIGNALS = frozenset({"SIGTERM", "SIGKILL", "SIGINT", "SIGHUP"})
# Deaths seen this close together are one moment: the most telling one is taken as the first.
SAME_MOMENT_S = 1.0
# A launcher's SIGKILL follows its SIGTERM by its grace (seconds at least): one sooner is no escalation.
ESCALATION_S = 3.0
# Reasons that follow from another rank's death rather than cause one.
CONSEQUENCES = frozenset({"a peer rank closed its connection", "collective timeout", "NCCL watchdog timeout"})
# A rank that ended of one of these was waiting in a collective when it did.
WAITED = frozenset({"collective timeout", "NCCL watchdog timeout"})
OOM_KILLED = "killed by the kernel OOM killer"  # a SIGKILL that is a cause, not the launcher's teardown
VANISHED = "vanished"  # gone between two looks with no exit status anywhere: a death not witnessed
HEADLINE_CHARS = 160

K = TypeVar("K", bound=Hashable)


# -- words ---------------------------------------------------------------------------------------
def how(info: ExitInfo) -> str:
    """``killed by SIGSEGV``, ``exit code 1`` or ``exit status not seen`` (``wording.how_ended``)."""
    return how_ended(info)


def headline(info: ExitInfo) -> str | None:
    """The reason in a few words: the exception itself when the reason is only its type
    (``RuntimeError: boom``); nothing when the reason only restates the signal."""
    reason, message = info.reason, info.message
    if reason == OOM_KILLED and message:  # what said so: the kernel's line, or the cgroup's count
        return _cap(f"{reason}: {message}", HEADLINE_CHARS)
    if reason and info.signal and SIGNAL_REASONS.get(info.signal) == reason:
        reason = None
    if reason and message and reason.rsplit(".", 1)[-1] in message.split(":", 1)[0]:
        return _cap(message, HEADLINE_CHARS)
    return reason


SOURCE_WORDS = {"kernel exit event": "the kernel's exit event", "launcher log": "the launcher's log",
                "memory cgroup": "its memory cgroup"}
KUBERNETES = "kubernetes"  # ExitInfo.source of a pod's ranks that Kubernetes says died (its words: the message)


def describe_exit(info: ExitInfo) -> str:
    """``exit code 1, CUDA device-side assert, in train.py:60 main``; a death no one witnessed:
    ``vanished between 12:03:05 and 12:03:07; no exit status could be read (…)``."""
    if info.reason == VANISHED and info.message:
        return info.message
    if info.source == KUBERNETES and info.message:  # the pod's state in Kubernetes' words, exit included
        return info.message
    parts = [how(info) + (f" (from {SOURCE_WORDS[info.source]})" if info.source in SOURCE_WORDS else "")]
    why = headline(info)
    if why:
        parts.append(why)
    if info.frame:
        parts.append(f"in {info.frame}")
    return ", ".join(parts)


def raised_while_alive(rank: Rank) -> bool:
    """A live rank in interpreter shutdown whose log shows an uncaught exception."""
    return rank.state != "exited" and rank.phase == "exiting" and rank.exit is not None and bool(rank.exit.reason)


def death(rank: int | None, pid: int, info: ExitInfo) -> str:
    """``rank 1 (pid 42) died: exit code 1, RuntimeError: boom``; ``rank 2 (pid 43) vanished …``."""
    if info.reason == VANISHED and info.message:
        return f"rank {rank} (pid {pid}) {info.message}"
    return f"rank {rank} (pid {pid}) died: {describe_exit(info)}"


# -- which rank died first ----------------------------------------------------------------------
def first_to_die(exits: Iterable[tuple[K, ExitInfo]]) -> K | None:
    """The key of the first crash. A death of a rank's own (a fatal signal, a kill from outside,
    an error of its own) comes before every death that follows from another (a lost peer, a
    timeout, the launcher's teardown), whatever the clocks say: a consequence never precedes its
    cause, and a death read late (from a log, after the fact) carries a late time. Crashes within
    :data:`SAME_MOMENT_S` of the earliest are one moment, ordered by how telling they are: a fatal
    signal, then an error of the rank's own, then errors that follow from a peer (lost connection,
    timeouts), then the launcher's teardown."""
    crashes = [(key, info) for key, info in exits if abnormal(info) and info.reason != UNTOLD]
    if not crashes:
        return None
    first_term = _first_term([info for _, info in crashes])
    causes = [(key, info) for key, info in crashes
              if info.reason not in CONSEQUENCES and not _teardown(info, first_term)]
    crashes = causes or crashes
    earliest = min(info.at or 0.0 for _, info in crashes)
    moment = [(key, info) for key, info in crashes if (info.at or 0.0) <= earliest + SAME_MOMENT_S]

    def weight(item: tuple[K, ExitInfo]) -> tuple:
        key, info = item
        teardown = _teardown(info, first_term)
        fatal = info.signal is not None and not teardown
        return (teardown, info.reason in CONSEQUENCES, info.reason == VANISHED, not fatal, info.at or 0.0, str(key))

    best = min(moment, key=weight)
    ties = [item for item in moment if weight(item)[:-1] == weight(best)[:-1]]
    if len(ties) > 1 and best[1].reason in CONSEQUENCES:
        return None  # several ranks timed out at one moment: which came first cannot be told
    return best[0]


def _first_term(infos: Iterable[ExitInfo]) -> float | None:
    """When the first polite stop (SIGTERM, SIGINT, SIGHUP) came, if any did."""
    return min((info.at or 0.0 for info in infos if info.signal in ("SIGTERM", "SIGINT", "SIGHUP")), default=None)


def _teardown(info: ExitInfo, first_term: float | None) -> bool:
    """Ended by a launcher's or a scheduler's stop. A launcher tears down with SIGTERM first and
    SIGKILLs only ranks that outlive its grace (torchrun: 30 s; SLURM's KillWait: 30 s): a SIGKILL
    with no SIGTERM at least :data:`ESCALATION_S` before it is a kill from outside (the OOM killer,
    a person, a scheduler, the rank itself). A death read from the launcher's log carries the time
    of its line, written after the teardown began: so a kill is told by that grace, not by order."""
    killed_first = info.signal == "SIGKILL" and (first_term is None or (info.at or 0.0) < first_term + ESCALATION_S)
    return info.signal in TEARDOWN_SIGNALS and info.reason != OOM_KILLED and not killed_first


def is_cause(info: ExitInfo, deaths: list[ExitInfo]) -> bool:
    """A death of the rank's own (a fatal signal, an error of its own), not a teardown among
    ``deaths`` (the job's) nor an error that follows from a peer (a collective timeout)."""
    if not abnormal(info) or info.reason in CONSEQUENCES or info.reason == UNTOLD:
        return False
    return not _teardown(info, _first_term(deaths))


def killed_together(infos: list[ExitInfo]) -> bool:
    """Every rank of the job killed by SIGKILL at one moment (``scancel``, ``kubectl delete`` past
    its grace, ``kill -9`` of the whole group): the job was stopped, not one rank that crashed. One
    rank killed while the others then got the launcher's SIGTERM, or the OOM killer, is a crash of
    that rank. (SIGTERM, SIGINT and SIGHUP are never a cause: see ``is_cause``.)"""
    if len(infos) < 2 or any(i.signal != "SIGKILL" or i.reason == OOM_KILLED for i in infos):
        return False
    times = [i.at for i in infos if i.at is not None]
    return len(times) == len(infos) and max(times) - min(times) <= SAME_MOMENT_S


def how_they_ended(infos: list[ExitInfo]) -> str:
    """``ranks killed by SIGTERM, collective timeout``: the distinct ways, in words."""
    ways = dict.fromkeys((info.reason if info.reason in CONSEQUENCES or info.reason == UNTOLD else how(info))
                         for info in infos)
    return ", ".join(ways)


def _cap(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars - 1] + "…"
