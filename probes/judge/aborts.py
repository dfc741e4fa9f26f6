"""A rank a collective library failed: whose call was the odd one out, not whom the library killed. Pure.

A library that checks the ranks' calls fails whichever rank notices first. gloo's size check
aborts the rank that *receives* a chunk larger than its own call expected (SIGABRT), so the rank
that sent it lives on a moment longer; c10d's fingerprint check (``TORCH_DISTRIBUTED_DEBUG=DETAIL``)
raises on every rank. The first death is therefore a witness, and the culprit is the rank whose
call differs from the others', read from, best first:

1. the calls the libraries' own words name (c10d's fingerprints, NCCL's ``WorkNCCL(...)``): the
   minority among them;
2. the Flight Recorder (an armed run records gloo's collectives too; the ranks' last words keep
   it): the first collective the ranks enqueued differently, the minority there. The rank gloo
   killed left no record of its own, but gloo said it expected fewer bytes than arrived, so its
   call is on the side of the smaller sizes: that breaks a tie between two sides;
3. every other rank's record holds the same call where the killed rank has none, and gloo says
   it expected fewer bytes than they sent: the killed rank's call is the odd one;
4. the ranks' last stacks: ranks in a collective at different lines, the minority;
5. else no culprit, said plainly: which call differed cannot be told.

The library's own words are kept in the verdict (what the rank's death says: ``read/logs/library_words.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .collectives import Disagreement, disagreement_words, disagreements, minority, numel
from ..snapshot import CollectiveState, LibraryError, Rank, compact_ranks, who
from ..wording import how_ended

FLIGHT_RECORDER_SOURCES = ("hook", "flight-recorder-file", "pipe", "debug-server", "flight-recorder", "last-words")


@dataclass(frozen=True, repr=False)
class AbortCause:
    """The rank(s) whose call differs (none when it cannot be told), and the verdict's words."""

    culprits: tuple[int, ...]
    text: str
    witness: int | None = None  # the rank whose failure the words describe


def is_library_failure(rank: Rank) -> bool:
    """A rank a library failed over a collective it says the ranks disagree on."""
    return rank.exit is not None and rank.exit.library is not None and rank.exit.library.mismatch


def abort_cause(ranks: Sequence[Rank], collectives: CollectiveState | None) -> AbortCause | None:
    """The odd one out when a collective library failed ranks over a disagreement; None when no
    library said the ranks disagree (or named calls that differ)."""
    failed = [r for r in ranks if r.exit is not None and r.exit.library is not None]
    if not failed:
        return None
    witness = _witness(failed)
    said = witness.exit.library if witness.exit else None
    named = _named_calls(failed)
    if named is not None:
        found, culprits = named
        return AbortCause(tuple(culprits), f"{disagreement_words(found, culprits)} ({_library_source(failed)})"
                                           f"{_placed(ranks, culprits)}{_raised(failed)}", None)
    if said is None or not said.mismatch:
        return None
    recorded = _from_records(ranks, witness, said, collectives)
    if recorded is not None:
        culprits, how = recorded
        return AbortCause(tuple(culprits), f"{how}{_placed(ranks, culprits)}{_words(witness)}", witness.rank)
    stacked = _from_stacks(ranks)
    if stacked is not None:
        culprits, how = stacked
        return AbortCause(tuple(culprits), f"{how}{_words(witness)}", witness.rank)
    return AbortCause((), f"a collective mismatch: {_words(witness).lstrip('; ')}; which rank's call differs cannot "
                          "be told: no Flight Recorder trace holds that collective and the ranks' last stacks do "
                          "not differ (`trainwatch run` records it, for gloo too)", witness.rank)


def _witness(failed: list[Rank]) -> Rank:
    """The rank whose failure speaks first: the first to die, else the earliest, of those whose
    library said the ranks disagree."""
    speaking = [r for r in failed if r.exit and r.exit.library and r.exit.library.mismatch] or failed
    first = [r for r in speaking if r.exit and r.exit.first]
    return (first or sorted(speaking, key=lambda r: ((r.exit.at if r.exit else None) or 0.0, r.rank or 0)))[0]


