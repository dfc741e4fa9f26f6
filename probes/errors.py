"""Errors a person can act on: each carries the message shown and the exit status."""

from __future__ import annotations


class TrainwatchError(Exception):
    """A failure with a clear message for the user; the CLI prints it without a traceback."""

    exit_code = 1

    def __init__(self, message: str, remedy: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.remedy}" if self.remedy else self.message


class NoSuchProcess(TrainwatchError):
    exit_code = 3


class NotAJob(TrainwatchError):
    exit_code = 4


class AccessDenied(TrainwatchError):
    exit_code = 5


class ToolMissing(TrainwatchError):
    """py-spy (or another external tool) is absent or cannot read the target."""

    exit_code = 6


class BadBundle(TrainwatchError):
    exit_code = 7


class OutputError(TrainwatchError):
    """Cannot write where asked (full disk, read-only, permissions)."""

    exit_code = 8
