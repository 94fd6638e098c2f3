"""CPU use and resident memory of a trial's processes on one node, from ``/proc`` (no psutil).

The processes are the node's workers and everything they started (the process tree under them).
CPU % is of the CPUs this process may run on (``os.sched_getaffinity``: what Slurm's cgroup
gives the task), so 100 means every allotted core busy, comparable across nodes and with a GPU's
utilisation. Parsing is pure; reading ``/proc`` happens in ``ProcessTreeSampler.read``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30


@dataclass(frozen=True)
class ProcStat:
    """The parts of ``/proc/PID/stat`` the sampler uses."""

    pid: int
    ppid: int
    cpu_ticks: int
    """User plus system time, in clock ticks (``SC_CLK_TCK``)."""


def parse_stat(text: str) -> ProcStat:
    """``/proc/PID/stat``; the command name (field 2) may hold spaces and parentheses, so fields are
    counted from its closing parenthesis."""
    pid = int(text[: text.index(" ")])
    rest = text[text.rindex(")") + 2:].split()
    # rest[0] is field 3 (state): ppid is field 4, utime and stime fields 14 and 15.
    return ProcStat(pid=pid, ppid=int(rest[1]), cpu_ticks=int(rest[11]) + int(rest[12]))


def parse_statm_rss_pages(text: str) -> int:
    """Resident pages, the second field of ``/proc/PID/statm``."""
    return int(text.split()[1])


def process_tree(roots: Iterable[int], parents: Mapping[int, int]) -> set[int]:
    """``roots`` (those alive, i.e. in ``parents``) and every descendant, from ``{pid: ppid}``."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = set(), [pid for pid in roots if pid in parents]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, ()))
    return tree


def cpu_percent(before: Mapping[int, int], after: Mapping[int, int], seconds: float, ticks_per_s: float,
                cpus: int) -> float:
    """CPU % of ``cpus`` over ``seconds`` from per-process tick counts at both ends.

    A process new since ``before`` counts all its ticks; one that ended counts none (its last
    interval is lost, not counted twice); a count that went down (a reused pid) counts none.
    """
    ticks = sum(max(0, count - before.get(pid, 0)) for pid, count in after.items())
    return 100.0 * ticks / ticks_per_s / seconds / cpus


@dataclass(frozen=True)
class CpuReading:
    """One reading of the tree: CPU % since the previous reading, resident memory now."""

    util_pct: float | None
    """None for the first reading: there is no interval yet."""
    rss_gb: float


class ProcessTreeSampler:
    """Reads the process tree under ``roots`` (the node's worker pids) from ``proc``."""

    def __init__(self, roots: Iterable[int], proc: Path = Path("/proc")) -> None:
        self.roots, self.proc = tuple(roots), proc
        self.ticks_per_s = os.sysconf("SC_CLK_TCK")
        self.page_size = os.sysconf("SC_PAGE_SIZE")
        self.cpus = len(os.sched_getaffinity(0))
        self.last: tuple[float, dict[int, int]] | None = None

    def _stats(self) -> dict[int, ProcStat]:
        stats = {}
        for entry in self.proc.iterdir():
            if entry.name.isdigit():
                try:
                    stat = parse_stat((entry / "stat").read_text())
                except (FileNotFoundError, ProcessLookupError):
                    continue  # it ended while the directory was listed
                stats[stat.pid] = stat
        return stats

    def read(self, t: float) -> CpuReading:
        """The tree's CPU % since the last ``read`` and its summed resident memory, at ``time.monotonic()`` ``t``."""
        stats = self._stats()
        tree = process_tree(self.roots, {pid: s.ppid for pid, s in stats.items()})
        ticks = {pid: stats[pid].cpu_ticks for pid in tree}
        pages = 0
        for pid in tree:
            try:
                pages += parse_statm_rss_pages((self.proc / str(pid) / "statm").read_text())
            except (FileNotFoundError, ProcessLookupError):
                continue
        util = None
        if self.last is not None and t > self.last[0]:
            util = cpu_percent(self.last[1], ticks, t - self.last[0], self.ticks_per_s, self.cpus)
        self.last = (t, ticks)
        return CpuReading(util_pct=util, rss_gb=pages * self.page_size / GIB)
