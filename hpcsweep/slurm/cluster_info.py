"""Pure parsing of what the controller says about the cluster (partitions, limits)."""

from __future__ import annotations

import re

DEFAULT_MAX_ARRAY_SIZE = 1001


def parse_partition_names(text: str) -> list[str]:
    """Partition names from ``scontrol show partitions --oneliner`` output."""
    return re.findall(r"^PartitionName=(\S+)", text, flags=re.MULTILINE)


def parse_max_array_size(text: str) -> int:
    """``MaxArraySize`` from ``scontrol show config`` output (Slurm's default when absent)."""
    match = re.search(r"^MaxArraySize\s*=\s*(\d+)", text, flags=re.MULTILINE)
    return int(match.group(1)) if match else DEFAULT_MAX_ARRAY_SIZE


def parse_node_address(text: str) -> str | None:
    """``NodeAddr`` from ``scontrol show node NAME --oneliner`` output."""
    match = re.search(r"(?:^|\s)NodeAddr=(\S+)", text)
    return match.group(1) if match else None
