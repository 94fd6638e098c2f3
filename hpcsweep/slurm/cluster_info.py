"""Pure parsing of what the controller says about the cluster (partitions, limits) and a job's own fields."""

from __future__ import annotations

import re
from collections.abc import Iterable

from hpcsweep.slurm.env import expand_nodelist

DEFAULT_MAX_ARRAY_SIZE = 1001
DEFAULT_MAX_SWITCH_WAIT_S = 300


def parse_max_array_size(text: str) -> int:
    """``MaxArraySize`` from ``scontrol show config`` output (Slurm's default when absent)."""
    match = re.search(r"^MaxArraySize\s*=\s*(\d+)", text, flags=re.MULTILINE)
    return int(match.group(1)) if match else DEFAULT_MAX_ARRAY_SIZE


def parse_max_switch_wait(text: str) -> int:
    """``SchedulerParameters=max_switch_wait`` in seconds from ``scontrol show config`` output
    (Slurm's default when absent): the longest a job may wait for its ``--switches`` count."""
    match = re.search(r"^SchedulerParameters\s*=\s*(.*)$", text, flags=re.MULTILINE)
    for item in (match.group(1) if match else "").split(","):
        key, _, value = item.strip().partition("=")
        if key == "max_switch_wait" and value.isdigit():
            return int(value)
    return DEFAULT_MAX_SWITCH_WAIT_S


def qos_limits_enforced(text: str) -> bool:
    """Whether ``scontrol show config`` says QOS limits hold jobs back: ``AccountingStorageEnforce``
    includes ``limits`` (or ``safe``, which implies it); without it a job over them runs anyway."""
    match = re.search(r"^AccountingStorageEnforce\s*=\s*(.*)$", text, flags=re.MULTILINE)
    return bool({"limits", "safe"} & set((match.group(1) if match else "").strip().split(",")))


def parse_node_address(text: str) -> str | None:
    """``NodeAddr`` from ``scontrol show node NAME --oneliner`` output."""
    return parse_fields(text).get("NodeAddr") or None


_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_]*)=")


def parse_fields(line: str) -> dict[str, str]:
    """``Key=Value`` pairs of one ``scontrol`` line; a value runs up to the next ``Key=``
    (``OS=Linux 6.1.0 #1 SMP`` and ``Reason=Not responding`` contain spaces)."""
    matches = list(_KEY.finditer(line))
    fields: dict[str, str] = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        fields[match.group(1)] = line[match.end() : end].strip()
    return fields


def gpus_from_tres(tres: str) -> int:
    """GPUs in a TRES list: ``billing=8,cpu=8,gres/gpu=2,node=1`` -> 2; no ``gres/gpu`` -> 0.

    Typed entries (``gres/gpu:a100=2``) repeat the plain one and count only when it is absent.
    """
    plain, typed = None, 0
    for item in tres.split(","):
        name, _, count = item.partition("=")
        if name == "gres/gpu":
            plain = int(count)
        elif name.startswith("gres/gpu:"):
            typed += int(count)
    return typed if plain is None else plain


def gpus_from_gres(gres: str) -> int:
    """GPUs in a node's GRES: ``gpu:a100:8(S:0-1),gpu:v100:2`` -> 10; ``gpu:4`` -> 4; ``gpu`` -> 1;
    ``(null)`` -> 0. The count is the last ``:`` field before any ``(``; other GRES do not count."""
    total = 0
    for item in re.split(r",(?![^()]*\))", gres):
        parts = item.split("(")[0].strip().split(":")
        if parts[0] != "gpu":
            continue
        total += int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
    return total


def excluded_after(show_job_text: str, nodes: Iterable[str]) -> list[str]:
    """The job's ``ExcNodeList`` (from ``scontrol show job --oneliner``) with ``nodes`` added, sorted."""
    current = parse_fields(show_job_text.strip()).get("ExcNodeList", "(null)")
    names = [] if current in ("", "(null)") else expand_nodelist(current)
    return sorted({*names, *nodes})
