"""How edlctl shows things: rich tables and panels, built from the SDK's views.

What must stay true: text that comes from a job (messages, reasons, names, Events) is shown
as it is, never read as rich markup: a worker's ``[rank0]: ...`` stays as written.
"""

from __future__ import annotations

import time

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from edl_scheduler.sdk.base import ClusterView, JobDetails, JobSummary

PHASE_STYLE = {
    "Running": "green",
    "Resizing": "yellow",
    "Pending": "cyan",
    "Suspended": "magenta",
    "Succeeded": "bold green",
    "Failed": "bold red",
}


def age(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def goodput_text(goodput: float | None) -> str:
    """A reported goodput; "-" where none was reported or the policy predicts none (0)."""
    return f"{goodput:.1f}" if goodput else "-"


def batch_text(j: JobSummary) -> str:
    """The batch in use, for ``edlctl describe``: global batch, accumulation, goodput."""
    if j.global_batch is None:
        return "-"
    return (
        f"global {j.global_batch}, accumulation {j.accumulation or 1}, "
        f"goodput {goodput_text(j.goodput)} samples/s"
    )


def jobs_table(jobs: list[JobSummary], speeds: bool = False) -> Table:
    """One row per job; with ``speeds``, how far each is, how fast it trains, and the
    batch it runs at (global batch, accumulation steps) with its predicted goodput."""
    table = Table(box=None, header_style="bold")
    columns = ["NAME", "QUEUE", "PRIO", "MIN/MAX", "REPLICAS", "PHASE", "AGE"]
    measured = ["DONE", "SAMPLES/S", "BATCH", "ACCUM", "GOODPUT/S"]
    for column in columns + (measured if speeds else []):
        table.add_column(column)
    for j in jobs:
        row: list[str | Text] = [
            Text(j.name),
            Text(j.queue),
            str(j.priority),
            f"{j.min_replicas}/{j.max_replicas}",
            str(j.replicas),
            Text(j.phase, style=PHASE_STYLE.get(j.phase, "")),
            age(j.age_s),
        ]
        if speeds:
            row.append("-" if j.done is None else f"{100 * j.done:.0f}%")
            row.append("-" if j.samples_per_second is None else f"{j.samples_per_second:.1f}")
            row.append("-" if j.global_batch is None else str(j.global_batch))
            row.append("-" if j.accumulation is None else str(j.accumulation))
            row.append(goodput_text(j.goodput))
        table.add_row(*row)
    return table


def _when(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def details_panel(d: JobDetails, why_only: bool = False) -> Group:
    s = d.summary
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("Name", f"{s.namespace}/{s.name}")
    head.add_row("Phase", Text(s.phase, style=PHASE_STYLE.get(s.phase, "")))
    head.add_row("Reason", Text(s.message or "-"))
    if not why_only:
        head.add_row("Priority", str(s.priority))
        head.add_row("Replicas", f"{s.replicas} (min {s.min_replicas}, max {s.max_replicas})")
        head.add_row("Restarts", str(s.restarts))
        if d.progress:
            p = d.progress
            head.add_row(
                "Progress",
                f"epoch {p.get('epoch', '?')}/{p.get('epochs', '?')}, step "
                f"{p.get('committedStep', '?')}, samples {p.get('samplesDone', '?')}",
            )
        if s.global_batch is not None:
            head.add_row("Batch", batch_text(s))
        if d.logs:
            head.add_row("Logs", Text(f"{', '.join(d.logs)} (edlctl logs NAME --worker LOG)"))
    parts: list[Table | Panel] = [head]
    if d.workers and not why_only:
        workers = Table(title="Workers", box=None, header_style="bold", title_justify="left")
        for column in ("NAME", "ROLE", "PID", "NODE", "SLOTS", "STATE"):
            workers.add_column(column)
        for w in d.workers:  # a ps job's parameter servers too (role pserver, no slot)
            state = w.state + (" (draining)" if w.draining else "")
            workers.add_row(
                Text(w.name), Text(w.role), str(w.pid or "-"), Text(w.node),
                ",".join(map(str, w.slots)) or "-", Text(state),
            )  # fmt: skip
        parts.append(workers)
    resizes = Table(title="Resize history", box=None, header_style="bold", title_justify="left")
    for column in ("TIME", "FROM", "TO", "REASON"):
        resizes.add_column(column)
    for r in d.resizes:
        resizes.add_row(_when(r.time), str(r.from_replicas), str(r.to_replicas), Text(r.reason))
    parts.append(resizes)
    events = Table(title="Events", box=None, header_style="bold", title_justify="left")
    for column in ("TIME", "TYPE", "REASON", "MESSAGE"):
        events.add_column(column)
    for e in d.events[-20:] if why_only else d.events:
        style = "yellow" if e.type == "Warning" else ""
        events.add_row(_when(e.time), Text(e.type, style=style), Text(e.reason), Text(e.message))
    parts.append(events)
    return Group(*parts)


def cluster_panel(c: ClusterView) -> Panel:
    colours = ["green", "cyan", "magenta", "yellow", "blue", "red"]
    owners = sorted(set(c.slot_owner.values()))
    colour = {o: colours[i % len(colours)] for i, o in enumerate(owners)}
    bar = Text()
    for slot in range(c.slots):
        owner = c.slot_owner.get(slot)
        bar.append("■ " if owner else "□ ", style=colour.get(owner or "", "dim"))
    legend = Text("  ".join(owners))
    kind = "GPU" if c.gpus else "CPU"
    title = f"{c.backend}: {c.used} of {c.slots} {kind} slots in use, policy {c.policy}"
    return Panel(
        Group(bar, legend, jobs_table(c.jobs, speeds=True)), title=title, title_align="left"
    )
