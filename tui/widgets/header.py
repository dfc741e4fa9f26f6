"""The two header lines: what job this is, and the verdict with how long it has held."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from ...probes import Snapshot, job_title

from . import format as fmt
from .lines import verdict_line


def at_dump(snapshot: Snapshot | None) -> bool:
    """A bundle's snapshot: its durations are as at the dump (``now`` is its ``taken_at``)."""
    return snapshot is not None and snapshot.source.startswith("bundle")


def job_line(snapshot: Snapshot | None, now: float) -> Text:
    if snapshot is None:
        return Text.assemble(("trainwatch", "bold"), " · waiting for the first sample…")
    job = snapshot.job
    if job.pods:  # a --k8s job: its pods, not one pod's PID and host name
        parts = [job_title(job), f"world {job.world_size if job.world_size is not None else fmt.NA}"]
    else:
        parts = [f"{job.launcher} pid {job.pid}", f"world {job.world_size if job.world_size is not None else fmt.NA}"]
        if job.nnodes and job.nnodes > 1:
            parts.append(f"{job.nnodes} nodes")
        parts.append(f"host {job.host}")
    uptime = now - job.started_at if job.started_at else None
    parts.append(f"up {fmt.duration(uptime)}" + (" at dump" if at_dump(snapshot) else ""))
    if job.job_id and job.job_id != "none":  # torchrun's default run id says nothing
        parts.append(f"id {job.job_id}")
    if snapshot.source.startswith("bundle"):
        parts.append(snapshot.source)
    return Text.assemble(("trainwatch", "bold"), " · ", " · ".join(parts))


class JobHeader(Static):
    """Job identity and verdict on the left, monitor status on the right."""

    DEFAULT_CSS = "JobHeader { height: auto; }"  # the verdict wraps in full: it matters most

    def show(self, snapshot: Snapshot | None, now: float, status: Text, layout: bool = True) -> None:
        """``layout=False`` for clock ticks: only durations changed, the height stays."""
        job, verdict = job_line(snapshot, now), verdict_line(snapshot, now)
        fmt.update_if_changed(self, self._layout(job, verdict, status), key=(job, verdict, status), layout=layout)

    @staticmethod
    def _layout(job: Text, verdict: Text, status: Text) -> RenderableType:
        grid = Table.grid(expand=True, padding=(0, 1))
        grid.add_column(ratio=1, no_wrap=True, overflow="ellipsis")
        grid.add_column(justify="right", no_wrap=True)
        grid.add_row(job, status)
        return Group(grid, verdict)  # the verdict may wrap: it matters most
