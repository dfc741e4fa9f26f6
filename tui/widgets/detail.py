"""The detail pane: everything known about the selected rank: where it is and why, then its stacks."""

from __future__ import annotations

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from ...probes import Frame, Rank, RankGpu, ThreadStack, compact_ranks

from ...probes import age_text, how_ended, kernel_words, log_activity

from . import format as fmt
from .lines import phase_text, state_text


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
        noun = "frame" if hidden == 1 else "frames"
        text.append(f"\n    ({hidden} native {noun} hidden: press n)", style="dim italic")
    return text


def exit_text(rank: Rank, now: float) -> Text | None:
    """How the rank ended: exit status, reason, the fatal message and the frame. A rank that
    raised while a non-daemon thread keeps its process alive shows as raised."""
    info = rank.exit
    if info is None:
        return None
    alive = rank.state != "exited"
    text = Text.assemble(("raised: " if alive else "exited: ", "bold red"),
                         (how_ended(info, alive).removeprefix("raised "), "red"))
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
    text = Text(" · ".join(parts))
    activity = activity_text(gpu)
    if activity:
        text.append("\n" + activity)
    return text


def activity_text(gpu: RankGpu) -> str | None:
    """``power 595 of 700 W · SM active 88% · tensor 61% · DRAM bw 43%``: shown, never judged."""
    parts = []
    if gpu.power_w is not None:
        limit = f" of {gpu.power_limit_w:.0f}" if gpu.power_limit_w is not None else ""
        parts.append(f"power {gpu.power_w:.0f}{limit} W")
    gpm = (("SM active", gpu.sm_active_pct), ("tensor", gpu.tensor_active_pct), ("DRAM bw", gpu.dram_bw_pct))
    if any(value is not None for _name, value in gpm):
        parts += [f"{name} {fmt.pct(value)}" for name, value in gpm]
    return " · ".join(parts) or None


def facts_text(rank: Rank) -> Text:
    """``stuck 42s · sleep · all_reduce · CPU 3% · RSS 512M · step 1200 (0.41s/step)``."""
    text = Text.assemble(state_text(rank), " · ", phase_text(rank.phase))
    parts = [rank.op] if rank.op else []
    parts += [f"CPU {fmt.pct(rank.cpu_pct)}", f"RSS {fmt.size(rank.rss_bytes)}"]
    if rank.step is not None:
        period = f" ({rank.step_period_s:.2g}s/step)" if rank.step_period_s is not None else ""
        parts.append(f"step {rank.step}{period}")
    elif rank.step_period_s is not None:
        parts.append(f"{rank.step_period_s:.2g}s/step")
    for part in parts:
        text.append(" · ")
        text.append(part)
    return text


def detail_text(rank: Rank | None, now: float, native: bool = False) -> Text:
    """The selected rank's text.

    What places the rank comes first (where, your code, why), so at 80x24 the culprit's
    ``where`` and its frame in the user's code are on screen without scrolling.
    """
    if rank is None:
        return Text("select a rank", style="dim")
    label = f"rank {rank.rank}" if rank.rank is not None else "process"
    head = [label, f"pid {fmt.pid_text(rank.pid)}" + (f" ({rank.container_pid} in its container)"
                                                       if rank.container_pid is not None else "")]
    if rank.host:
        head.append(f"host {rank.host}")
    if rank.local_rank is not None:
        head.append(f"local {rank.local_rank}")
    if native:
        head.append("native stacks on")
    parts: list[Text] = [Text(" · ".join(head), style="bold"), facts_text(rank)]
    if rank.state == "stuck" and rank.stuck_source:
        parts.append(Text(f"stuck ≥ {age_text(rank.stuck_for_s or 0)}: {rank.stuck_source}", style="dim"))
    if rank.where:
        parts.append(Text.assemble(("where: ", "dim"), rank.where))
    if rank.user_frame and rank.user_frame != rank.where:
        parts.append(Text.assemble(("your code: ", "dim"), (rank.user_frame, "yellow")))
    if rank.waits_for:
        parts.append(Text.assemble(("waits for: ", "dim"), (rank.waits_for, "bold")))
    if rank.detail and rank.detail != rank.dataloader_worker:  # the worker is said in "waits for"
        parts.append(Text(rank.detail, style="italic"))
    kernel = kernel_words(rank.kernel)
    if kernel:
        parts.append(Text.assemble(("kernel: ", "dim"), (kernel, "magenta")))
    exit = exit_text(rank, now)
    if exit is not None:
        parts.append(exit)
    facts = [t for t in (gpu_text(rank),) if t is not None]  # after the main thread's stack
    if rank.children:
        facts.append(Text.assemble(("helpers: ", "dim"), ", ".join(map(str, rank.children))))
    threads = sorted(rank.threads, key=lambda t: not t.is_main)
    for index, thread in enumerate(threads):
        parts.append(Text(""))
        parts.append(thread_text(thread, rank.user_frame, native))
        if index == 0 and facts:
            parts += [Text(""), *facts]
    if not threads:
        if rank.exit is None:
            parts.append(Text("no stacks for this rank in this sample", style="dim"))
        if facts:
            parts += [Text(""), *facts]
    if rank.log_path:
        parts.append(Text(""))
        parts.append(Text.assemble(("log ", "bold"), (rank.log_path, "dim")))
        growth = log_activity(rank.log)
        if growth:
            parts.append(Text("  " + growth, style="italic"))
        if rank.log_tail is None:
            parts.append(Text("  (its tail was not read: unreadable, or not sent by its node)", style="dim"))
        for line in rank.log_tail or ():
            parts.append(Text("  " + line, style="bold" if line.startswith("──") else ""))
    return Text("\n").join(parts)


class DetailPane(VerticalScroll):
    """Scrollable text of the selected rank; a newly selected rank is shown from its first line
    (what places it comes first: ``where``, ``your code``, why). Scrolling down to the marked frame
    opened a tall rank's text mid-sentence at 80x24."""

    def compose(self):
        yield Static(id="detail-body")

    def show(self, rank: Rank | None, now: float, native: bool, fresh: bool = False) -> None:
        """``fresh``: another rank than last time was selected."""
        fmt.update_if_changed(self.query_one("#detail-body", Static), detail_text(rank, now, native))
        if fresh:
            self.call_after_refresh(self.scroll_to, y=0, animate=False)