def _named_calls(failed: list[Rank]) -> tuple[Disagreement, list[int]] | None:
    """Calls the libraries' words name (c10d's fingerprints, NCCL's work) that differ, with a minority."""
    rows = {}
    for rank in failed:
        for row in rank.exit.library.calls if rank.exit and rank.exit.library else ():
            rows.setdefault((row.rank, row.pg), row)
    for found in disagreements(CollectiveState(source="library", ranks=tuple(rows.values()))):
        culprits = minority(found.sides)
        if culprits:
            return found, culprits
    return None


def _from_records(ranks: Sequence[Rank], witness: Rank, said: LibraryError,
                  collectives: CollectiveState | None) -> tuple[list[int], str] | None:
    """The odd one out from the ranks' own records of their collectives (Flight Recorder)."""
    if collectives is None or witness.rank is None:
        return None
    source = _source(collectives)
    smaller = said.received_bytes is not None and said.expected_bytes is not None \
        and said.received_bytes > said.expected_bytes
    for found in disagreements(collectives):
        sides = found.sides
        if witness.rank not in found.calls and smaller:
            sides = _joined(found, witness.rank)
        culprits = minority(sides)
        if culprits:
            text = disagreement_words(replace(found, sides=sides, calls=_with_inferred(found, sides, witness.rank)),
                                      culprits)
            if witness.rank not in found.calls and witness.rank not in culprits:
                text += (f" (rank {witness.rank} kept no record of #{found.seq}; its call is on the side of the "
                         "smaller sizes: it received more than it expected)")
            return culprits, f"{text} ({source})"
    if not smaller:
        return None
    # Every other rank holds the same call where the witness has none: the witness's call is the odd one.
    numbers = {r.rank for r in ranks if r.rank is not None}
    pg = "0" if any(row.pg == "0" for row in collectives.ranks) else min((r.pg for r in collectives.ranks), default="0")
    rows = [row for row in collectives.ranks if row.rank != witness.rank and row.pg == pg]
    last = {row.rank: row.calls[-1] for row in rows if row.calls}
    if not last or set(last) != numbers - {witness.rank}:
        return None
    kinds = {(c.seq, c.op, c.sizes, c.dtype) for c in last.values()}
    if len(kinds) != 1:
        return None
    seq, op, sizes, _ = next(iter(kinds))
    own = [row for row in collectives.ranks if row.rank == witness.rank and row.pg == pg
           and any(c.seq == seq and c.op == op and c.sizes == sizes for c in row.calls)]
    if own:
        return None
    others = sorted(last)
    return [witness.rank], (f"rank {witness.rank}'s {op} #{seq} expected {said.expected_bytes} bytes where "
                            f"{who(others)} sent {said.received_bytes} ({who(others)} enqueued {op} of {sizes} #{seq}; "
                            f"{source})")


def _joined(found: Disagreement, rank: int) -> tuple[tuple[int, ...], ...]:
    """The sides with ``rank`` added to the side whose call holds the fewest elements (the side it
    is on when it received more than it expected); unchanged when sizes are not known."""
    sizes = {side: numel(found.calls[side[0]].sizes) for side in found.sides}
    if any(v is None for v in sizes.values()):
        return found.sides
    least = min(found.sides, key=lambda side: sizes[side])
    joined = [tuple(sorted((*side, rank))) if side == least else side for side in found.sides]
    return tuple(sorted(joined, key=lambda side: (-len(side), side)))


def _with_inferred(found: Disagreement, sides: tuple[tuple[int, ...], ...], rank: int) -> dict:
    """Each rank's call, the witness's inferred as its side's (for the words only)."""
    calls = dict(found.calls)
    for side in sides:
        if rank in side and rank not in calls:
            calls[rank] = next(calls[r] for r in side if r in calls)
    ordered = {r: calls[r] for side in sides for r in side}
    return ordered


