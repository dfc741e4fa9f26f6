"""The base of trainwatch's dataclasses: one ``__repr__`` for all of them.

``dataclass`` compiles a ``__repr__`` for every class it makes, at import: 10 ms of every
command's start for the ninety records here. Each is declared ``@dataclass(..., repr=False)`` on
top of :class:`Record` and prints the same: ``Frame(function='f', file='x.py', line=3, native=False)``.
"""

from __future__ import annotations

from dataclasses import fields


class Record:
    """A dataclass's fields, printed as ``dataclass`` would print them (none of these records
    contains itself, so no guard against recursion is needed)."""

    __slots__ = ()

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)  # type: ignore[arg-type]
        return f"{type(self).__qualname__}({shown})"
