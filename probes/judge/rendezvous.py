"""The job that never formed (pure): ranks waiting in the rendezvous while another rank of the same
job is elsewhere, and a launcher waiting for nodes that never joined its store.

* every live rank but some waits in init (``init_process_group``, the store, gloo/NCCL setup) and
  the others are anywhere but a collective (before their own init, blocked in I/O, unreadable, or
  missing): ``rendezvous``, those others named with where they are ("rank 2 never joined: it is at
  train.py:22 load_config (in recv() on tcp …, 40 s)"); in a subgroup's ``new_group`` of a
  job that formed, the rank that has not reached it is a ``straggler``;
* a launcher with no rank started yet whose store (served on this node) lacks the connections of
  some nodes: which nodes, and the ranks they would run (``Job.rendezvous``, read from the sockets).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .kernel import CALL_WORDS
from .phases import main_thread
from ..frames import bare_name
from ..snapshot import Job, Rank, Verdict, VerdictKind, age_text, compact_ranks, who

# Calls that form the world: a rank inside one has not joined the job yet (``new_group`` and the
# process group helper also run later, for a subgroup: the outer frames tell).
FORMING = frozenset({"init_process_group", "rendezvous", "_create_c10d_store", "_env_rendezvous_handler",
                     "_tcp_rendezvous_handler", "next_rendezvous", "init_device_mesh"})
PEER_WAITS = frozenset({"collective", "gpu_wait"})


def never_joined(ranks: Sequence[Rank], place: Callable[[Rank], str], job: Job | None = None) -> Verdict | None:
    """``rendezvous`` when the live ranks that are stuck in init wait for ranks that are elsewhere;
    None when the rule does not apply. ``place``: where a rank sits, in words (``verdict.place``);
    ``job``: its store, for ranks found through it (a missing one is not connected to it)."""
    live = [r for r in ranks if r.state in ("running", "stuck")]
    waiting = [r for r in live if r.phase == "init"]
    if not waiting or any(r.state != "stuck" for r in waiting):
        return None  # none in init, or one still moving through it: the job may still be forming
    elsewhere = [r for r in live if r.phase != "init"]
    if any(r.phase in PEER_WAITS for r in elsewhere):
        return None  # a rank past init, in a collective: not a job that never formed (new_group vs a collective)
    missing = [r for r in ranks if r.state == "missing"]
    unread = [r for r in ranks if r.state == "unknown"]
    culprits = elsewhere + unread + missing
    if not culprits:
        return None  # every rank is in init: verdict._rendezvous words it
    call = _joining(waiting)
    lead = waiting[0]
    at = f" at {lead.where}" if lead.where else ""
    waits = f"{who(_numbers(waiting))} {'waits' if len(waiting) == 1 else 'wait'} in {call}{at}"
    # the world never formed; a subgroup's setup (new_group) in a job that formed has a straggler
    kind: VerdictKind = "rendezvous" if call in FORMING else "straggler"
    joined = "never joined" if call in FORMING else f"{'has' if len(culprits) == 1 else 'have'} not reached {call}"
    store = job.rendezvous.store if job is not None and job.rendezvous is not None and job.rendezvous.numbered_by \
        else None
    alone = len(culprits) == 1
    parts = [_where(r, place, alone=alone) for r in culprits if r.state != "missing"]
    if missing:
        named = "it" if alone else who(_numbers(missing))
        parts.append(f"no process is connected to the store at {store} as {who(_numbers(missing))}" if store
                     else f"{named} {'is' if len(missing) == 1 else 'are'} missing (no process)")
    subject = who(_numbers(culprits)) if _numbers(culprits) else f"PID {culprits[0].pid}"
    text = f"{subject} {joined}: " + "; ".join(parts) + f"; {waits}"
    return Verdict(kind, tuple(_numbers(culprits)), text)


def never_scheduled(ranks: Sequence[Rank], place: Callable[[Rank], str], job: Job | None = None) -> Verdict | None:
    """``rendezvous`` naming the ranks whose pod Kubernetes never ran (Pending: no node has room,
    an image it cannot pull), in its words, while no rank of the job has got past forming it: the
    others wait in their rendezvous, or their launchers wait to start them. None when the job
    formed without them (an elastic job) or no pod is held back."""
    held = [r for r in ranks if r.state == "missing" and r.scheduler]
    live = [r for r in ranks if r.state in ("running", "stuck")]
    if not held or any(r.phase != "init" for r in live):
        return None
    by_pod: dict[str, list[Rank]] = {}
    for rank in held:
        by_pod.setdefault(rank.scheduler or "", []).append(rank)
    parts = [f"{who(_numbers(members))} never joined: {words}" for words, members in by_pod.items()]
    if live:
        lead = live[0]
        parts.append(f"{who(_numbers(live))} {'waits' if len(live) == 1 else 'wait'} in {place(lead)}")
    elif job is not None and job.waiting_rendezvous:
        parts.append("the other pods' launchers wait for them in their rendezvous, with no rank started")
    return Verdict("rendezvous", tuple(_numbers(held)), "; ".join(parts))


def _joining(waiting: Sequence[Rank]) -> str:
    """What the waiting ranks are in: the outermost forming call on the main thread's stack
    (``init_process_group``), else their op (``new_group``)."""
    lead = waiting[0]
    thread = main_thread(lead.threads)
    names = [bare_name(f.function) for f in thread.frames if not f.native] if thread else []
    forming = [n for n in names if n in FORMING or n == "new_group"]
    return forming[-1] if forming else (lead.op or "init")


def _where(rank: Rank, place: Callable[[Rank], str], alone: bool) -> str:
    """``it is at train.py:22 load_config (in recv() on tcp …, 40 s)`` for one live or
    unreadable rank (``rank 2 is …`` where several are named)."""
    name = "it" if alone or rank.rank is None else who([rank.rank])
    if rank.state == "unknown":
        what = f"{name} (PID {rank.pid})" if rank.pid is not None else name
        return f"{what} could not be read: it may be the one they wait for (see the notes)"
    spot = f"at {rank.where}" if rank.phase in ("unknown", "compute", "io") and rank.where else f"in {place(rank)}"
    held = []
    kernel = rank.kernel
    if kernel is not None and kernel.syscall:
        call = CALL_WORDS.get(kernel.syscall, kernel.syscall)
        held.append(f"in {call}()" + (f" on {kernel.target}" if kernel.target else ""))
    if rank.state == "stuck" and rank.stuck_for_s:
        held.append(age_text(rank.stuck_for_s))
    elif rank.state == "running":
        held.append("running")
    return f"{name} is {spot}" + (f" ({', '.join(held)})" if held else "")


def launcher_waiting(job: Job) -> Verdict:
    """A launcher with no rank started on this node: which nodes its store still waits for."""
    head = f"{job.launcher} (PID {job.pid}) is waiting in rendezvous: no rank has started on this node yet"
    rdzv = job.rendezvous
    nodes = job.nnodes or 1
    if nodes <= 1:
        return Verdict("rendezvous", (), f"{head}; a single-node job: the launcher is still starting its workers")
    if rdzv is not None and not rdzv.served_here and rdzv.missing_nodes == (0,):
        ranks = f" (ranks {compact_ranks(rdzv.missing_ranks)})" if rdzv.missing_ranks else ""
        return Verdict("rendezvous", tuple(rdzv.missing_ranks),
                       f"{head}; node 0{ranks}, whose launcher serves the store at {rdzv.store}, has not started: "
                       "nothing listens there")
    if rdzv is None or not rdzv.served_here or rdzv.nodes_joined is None:
        where = f" (its store at {rdzv.store} is served on another node)" if rdzv and rdzv.store else ""
        return Verdict("rendezvous", (), f"{head}; other nodes have not joined{where}")
    absent = nodes - rdzv.nodes_joined
    if absent <= 0:
        return Verdict("rendezvous", (), f"{head}; all {nodes} nodes are connected to its store at {rdzv.store}")
    if rdzv.missing_nodes:
        labels = [f"node {n}" for n in rdzv.missing_nodes]
        named = ", ".join(labels)
        ranks = f" (ranks {compact_ranks(rdzv.missing_ranks)})" if rdzv.missing_ranks else ""
        text = (f"{head}; other nodes have not joined: {named}{ranks} "
                f"{'has' if len(labels) == 1 else 'have'} not connected to its store at {rdzv.store} "
                f"({rdzv.nodes_joined} of {nodes} nodes joined): "
                f"{'its launcher was' if len(labels) == 1 else 'their launchers were'} "
                "never started or cannot reach it")
        return Verdict("rendezvous", tuple(rdzv.missing_ranks), text)
    return Verdict("rendezvous", (), f"{head}; other nodes have not joined: {absent} of {nodes} nodes "
                                     f"{'has' if absent == 1 else 'have'} not connected to its store at {rdzv.store} "
                                     f"({rdzv.nodes_joined} joined)")


def _numbers(ranks: Sequence[Rank]) -> list[int]:
    return sorted(r.rank for r in ranks if r.rank is not None)