def _from_stacks(ranks: Sequence[Rank]) -> tuple[list[int], str] | None:
    """Ranks last seen in a collective at different lines: the minority (every rank read)."""
    placed = [r for r in ranks if r.phase == "collective" and r.where and r.rank is not None]
    if len(placed) != len(ranks) or len(placed) < 3:
        return None
    groups: dict[tuple, list[int]] = {}
    for rank in placed:
        groups.setdefault((rank.op, rank.where), []).append(rank.rank)  # type: ignore[arg-type]
    sides = tuple(sorted((tuple(sorted(g)) for g in groups.values()), key=lambda s: (-len(s), s)))
    culprits = minority(sides)
    if not culprits:
        return None
    at = {r.rank: r for r in placed}
    parts = [f"{who(list(side))} {'was' if len(side) == 1 else 'were'} in {at[side[0]].op or 'a collective'} at "
             f"{at[side[0]].where}" for side in sides]
    return culprits, f"{parts[-1] if len(sides) == 2 else '; '.join(parts[1:])} while {parts[0]} (their last stacks)"


def _words(rank: Rank, with_place: bool = True) -> str:
    """``; gloo aborted rank 0 (killed by SIGABRT): “Received data size …” (10 bytes arrived where its
    call expected 8), in all_gather at train.py:13``."""
    info = rank.exit
    said = info.library if info else None
    if info is None or said is None:
        return ""
    how = how_ended(info)
    verb = "aborted" if info.signal == "SIGABRT" else "failed"
    text = f"; {said.library} {verb} rank {rank.rank} ({how}): “{said.words}”"
    if said.received_bytes is not None and said.expected_bytes is not None:
        text += f" ({said.received_bytes} bytes arrived where its call expected {said.expected_bytes})"
    if with_place and info.frame:
        text += f", at {info.frame}"
    elif with_place and rank.where:  # where it was last seen, which may be before the collective
        text += f", last seen in {rank.op if rank.phase == 'collective' and rank.op else rank.phase} at {rank.where}"
    return text


def _raised(failed: list[Rank]) -> str:
    """``; c10d raised on ranks 0-2: “Detected mismatch …”``: a check every rank made."""
    said = [r for r in failed if r.exit and r.exit.library and r.exit.library.calls]
    words = said[0].exit.library if said and said[0].exit else None
    if words is None:
        return ""
    return f"; {words.library} raised on {who(r.rank for r in said if r.rank is not None)}: “{words.words}”"


def _placed(ranks: Sequence[Rank], culprits: list[int]) -> str:
    """Where the culprits made the call, from their own lines (``; rank 2 called it at train.py:13``)."""
    places = {}
    for rank in ranks:
        if rank.rank in culprits:
            place = (rank.exit.frame if rank.exit else None) or rank.user_frame or rank.where
            if place:
                places.setdefault(place, []).append(rank.rank)
    return "".join(f"; {who(numbers)} called it at {place}" for place, numbers in places.items())


def _source(collectives: CollectiveState) -> str:
    parts = collectives.source.split("+")
    recorder = [p for p in parts if p in FLIGHT_RECORDER_SOURCES]
    return f"Flight Recorder, {'+'.join(recorder)}" if recorder else collectives.source


def _library_source(failed: list[Rank]) -> str:
    libraries = sorted({r.exit.library.library for r in failed if r.exit and r.exit.library and r.exit.library.calls})
    ranks = compact_ranks(r.rank for r in failed if r.rank is not None and r.exit and r.exit.library
                          and r.exit.library.calls)
    named = {"c10d": "c10d's collective fingerprints", "NCCL": "NCCL's failed work"}
    return ", ".join(named.get(lib, lib) for lib in libraries) + f", in the errors of ranks {ranks}"
