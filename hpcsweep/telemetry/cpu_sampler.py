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


TREE_RESCAN_S = 60.0
"""How often the whole of ``/proc`` is listed to find new descendants. Workers seldom start
processes, and a full scan reads every process's stat file (about 15 ms for 200 processes on a busy
machine); between scans only the known tree is read."""


class ProcessTreeSampler:
    """Reads the process tree under ``roots`` (the node's worker pids) from ``proc``."""

    def __init__(self, roots: Iterable[int], proc: Path = Path("/proc"), rescan_s: float = TREE_RESCAN_S) -> None:
        self.roots, self.proc, self.rescan_s = tuple(roots), proc, rescan_s
        self.ticks_per_s = os.sysconf("SC_CLK_TCK")
        self.page_size = os.sysconf("SC_PAGE_SIZE")
        self.cpus = len(os.sched_getaffinity(0))
        self.last: tuple[float, dict[int, int]] | None = None
        self.tree: set[int] = set()
        self.scanned_at: float | None = None

    def _stat(self, pid: int | str) -> ProcStat | None:
        try:
            return parse_stat((self.proc / str(pid) / "stat").read_text())
        except (FileNotFoundError, ProcessLookupError):
            return None  # it ended since it was listed

    def _scan(self) -> set[int]:
        stats = [self._stat(entry.name) for entry in self.proc.iterdir() if entry.name.isdigit()]
        return process_tree(self.roots, {s.pid: s.ppid for s in stats if s is not None})

    def read(self, t: float) -> CpuReading:
        """The tree's CPU % since the last ``read`` and its summed resident memory, at ``time.monotonic()`` ``t``."""
        if self.scanned_at is None or t - self.scanned_at >= self.rescan_s:
            self.tree, self.scanned_at = self._scan(), t
        ticks, pages = {}, 0
        for pid in self.tree:
            stat = self._stat(pid)
            # A pid whose parent left the tree ended and was reused by a process that is not ours.
            if stat is None or (pid not in self.roots and stat.ppid not in self.tree):
                continue
            try:
                pages += parse_statm_rss_pages((self.proc / str(pid) / "statm").read_text())
            except (FileNotFoundError, ProcessLookupError):
                continue
            ticks[pid] = stat.cpu_ticks
        util = None
        if self.last is not None and t > self.last[0]:
            util = cpu_percent(self.last[1], ticks, t - self.last[0], self.ticks_per_s, self.cpus)
        self.last = (t, ticks)
        return CpuReading(util_pct=util, rss_gb=pages * self.page_size / GIB)
