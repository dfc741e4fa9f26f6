"""What every source over several nodes does alike (``streams.StreamSource`` is the one source):
read this node with the local probe and pause its judgement while evidence is taken."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from ..errors import TrainwatchError
from ..judge.judgement import JudgeMemory
from .merge import NodeView


class NodeEvidence:
    """What every multi-node source does alike: pause the local probe's judgement while evidence is
    taken (other nodes judge their own progress)."""

    local: Any
    memory: JudgeMemory  # the merged view's judge across polls

    def _poll_local(self, native_for: frozenset[int]) -> NodeView:
        """This node, read by the local source (a failure is this node's error, not the view's)."""
        name = socket.gethostname()
        try:
            snap = self.local.poll(native_for=native_for)
        except TrainwatchError as exc:
            return NodeView(name=name, error=exc.message, local=True)
        return NodeView(name=snap.job.host or name, snapshot=snap, local=True)

    def paused_judgement(self) -> AbstractContextManager[None]:
        if self.local is None:
            return contextlib.nullcontext()
        return self.local.paused_judgement()

    def select(self, ranks: frozenset[int]) -> None:
        """Other nodes' agents are asked for these ranks' every thread (see ``StreamSource``)."""

    def remembered_places(self) -> Mapping[int, frozenset[str]]:
        return self.memory.familiar
