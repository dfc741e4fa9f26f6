"""The detail pane: everything known about the selected rank, stacks first."""

from __future__ import annotations

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from trainwatch.probes.snapshot import Frame, Rank, ThreadStack, compact_ranks

from . import format as fmt


def is_user_frame(frame: Frame, user_frame: str | None) -> bool:
    if not user_frame:
        return False
    label = frame.label()
    return label == user_frame or user_frame.endswith(label) or label.endswith(user_frame)


def thread_text(thread: ThreadStack, user_frame: str | None, native: bool) -> Text:
    flags = []
    if thread.active is not None:
        flags.append("active" if thread.active else "idle")
    if thread.owns_gil:
        flags.append("holds GIL")
    head = f"Thread {thread.name}" + (f" ({thread.tid})" if thread.tid is not None else "")
    text = Text(head, style="bold")
    if flags:
        text.append("  " + ", ".join(flags), style="dim")
    hidden = 0
    for frame in thread.frames:
        if frame.native and not native:
            hidden += 1
            continue
        mine = is_user_frame(frame, user_frame)
        text.append("\n")
        if mine:
            text.append("  ▶ " + frame.label(), style="bold reverse yellow")
        else:
            text.append("    " + frame.label(), style="dim" if frame.native else "")
    if hidden:
        text.append(f"\n    ({hidden} native frames hidden: press n)", style="dim italic")
    return text


def exit_text(rank: Rank, now: float) -> Text | None:
    """How the rank ended: exit status, reason, the fatal message and the frame. A rank that
    raised while a non-daemon thread keeps its process alive shows as raised."""
    info = rank.exit
    if info is None:
        return None
    alive = rank.state != "exited"
    if alive:
        text = Text.assemble(("raised: ", "bold red"), ("uncaught exception, process still alive", "red"))
    else:
        how = info.signal or (f"exit code {info.code}" if info.code is not None else "exit status not seen")
        text = Text.assemble(("exited: ", "bold red"), (how, "red"))
    if info.at:
        text.append(f", {fmt.duration(now - info.at)} ago")
    if info.first:
        text.append("  first rank to fail" if alive else "  first rank to die", style="bold red")
    if info.reason:
        text.append(f"\n  reason: {info.reason}")
    if info.message and info.message != info.reason:
        text.append("\n  message: ")
        text.append(info.message, style="bold")
    if info.frame:
        text.append(f"\n  {'raised in' if alive else 'died in'}: {info.frame}")
    return text


def gpu_text(rank: Rank) -> Text | None:
    gpu = rank.gpu
    if gpu is None:
        return None
    parts = [f"GPU {gpu.index if gpu.index is not None else fmt.NA}", f"util {fmt.pct(gpu.util_pct)}"]
    if gpu.proc_util_pct is not None:
        parts.append(f"this process {fmt.pct(gpu.proc_util_pct)}")
    parts.append(f"mem {fmt.size(gpu.mem_used_bytes)} of {fmt.size(gpu.mem_total_bytes)}")
    if gpu.shared_with:
        parts.append(f"shared with {fmt.rank_noun(len(gpu.shared_with))} {compact_ranks(gpu.shared_with)}")
    return Text(" · ".join(parts))


def detail_text(rank: Rank | None, now: float, native: bool = False,
                log_tail: tuple[str, ...] | None = None) -> Text:
    if rank is None:
        return Text("select a rank", style="dim")
    label = f"rank {rank.rank}" if rank.rank is not None else "process"
    head = [label, f"pid {rank.pid if rank.pid is not None else fmt.NA}"]
    if rank.host:
        head.append(f"host {rank.host}")
    if rank.local_rank is not None:
        head.append(f"local {rank.local_rank}")
    if native:
        head.append("native stacks on")
    parts: list[Text] = [Text(" · ".join(head), style="bold")]
    state = f"{rank.state}" + (f" for {fmt.duration(rank.stuck_for_s)}" if rank.stuck_for_s else "")
    parts.append(Text(f"{state} · {rank.phase}" + (f" · {rank.op}" if rank.op else "")))
    if rank.where:
        parts.append(Text.assemble(("where: ", "dim"), rank.where))
    if rank.user_frame and rank.user_frame != rank.where:
        parts.append(Text.assemble(("your code: ", "dim"), (rank.user_frame, "yellow")))
    if rank.detail:
        parts.append(Text(rank.detail, style="italic"))
    for extra in (exit_text(rank, now), gpu_text(rank)):
        if extra is not None:
            parts.append(extra)
    if rank.children:
        parts.append(Text.assemble(("helpers: ", "dim"), ", ".join(map(str, rank.children))))
    threads = sorted(rank.threads, key=lambda t: not t.is_main)
    for thread in threads:
        parts.append(Text(""))
        parts.append(thread_text(thread, rank.user_frame, native))
    if not threads and rank.exit is None:
        parts.append(Text("no stacks for this rank in this sample", style="dim"))
    if rank.log_path:
        parts.append(Text(""))
        parts.append(Text.assemble(("log ", "bold"), (rank.log_path, "dim")))
        if log_tail is None:
            parts.append(Text("  (not readable)", style="dim"))
        for line in log_tail or ():
            parts.append(Text("  " + line, style="bold" if line.startswith("──") else ""))
    return Text("\n").join(parts)


class DetailPane(VerticalScroll):
    """Scrollable text of the selected rank."""

    def compose(self):
        yield Static(id="detail-body")

    def show(self, rank: Rank | None, now: float, native: bool, log_tail: tuple[str, ...] | None) -> None:
        fmt.update_if_changed(self.query_one("#detail-body", Static), detail_text(rank, now, native, log_tail))
