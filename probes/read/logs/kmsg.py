"""The kernel log's records as they come: /dev/kmsg read non-blocking, only what is new since the
last call (the whole ring buffer the first time), bounded per call. Who reads it (Xid events, a
rank's fault) parses the lines."""

from __future__ import annotations

import os
import stat


class KmsgRecords:
    """New records of one kernel log (a regular file stands in for it in tests)."""

    def __init__(self, path: str = "/dev/kmsg", max_records: int = 20000) -> None:
        self.path = path
        self.max_records = max_records
        self.failure: OSError | None = None  # why it could not be opened or read on
        self.live = False  # the kernel log device itself, not a file standing in for it
        self._fd: int | None = None

    def open(self) -> OSError | None:
        """Open it; the error when it cannot be (and nothing is read after)."""
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            self.live = stat.S_ISCHR(os.fstat(self._fd).st_mode)
        except OSError as exc:
            self.failure = exc
        return self.failure

    def new_lines(self) -> list[str]:
        """The lines logged since the last call (opened on the first)."""
        if self._fd is None and self.failure is None:
            self.open()
        if self._fd is None:
            return []
        lines: list[str] = []
        pending = ""
        for _ in range(self.max_records):
            try:
                chunk = os.read(self._fd, 8192)
            except BlockingIOError:
                break  # no more records now
            except BrokenPipeError:
                continue  # the record was overwritten before we read it
            except OSError as exc:
                self.failure, self.live = exc, False
                self.close()
                break
            if not chunk:
                break  # a regular file (tests) at its end
            *done, pending = (pending + chunk.decode("utf-8", "replace")).split("\n")
            lines.extend(done)
        if pending:
            lines.append(pending)
        return lines

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass  # closing: nothing read is lost
            self._fd = None
