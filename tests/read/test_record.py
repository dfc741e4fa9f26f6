"""Records print as dataclass prints them, from one shared ``__repr__`` (probes/record.py says why)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainwatch.probes.record import Record
from trainwatch.probes.snapshot import Frame, ThreadStack, Verdict


@dataclass(frozen=True)
class Printed:
    name: str
    line: int | None = None
    hidden: str = field(default="x", repr=False)
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, repr=False)
class Shared(Record):
    name: str
    line: int | None = None
    hidden: str = field(default="x", repr=False)
    tags: tuple[str, ...] = ()


def test_a_record_prints_as_dataclass_would():
    assert repr(Shared("a", 3, tags=("t",))).replace("Shared", "Printed") == repr(Printed("a", 3, tags=("t",)))
    assert repr(Frame("f", "x.py", 3)) == "Frame(function='f', file='x.py', line=3, native=False)"
    stack = ThreadStack("MainThread", 7, (Frame("f", "x.py"),))
    assert repr(stack).startswith("ThreadStack(name='MainThread', tid=7, frames=(Frame(function='f', file='x.py', ")
    assert repr(Verdict("hang", (1,), "why")).startswith("Verdict(kind='hang', culprits=(1,), ")
